"""The cost model: predict one training iteration of a plan on a cluster.

`CostModel(cluster, workload)` precomputes everything that depends only on the cluster
and the workload (per-device, per-sample prefix sums of F/B/W seconds over the layers,
prefix sums of parameters and activation bytes, the link arrays), so `estimate(plan)`
only flattens the plan into a few integer arrays and runs one compiled kernel
(`spantrain.env.kernel`). Searches that rank many candidates can use
`estimate_fast(plan_or_arrays) -> (iteration_s, samples_per_s, feasible)` (the same
numbers, no `Estimate` built), skip `Plan` objects entirely with `arrays(...)` +
`estimate_arrays` / `estimate_fast`, or use the building blocks:

- `compute_time(device, a, b, m)`: (F, B, W) seconds of layers [a, b) for m samples;
- `forward_prefix` / `input_grad_prefix` / `weight_grad_prefix`: the per-sample prefix
  arrays behind it, shape (devices, layers + 1), for vectorized partitioners;
- `transfer_time(layer, src, dst, m)`: moving layer `layer`'s output for m samples;
- `stage_memory(a, b, m, in_flight)`: peak bytes of a candidate stage, with
  `in_flight(schedule, stage, num_stages, M)` for the micro-batches a schedule keeps;
- `pipeline_time(schedule, M, f, b, w, ...)`: exact time of one pipeline;
- `collective_time(devices, nbytes, mode)`: one data-parallel collective;
- `stage_orders(plan)`: the per-stage op orders the estimate assumed (for the runtime).

Compute time of layers [a, b) on device d for a micro-batch of m samples is
m x (sum of per-sample layer times) + the op overhead, `Calibration.op_overhead_s` +
`Calibration.op_overhead_flops` / d's FLOP/s. Per-sample layer
times are FLOPs / sustained FLOP/s, or, when the device carries measured
`layer_times` for this workload, the measured seconds / measured batch (linear in the
micro-batch size), with each layer's backward split into B and W in the ratio of its
input-gradient to weight-gradient FLOPs.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from spantrain.cluster import Cluster
from spantrain.env.calibration import C_OP, C_OPF, C_SPB, C_SPW, Calibration
from spantrain.env.collectives import SYNC_CODES
from spantrain.env.collectives import collective_time as _collective_time
from spantrain.env.kernel import SCREEN_FROM, out_size, pack_tables, plan_ints, plan_views, split_out, workspace_size
from spantrain.env.kernel import evaluate as _evaluate
from spantrain.env.schedules import SCHEDULE_CODES, best_order, memory_bounds, stage_orders
from spantrain.env.symmetry import device_classes
from spantrain.errors import PlanError, SpecError, WorkloadError
from spantrain.estimate import Estimate, memory_reason
from spantrain.plan import Plan
from spantrain.planner import screening
from spantrain.workload import MAX_GLOBAL_BATCH, Workload

__all__ = ["CostModel", "PipelineTiming", "PlanArrays", "estimate", "layer_time_table", "check_inputs"]


def layer_time_table(cluster: Cluster, workload: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-sample F, B, W seconds of every layer on every device, each (devices, layers).

    Measured `Device.layer_times[workload.name]` win over FLOP counts (module docstring).
    """
    L = workload.num_layers
    fl = np.array([x.forward_flops for x in workload.layers], dtype=np.float64)
    bfl = np.array([x.input_grad_flops for x in workload.layers], dtype=np.float64)
    wfl = np.array([x.weight_grad_flops for x in workload.layers], dtype=np.float64)
    tot = bfl + wfl
    share_b = np.divide(bfl, tot, out=np.ones(L), where=tot > 0)
    n = len(cluster)
    F = np.empty((n, L))
    B = np.empty((n, L))
    W = np.empty((n, L))
    for i, d in enumerate(cluster.devices):
        lt = d.layer_times.get(workload.name)
        if lt is None:
            F[i] = fl / d.flops
            B[i] = bfl / d.flops
            W[i] = wfl / d.flops
            continue
        if len(lt.forward_s) != L:
            raise SpecError(f"cluster {cluster.name!r}, device {d.id!r}: layer_times[{workload.name!r}] has "
                            f"{len(lt.forward_s)} layers but model {workload.name!r} has {L}: measure them again for "
                            "this model (spantrain profile), or remove that entry")
        fw = np.array(lt.forward_s, dtype=np.float64) / lt.batch
        bwd = np.array(lt.backward_s, dtype=np.float64) / lt.batch
        F[i] = fw
        B[i] = bwd * share_b
        W[i] = bwd - B[i]
    return F, B, W


def _prefix(x: np.ndarray) -> np.ndarray:
    out = np.zeros((*x.shape[:-1], x.shape[-1] + 1))
    np.cumsum(x, axis=-1, out=out[..., 1:])
    return out


class _Malformed(Exception):
    """Internal: `CostModel._flatten` met a plan it must hand to `Plan.problems`."""


def _estimate_factory():
    """A constructor of `Estimate` that skips the frozen dataclass's per-field
    ``object.__setattr__`` (a third of an estimate's Python time), when that is
    equivalent: every field passed, no ``__post_init__``, instances with a ``__dict__``."""
    fields = {f.name for f in dataclasses.fields(Estimate)}
    ours = {"iteration_s", "samples_per_s", "feasible", "reasons", "peak_memory_gb", "bubble_fraction",
            "pipeline_s", "exposed_comm_s", "sync_s", "optimizer_s", "pipeline_period_s"}
    if fields != ours or hasattr(Estimate, "__post_init__") or hasattr(Estimate, "__slots__"):
        return Estimate
    new = object.__new__

    def make(**values):
        e = new(Estimate)
        e.__dict__.update(values)
        return e

    return make


_new_estimate = _estimate_factory()


class PlanArrays(NamedTuple):
    """A plan flattened for the kernel: pipeline p owns stages pipe_ptr[p]..pipe_ptr[p+1]-1.

    `keys[p]` identifies pipeline p's simulation (schedule, micro-batch size and count,
    the interchangeable-device class of each stage's device, first layer of each stage)
    for the per-pipeline memo; build with `CostModel.arrays` or `CostModel.flatten`."""

    pipe_ptr: np.ndarray
    stage_dev: np.ndarray
    stage_a: np.ndarray
    stage_b: np.ndarray
    micro_batch_size: np.ndarray
    num_micro_batches: np.ndarray
    schedule: int
    sync: int
    period: int
    keys: tuple
    ints: np.ndarray
    """The six arrays above, concatenated (`spantrain.env.kernel.plan_ints`); they are views of it."""


@dataclass(frozen=True)
class PipelineTiming:
    """One pipeline's simulated timing (see `CostModel.pipeline_time`)."""

    makespan_s: float
    """First F start to last op end of one iteration."""
    period_s: float
    """Steady-state seconds per iteration (`spantrain.env.schedules.period`)."""
    bubble_fraction: float
    """1 - busy / (stages x period)."""
    stage_end_s: tuple[float, ...]
    """When each stage's last op ends (its gradients are complete)."""
    in_flight: tuple[int, ...]
    """Peak micro-batches each stage holds between F and W."""


class CostModel:
    """Cost model for one cluster and workload; reuse it for every plan on them."""

    def __init__(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None, *,
                 memo: bool = True):
        """`memo`: remember each simulated pipeline (by devices, layer cuts, micro-batching
        and schedule) so plans that share pipelines with earlier ones, as a search's
        neighbouring candidates do, skip the schedule simulation. Devices are keyed by
        their interchangeable-device class (`classes`): a pipeline over other devices of
        the same classes, stage by stage, has the same simulation (equal compute, memory
        and links), and the many pipelines of a plan on a uniform fabric are simulated once."""
        check_inputs(cluster, workload, calibration)
        self.cluster = cluster
        self.workload = workload
        self.calibration = calibration or Calibration()
        L = workload.num_layers
        self.num_layers = L
        # the three prefix tables as views of the one stacked array the kernel reads: apart, and
        # stacked again, they held 1.2 GB at once at 4,096 devices and layers
        tables = np.zeros((3, len(cluster), L + 1))
        for k, per_layer in enumerate(layer_time_table(cluster, workload)):
            np.cumsum(per_layer, axis=-1, out=tables[k, :, 1:])
        self.forward_prefix = tables[0]
        """Seconds per sample of layers [0, k) forward on device i: ``[i, k]``."""
        self.input_grad_prefix = tables[1]
        """Same for the input-gradient (B) op."""
        self.weight_grad_prefix = tables[2]
        """Same for the weight-gradient (W) op."""
        self.boundary_bytes = np.array([x.boundary_bytes for x in workload.layers], dtype=np.float64)
        """Bytes per sample of layer k's output (what a stage ending with layer k sends)."""
        self.activation_bytes = np.array([x.activation_bytes for x in workload.layers], dtype=np.float64)
        """Bytes per sample each layer keeps for backward."""
        self.params_prefix = _prefix(np.array([float(x.params) for x in workload.layers]))
        self.activation_prefix = _prefix(self.activation_bytes)
        self.bandwidth = np.ascontiguousarray(cluster.bandwidth, dtype=np.float64)
        self.latency = np.ascontiguousarray(cluster.latency, dtype=np.float64)
        self.flops = np.array([d.flops for d in cluster.devices], dtype=np.float64)
        self.capacity_bytes = np.array([d.memory_bytes for d in cluster.devices], dtype=np.float64)
        self.region = cluster.region_index
        self.calib = self.calibration.vector(workload.bytes_per_element)
        self._ids = cluster.ids
        self._index = {d: i for i, d in enumerate(self._ids)}
        self._memo: dict | None = {} if memo else None
        self._screen_memo: dict = {}
        self.screening = False
        """True: pipelines of many micro-batches are extrapolated, not simulated (`screened`)."""
        self._capacity = self.capacity_bytes.tolist()
        self._packed = (*pack_tables(tables, self.boundary_bytes, self.params_prefix, self.activation_prefix,
                                     self.activation_bytes, self.flops, self.capacity_bytes, self.bandwidth,
                                     self.latency), self.region, self.calib)
        self._unknown = np.full(64, -1, dtype=np.int64)  # "no pipeline memoized", for up to 64 pipelines
        self._none = np.zeros(0)
        self._out = np.zeros(1024)  # the kernel's output for `estimate` / `estimate_fast`, reused
        nx, ni = workspace_size(16, 64)  # scratch reused by every call (larger plans allocate their own)
        self._ws = (np.zeros(nx), np.zeros(ni, dtype=np.int64))

    @functools.cached_property
    def classes(self) -> list[int]:
        """Interchangeable-device class of every device (`spantrain.env.symmetry.device_classes`)."""
        return device_classes(self.cluster)

    def screened(self) -> AbstractContextManager[None]:
        """Within: a pipeline of `SCREEN_FROM` micro-batches or more is simulated at about
        a thousand and its timing extrapolated over the rest (`spantrain.env.kernel.evaluate`,
        ``screen``), for a search to rank many candidates at large batches fast; the ones
        it keeps it scores again outside. No effect on smaller batches."""
        return screening(self)

    @property
    def screens(self) -> bool:
        """Whether screening can change an estimate: the batch allows `SCREEN_FROM`
        micro-batches in a pipeline."""
        return self.workload.global_batch >= SCREEN_FROM

    @property
    def mode(self) -> bool:
        """What a cache of estimates must key on besides the plan: whether they are screened."""
        return self.screening and self.screens

    # ---- whole plans -------------------------------------------------------------------

    def flatten(self, plan: Plan) -> PlanArrays:
        """The plan as kernel arrays; raises `PlanError` with every problem if it is invalid."""
        ints, P, NS, sched, sync, period, keys, _ = self._flatten(plan, True)
        return PlanArrays(*plan_views(ints, P, NS), sched, sync, period, keys, ints)

    def _flatten(self, plan: Plan, with_keys: bool) -> tuple:
        """The plan as (`plan_ints` array, P, NS, schedule code, sync code, period, memo
        keys, device id of every stage); without memo keys (``()``) unless `with_keys`.

        The happy path checks only what the kernel relies on, cheaply (a malformed plan
        surfaces as one of the exceptions caught below); any doubt goes to
        `Plan.problems`, which names every problem."""
        index = self._index
        names: list[str] = []
        dev: list[int] = []
        lo: list[int] = []
        hi: list[int] = []
        ptr = [0]
        mbs: list[int] = []
        nmb: list[int] = []
        keys = []
        try:
            sched = SCHEDULE_CODES[plan.schedule]
            sync = SYNC_CODES[plan.sync.mode]
            period = plan.sync.period
            if type(period) is not int or period <= 0 or (period != 1 and sync != 2) or not plan.pipelines:
                raise _Malformed
            for p in plan.pipelines:
                m = p.micro_batch_size
                M = p.num_micro_batches
                if type(m) is not int or type(M) is not int or m <= 0 or M <= 0:
                    raise _Malformed
                first = len(dev)
                expected = 0
                for st in p.stages:
                    (d,) = st.devices  # exactly one device per stage
                    a, b = st.layers
                    if a != expected or b <= a or type(a) is not int or type(b) is not int:
                        raise _Malformed
                    dev.append(index[d])
                    names.append(d)
                    lo.append(a)
                    hi.append(b)
                    expected = b
                if expected != self.num_layers:  # also catches a pipeline without stages
                    raise _Malformed
                mbs.append(m)
                nmb.append(M)
                ptr.append(len(dev))
                if with_keys:
                    keys.append((sched, m, M, tuple(map(self.classes.__getitem__, dev[first:])),
                                 tuple(lo[first:])))
            if len(set(dev)) != len(dev) or sum(map(int.__mul__, mbs, nmb)) > MAX_GLOBAL_BATCH:
                raise _Malformed  # a device in two stages, or a batch the kernel cannot allocate for
        except (_Malformed, KeyError, TypeError, ValueError, AttributeError):
            problems = plan.problems(self.cluster, self.workload)
            raise PlanError(problems or ["plan does not fit this cluster and workload"]) from None
        return plan_ints(ptr, dev, lo, hi, mbs, nmb), len(mbs), len(dev), sched, sync, period, tuple(keys), names

    def arrays(self, pipelines: Sequence[tuple[Sequence[int], Sequence[int], int, int]], schedule: str = "1f1b",
               sync: str = "allreduce", period: int = 1) -> PlanArrays:
        """Kernel arrays straight from device indices, for searches that skip `Plan` objects.

        `pipelines[p]` = (device index per stage, first layer per stage, micro-batch size,
        micro-batch count); stage j ends where stage j+1 starts, the last at the model's
        end. Not validated: pass what `flatten` would accept (see `Plan.problems`).
        """
        ptr = [0]
        dev: list[int] = []
        lo: list[int] = []
        hi: list[int] = []
        keys = []
        sched = _schedule_code(schedule)
        label = self.classes.__getitem__
        for devs, starts, m, M in pipelines:
            dev.extend(devs)
            lo.extend(starts)
            hi.extend([*starts[1:], self.num_layers])
            keys.append((sched, m, M, tuple(map(label, devs)), tuple(starts)))
            ptr.append(len(dev))
        ints = plan_ints(ptr, dev, lo, hi, [p[2] for p in pipelines], [p[3] for p in pipelines])
        return PlanArrays(*plan_views(ints, len(pipelines), len(dev)), sched, _sync_code(sync), period, tuple(keys),
                          ints)

    def evaluate(self, arrays: PlanArrays) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw kernel output for flattened arrays: (stage_out, pipe_out, scalars), see
        `spantrain.env.kernel.evaluate` (`SCALARS`, `STAGE_COLUMNS`). No validation: pass
        `flatten`'s output.

        Pipelines simulated before (same key) are taken from the memo, if enabled."""
        P, NS = len(arrays.pipe_ptr) - 1, len(arrays.stage_dev)
        return split_out(self._run_arrays(arrays, np.empty(out_size(P, NS))), P, NS)

    def _run_arrays(self, x: PlanArrays, out: np.ndarray | None = None) -> np.ndarray:
        return self._run(x.ints, len(x.pipe_ptr) - 1, len(x.stage_dev), x.schedule, x.sync, x.period, x.keys, out)

    def _run(self, ints: np.ndarray, P: int, NS: int, sched: int, sync: int, period: int, keys: tuple,
             out: np.ndarray | None = None) -> np.ndarray:
        """Run the kernel on a `plan_ints` array into `out` (default: a buffer this model
        reuses) and return it; memoize the pipelines it simulated."""
        size = 7 + 6 * P + 12 * NS  # `spantrain.env.kernel.out_size`
        if out is None:
            out = self._out
            if out.shape[0] < size:
                out = self._out = np.zeros(2 * size)
        memo = self._memo
        at = self._unknown
        records = self._none
        hits = None
        screen = self.screening
        if memo is not None:
            if len(keys) != P:
                raise ValueError("PlanArrays.keys must name every pipeline when the memo is on")
            if screen and any(key[2] >= SCREEN_FROM for key in keys):
                # screened records (key[2]: micro-batches) differ from exact ones: kept apart
                memo = self._screen_memo
            hits = [memo.get(key) for key in keys]
            found = [h for h in hits if h is not None]
            if found:
                offsets = []
                pos = 0
                for h in hits:
                    if h is None:
                        offsets.append(-1)
                    else:
                        offsets.append(pos)
                        pos += h.shape[0]
                at = np.array(offsets, dtype=np.int64)
                records = np.concatenate(found)
        if at.shape[0] < P:
            at = self._unknown = np.full(2 * P, -1, dtype=np.int64)
        tables, layer, dev, links, region, calib = self._packed
        _evaluate(tables, layer, dev, links, region, calib, ints, P, NS, sched, sync, period, at, records, out,
                  *self._ws, screen)
        if hits is not None and len(found) < P:
            if len(memo) > _MEMO_MAX:
                memo.clear()
            base = 7 + 3 * P + 9 * NS  # `spantrain.env.kernel.memo_record`
            ptr = ints[:P + 1].tolist()
            for p, key in enumerate(keys):
                if hits[p] is None:
                    memo[key] = out[base + 3 * p + 3 * ptr[p]:base + 3 * (p + 1) + 3 * ptr[p + 1]].copy()
        return out

    def clear_memo(self, keys: Sequence[tuple] | None = None) -> None:
        """Forget memoized pipeline simulations: those with the given `PlanArrays.keys`, or
        all (they stay valid while the model lives; this only bounds memory)."""
        if self._memo is None:
            return
        if keys is None:
            self._memo.clear()
            self._screen_memo.clear()
        for key in keys or ():
            self._memo.pop(key, None)
            self._screen_memo.pop(key, None)

    def estimate(self, plan: Plan) -> Estimate:
        """Predict one iteration of `plan`; raises `PlanError` if the plan is invalid."""
        ints, P, NS, sched, sync, period, keys, names = self._flatten(plan, self._memo is not None)
        return self._estimate_from(ints, P, NS, self._run(ints, P, NS, sched, sync, period, keys), names)

    def estimate_arrays(self, arrays: PlanArrays) -> Estimate:
        """`estimate` for an already flattened (and therefore valid) plan."""
        P, NS = len(arrays.pipe_ptr) - 1, len(arrays.stage_dev)
        return self._estimate_from(arrays.ints, P, NS, self._run_arrays(arrays), None)

    def estimate_fast(self, plan: Plan | PlanArrays) -> tuple[float, float, bool]:
        """(iteration_s, samples_per_s, feasible) of `plan`, exactly as `estimate` gives
        them, without building the `Estimate` (for searches that rank many candidates).
        Takes a `Plan` (validated; raises `PlanError`) or `PlanArrays` (from `flatten` or
        `arrays`, not validated again)."""
        if type(plan) is PlanArrays:
            out = self._run_arrays(plan)
        else:
            out = self._run(*self._flatten(plan, self._memo is not None)[:7])
        it, _, _, _, _, sps, feasible = out[:7].tolist()
        return it, sps, feasible == 1.0

    def _to_estimate(self, x: PlanArrays, stage_out: np.ndarray, pipe_out: np.ndarray,
                     scalars: np.ndarray) -> Estimate:
        """The `Estimate` of `evaluate`'s output."""
        out = np.concatenate([scalars, pipe_out.reshape(-1), stage_out.reshape(-1)])
        return self._estimate_from(x.ints, len(x.pipe_ptr) - 1, len(x.stage_dev), out, None)

    def _estimate_from(self, ints: np.ndarray, P: int, NS: int, out: np.ndarray,
                       names: list[str] | None) -> Estimate:
        """The `Estimate` of a kernel output for the plan in `ints` (`names`: device id per
        stage, looked up when None)."""
        if names is None:
            ids = self._ids
            names = [ids[d] for d in ints[P + 1:P + 1 + NS].tolist()]
        head = out[:7 + 3 * P].tolist()
        it, _, alone, exposed, opt, sps, feasible = head[:7]
        mem = out[7 + 3 * P + 5:7 + 3 * P + 9 * NS:9].tolist()
        reasons = []
        if feasible != 1.0:
            cap = self._capacity
            for name, d, need in zip(names, ints[P + 1:P + 1 + NS].tolist(), mem):
                if need > cap[d]:
                    reasons.append(memory_reason(name, need, cap[d]))
        return _new_estimate(iteration_s=it, samples_per_s=sps, feasible=not reasons, reasons=tuple(reasons),
                             peak_memory_gb=dict(zip(names, [v / 1e9 for v in mem])),
                             bubble_fraction=tuple(head[8::3]), pipeline_s=tuple(head[7::3]),
                             exposed_comm_s=exposed, sync_s=alone, optimizer_s=opt,
                             pipeline_period_s=tuple(head[9::3]))

    def stage_orders(self, plan: Plan) -> list[list[list[tuple[str, int]]]]:
        """Per pipeline, per stage: the op order this model assumes for `plan`."""
        x = self.flatten(plan)
        out = []
        for p in range(len(x.pipe_ptr) - 1):
            f, b, w, cfo, cfl, cbo, cbl = self._pipeline_inputs(x, p)
            out.append(stage_orders(plan.schedule, len(f), int(x.num_micro_batches[p]), f, b, w, cfo,
                                    comm_backward=cbo, latency=cfl, latency_backward=cbl))
        return out

    def _pipeline_inputs(self, x: PlanArrays, p: int):
        """Per-stage op seconds and link times of pipeline p, exactly as the kernel computes them."""
        g0, g1 = int(x.pipe_ptr[p]), int(x.pipe_ptr[p + 1])
        m = int(x.micro_batch_size[p])
        f, b, w = [], [], []
        cfo, cfl, cbo, cbl = [], [], [], []
        for g in range(g0, g1):
            d, a, z = int(x.stage_dev[g]), int(x.stage_a[g]), int(x.stage_b[g])
            ff, bb, ww = self.compute_time(d, a, z, m)
            f.append(ff)
            b.append(bb)
            w.append(ww)
            if g < g1 - 1:
                e = int(x.stage_dev[g + 1])
                occ, lat = self._link(z - 1, d, e, m)
                cfo.append(occ)
                cfl.append(lat)
                occ, lat = self._link(z - 1, e, d, m)
                cbo.append(occ)
                cbl.append(lat)
        return f, b, w, cfo, cfl, cbo, cbl

    # ---- building blocks ---------------------------------------------------------------

    def device_index(self, device: int | str) -> int:
        """Position of a device (id or index) in the cluster."""
        if isinstance(device, str):
            return self.cluster.index(device)
        # an index past the end was an IndexError deep in numpy, and -1 silently the last device
        if isinstance(device, bool) or not isinstance(device, numbers.Integral) or not 0 <= device < len(self.cluster):
            raise SpecError(f"device {device!r} is neither an id nor an index from 0 to {len(self.cluster) - 1} "
                            f"of cluster {self.cluster.name!r}")
        return int(device)

    def compute_time(self, device: int | str, a: int, b: int, m: int) -> tuple[float, float, float]:
        """(F, B, W) seconds of layers [a, b) on `device` for a micro-batch of m samples,
        B and W as a zero-bubble schedule's separate ops. A fused backward takes
        `backward_time` (B + W - op overhead unless the calibration makes splitting cost extra)."""
        d = self.device_index(device)
        op = self.op_overhead(d)
        c = self.calib
        tf, tb, tw = self.forward_prefix[d], self.input_grad_prefix[d], self.weight_grad_prefix[d]
        return (m * (tf[b] - tf[a]) + op, m * (tb[b] - tb[a]) * c[C_SPB] + op, m * (tw[b] - tw[a]) * c[C_SPW] + op)

    def backward_time(self, device: int | str, a: int, b: int, m: int) -> float:
        """Seconds of the fused backward (B and W in one op, as gpipe and 1f1b run it)."""
        d = self.device_index(device)
        tb, tw = self.input_grad_prefix[d], self.weight_grad_prefix[d]
        return float(m * ((tb[b] - tb[a]) + (tw[b] - tw[a])) + self.op_overhead(d))

    def op_overhead(self, device: int | str) -> float:
        """Fixed seconds of every compute op on `device` (`Calibration.op_overhead_s` +
        `op_overhead_flops` / its FLOP/s)."""
        d = self.device_index(device)
        return float(self.calib[C_OP] + self.calib[C_OPF] / self.flops[d])

    def _link(self, layer: int, src: int, dst: int, m: int) -> tuple[float, float]:
        nbytes = m * self.boundary_bytes[layer]
        return nbytes / self.bandwidth[src, dst] + self.calib[1], float(self.latency[src, dst])

    def transfer_time(self, layer: int, src: int | str, dst: int | str, m: int) -> float:
        """Seconds to move layer `layer`'s output (or its gradient) for m samples from `src`
        to `dst`: bytes / bandwidth + per-message overhead + latency."""
        occ, lat = self._link(layer, self.device_index(src), self.device_index(dst), m)
        return occ + lat

    @staticmethod
    def in_flight(schedule: str, stage: int, num_stages: int, num_micro_batches: int) -> int:
        """Micro-batches stage `stage` keeps between F and W: exact for gpipe and 1f1b, the
        bound for zero-bubble schedules (their simulated order may keep fewer)."""
        _schedule_code(schedule)
        return min(num_micro_batches, memory_bounds(schedule, num_stages)[stage][1])

    def stage_memory(self, a: int, b: int, m: int, in_flight: int) -> float:
        """Peak bytes of a stage holding layers [a, b) with micro-batches of m samples and
        `in_flight` of them kept for backward (see `spantrain.env.kernel`); compare with
        `memory_capacity(device)`."""
        c = self.calib
        params = self.params_prefix[b] - self.params_prefix[a]
        in_b = self.boundary_bytes[a - 1] if a > 0 else 0.0
        out_b = self.boundary_bytes[b - 1] if b < self.num_layers else 0.0
        big = float(self.activation_bytes[a:b].max())
        return float(params * c[2] + in_flight * m * (self.activation_prefix[b] - self.activation_prefix[a])
                     + 2.0 * m * (in_b + out_b) + m * big + c[6])

    def memory_capacity(self, device: int | str) -> float:
        """Bytes of memory `device` offers."""
        return float(self.capacity_bytes[self.device_index(device)])

    def optimizer_time(self, device: int | str, a: int, b: int) -> float:
        """Seconds of the AdamW step for layers [a, b) on `device`."""
        d = self.device_index(device)
        c = self.calib
        return float((self.params_prefix[b] - self.params_prefix[a]) * c[4] / (self.flops[d] * c[5]))

    def pipeline_time(self, schedule: str, num_micro_batches: int, f: Sequence[float], b: Sequence[float],
                      w: Sequence[float], comm: Sequence[float] | None = None, *,
                      comm_backward: Sequence[float] | None = None, latency: Sequence[float] | None = None,
                      latency_backward: Sequence[float] | None = None,
                      op_overhead: Sequence[float] | None = None,
                      fused: Sequence[float] | None = None) -> PipelineTiming:
        """Exact timing of one pipeline given per-stage op seconds and link times (the
        arguments of `spantrain.env.schedules.stage_orders`). A fused backward lasts
        `fused[s]` (`backward_time`), by default b + w - the op overhead of its stage
        (`op_overhead[s]`, default `Calibration.op_overhead_s`; pass `op_overhead(device)`
        per stage when the calibration has FLOP-based overheads)."""
        S = len(f)
        fv = np.asarray(f, dtype=np.float64)
        bv = np.asarray(b, dtype=np.float64)
        wv = np.asarray(w, dtype=np.float64)
        n = max(S - 1, 1)

        def vec(x, default):
            return np.asarray(x, dtype=np.float64) if x is not None and S > 1 else default

        cfo = vec(comm, np.zeros(n))
        cbo = vec(comm_backward, cfo)
        cfl = vec(latency, np.zeros(n))
        cbl = vec(latency_backward, cfl)
        ov = np.full(S, self.calib[C_OP]) if op_overhead is None else np.asarray(op_overhead, dtype=np.float64)
        bwf = bv + wv - ov if fused is None else np.asarray(fused, dtype=np.float64)
        kind, _, start, end, per = best_order(_schedule_code(schedule), int(num_micro_batches), fv, bv, wv,
                                              bwf, cfo, cfl, cbo, cbl)
        makespan = float(end[:, -1].max())
        busy = float((end - start).sum())
        peaks = []
        for s in range(S):
            c = pk = 0
            for op in kind[s]:
                if op == 0:
                    c += 1
                    pk = max(pk, c)
                elif op >= 2:
                    c -= 1
            peaks.append(pk)
        return PipelineTiming(makespan, float(per), 1.0 - busy / (S * per) if per > 0 else 0.0,
                              tuple(end[:, -1].tolist()), tuple(peaks))

    def collective_time(self, devices: Sequence[int | str], nbytes: float, mode: str = "allreduce") -> float:
        """Seconds of one data-parallel collective of `nbytes` over `devices` (see
        `spantrain.env.collectives`; local-sgd is a ring, once per period)."""
        nodes = np.array([self.device_index(d) for d in devices], dtype=np.int64)
        code = _sync_code(mode)
        return float(_collective_time(0 if code == 2 else code, nodes, float(nbytes), self.bandwidth, self.latency,
                                      self.calib[1], self.region))


def check_inputs(cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> None:
    """A `SpantrainError` naming the argument when a planner or the cost model is given something
    else than a Cluster, a Workload and a Calibration or None (a path or a model name was an
    AttributeError from deep inside)."""
    if not isinstance(cluster, Cluster):
        raise SpecError(f"cluster must be a Cluster (Cluster.from_file(path) reads a spec), got {cluster!r:.80}")
    if not isinstance(workload, Workload):
        raise WorkloadError(f"workload must be a Workload (load_workload(name or path) gives one), "
                            f"got {workload!r:.80}")
    if calibration is not None and not isinstance(calibration, Calibration):
        raise SpecError(f"calibration must be a Calibration or None (Calibration.from_file(path) reads one), "
                        f"got {calibration!r:.80}")


def _schedule_code(schedule: str) -> int:
    """The kernel's code of `schedule`; `PlanError` naming the choices for an unknown one."""
    try:  # a plain lookup when it is known: `arrays` runs per estimate
        return SCHEDULE_CODES[schedule]
    except (KeyError, TypeError):
        raise PlanError(f"schedule {schedule!r} is unknown (choose from {', '.join(SCHEDULE_CODES)})") from None


def _sync_code(mode: str) -> int:
    """The kernel's code of sync `mode`; `PlanError` naming the choices for an unknown one."""
    try:
        return SYNC_CODES[mode]
    except (KeyError, TypeError):
        raise PlanError(f"sync mode {mode!r} is unknown (choose from {', '.join(SYNC_CODES)})") from None


_MEMO_MAX = 200_000
"""Pipelines remembered per model before the memo starts afresh (a few hundred bytes each)."""

# A few recent models, so that `estimate(cluster, workload, plan)` in a loop stays fast.
_MODELS: OrderedDict[tuple[int, int, Calibration | None], CostModel] = OrderedDict()
_MAX_MODELS = 8


def estimate(cluster: Cluster, workload: Workload, plan: Plan, calibration: Calibration | None = None) -> Estimate:
    """Predict one iteration of `plan` (see `CostModel`). Reuses the model built for the
    same cluster and workload objects the last few times."""
    key = (id(cluster), id(workload), calibration)
    model = _MODELS.get(key)
    if model is None or model.cluster is not cluster or model.workload is not workload:
        model = CostModel(cluster, workload, calibration)
        _MODELS[key] = model
        if len(_MODELS) > _MAX_MODELS:
            _MODELS.popitem(last=False)
    else:
        _MODELS.move_to_end(key)
    return model.estimate(plan)
