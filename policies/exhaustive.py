"""`exhaustive`: the optimum under the cost model for clusters of up to 8 devices.

Search space, exactly:

- **Layouts**: every set of pipelines, each an ordered sequence of distinct devices (one
  per stage, in stage order), over every non-empty subset of the devices (the others
  idle), with at most as many pipelines as samples in the global batch. Layouts that
  differ only by swapping interchangeable devices (same TFLOP/s, memory, region,
  measured layer times and links to every other device; `device_classes`) are
  enumerated once, since the cost model cannot tell them apart.
- **Layer partition** of each pipeline: the dynamic programme of
  `spantrain.env.partition` for the pipeline's devices, micro-batching and schedule.
  The best plan's cuts then get the cut moves the heuristic's and the policy's plans
  get (`spantrain.policies.cuts`): the programme optimizes a per-stage proxy, so a cut
  a layer off can be faster, and the optimum stays the reference for those planners.
- **Knobs**: micro-batch size in `MICRO_BATCH_SIZES` (1, 2, 4, 8; a pipeline uses the
  largest divisor of its share up to it), every schedule (gpipe, 1f1b, zb-h1, zb-h2),
  sync allreduce and hierarchical (plus local SGD with periods 2, 4, 8 when
  `allow_local_sgd`).
- **Batch shares** (samples per pipeline, summing to the global batch), the best of
  three: (a) the split that minimizes the slowest pipeline's simulated time alone, by
  water-filling in units of the micro-batch size (exact when a pipeline's time grows
  with its share; past 64 units found by rank, not unit by unit, with the same shares:
  `Evaluator.water_fill`); (b) `Evaluator.balance` started from (a); (c) `Evaluator.balance`
  from shares in proportion to speed (what the heuristic and genetic planners use).

Branch and bound makes it fast without losing the optimum: every layout gets a lower
bound on its iteration time that holds for every partition, knob and share:

- throughput: pipeline p processes b_p samples at no less than beta_p seconds each (its
  per-sample bottleneck over all partitions, stages and links,
  `Partitioner.min_bottleneck_per_sample`), so the iteration takes at least
  B / sum_p (1 / beta_p);
- sync (two or more pipelines, not local SGD): each layer's collective has one holder
  per pipeline, and whatever the holders, some split of them in two has no link faster
  than W across it (W: over every choice of one device per pipeline, the largest
  smallest edge of a maximum spanning tree over the chosen devices). A ring
  crosses that split at least twice with chunks of bytes/n, a hierarchical collective
  with the whole buffer (inside a region) or in its leaders' ring, so the collective
  takes at least bytes / W. Every pipeline's devices take part in every layer's
  collective, one at a time per device, after their own backward ends: some device of
  the shortest pipeline (S stages) is busy for at least (gradient bytes) / (W x S).
  With local SGD allowed the sync bounds are divided by its longest period.
  Per device (`_holder_bound`): each device syncs at least one layer (the first stage
  the embedding, the last the head, a single stage everything) at no more than its
  fastest link to another pipeline, and a pipeline's devices share all the layers.

Layouts are scored in increasing order of bound until the bound reaches the best time
found. Knob combinations of a layout are skipped once their water-filled pipeline time
alone reaches it. Clusters above `max_devices` (8) are refused.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.costmodel import check_inputs
from spantrain.env.evaluator import MICRO_BATCH_SIZES, Candidate, Evaluator, Knobs, sync_choices
from spantrain.env.jit import cached_njit
from spantrain.errors import PlannerError
from spantrain.plan import SCHEDULES, Plan
from spantrain.policies.cuts import refine_cuts
from spantrain.policies.feasibility import no_fit_error
from spantrain.workload import Workload

__all__ = ["ExhaustiveConfig", "ExhaustivePlanner", "LayoutBound", "enumerate_layouts"]

MAX_DEVICES = 8


@dataclass(frozen=True, kw_only=True)
class ExhaustiveConfig:
    """Options of the exhaustive planner."""

    allow_local_sgd: bool = False
    """Also search local-SGD sync (changes training semantics; off by default)."""
    max_devices: int = MAX_DEVICES
    """Largest cluster accepted (the search grows super-exponentially)."""

    def __post_init__(self) -> None:
        problems = []  # every one at once
        if not isinstance(self.allow_local_sgd, bool):
            problems.append(f"allow_local_sgd must be true or false, got {self.allow_local_sgd!r}")
        if isinstance(self.max_devices, bool) or not isinstance(self.max_devices, int) or not \
                1 <= self.max_devices <= MAX_DEVICES:
            problems.append(f"max_devices must be an integer from 1 to {MAX_DEVICES}, got {self.max_devices!r}")
        if problems:
            raise PlannerError("exhaustive: " + "; ".join(problems))


def _words(counts: list[int]) -> dict[tuple[int, ...], list[tuple[int, ...]]]:
    """Distinct class sequences grouped by their count vector (how many of each class)."""
    out: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    K = len(counts)
    for vec in itertools.product(*[range(c + 1) for c in counts]):
        if not sum(vec):
            continue
        letters = [k for k in range(K) for _ in range(vec[k])]
        out[vec] = sorted(set(itertools.permutations(letters)))
    return out


def enumerate_layouts(counts: list[int], max_pipelines: int):
    """Every multiset of class words whose letters fit `counts` (class sizes), as tuples
    of words; at most `max_pipelines` words."""
    groups = _words(counts)
    vecs = sorted(groups)

    def rec(i: int, rem: tuple[int, ...], left: int):
        if i == len(vecs):
            yield ()
            return
        v = vecs[i]
        words = groups[v]
        r = 0
        remv = rem
        while r <= left:
            for tail in rec(i + 1, remv, left - r):
                if r == 0:
                    yield tail
                else:
                    for combo in itertools.combinations_with_replacement(words, r):
                        yield combo + tail
            remv = tuple(a - b for a, b in zip(remv, v))
            if min(remv) < 0:
                break
            r += 1

    for layout in rec(0, tuple(counts), max_pipelines):
        if layout:
            yield layout


class LayoutBound:
    """Lower bound on the iteration time of a layout over every partition, knob and
    batch share (module docstring); inf when some pipeline cannot hold the model even
    at micro-batch 1 with one micro-batch in flight."""

    def __init__(self, ev: Evaluator, sync_divisor: int = 1):
        """`sync_divisor`: the longest local-SGD period searched (1 without local SGD),
        since local SGD exposes its sync divided by the period."""
        self.ev = ev
        self.sync_divisor = sync_divisor
        bw = np.asarray(ev.cluster.bandwidth)
        self.bws = np.minimum(bw, bw.T)
        self.layer_bytes = np.diff(ev.model.params_prefix) * ev.model.calib[3]
        self.grad_bytes = float(self.layer_bytes.sum())
        self._beta: dict[tuple[int, ...], float] = {}

    def beta(self, devs: tuple[int, ...]) -> float:
        hit = self._beta.get(devs)
        if hit is None:
            fits = self.ev.part.split(devs, 1, 1, "1f1b") is not None
            hit = self.ev.part.min_bottleneck_per_sample(devs) if fits else math.inf
            self._beta[devs] = hit
        return hit

    def __call__(self, layout: tuple[tuple[int, ...], ...]) -> float:
        betas = [self.beta(p) for p in layout]
        if not all(math.isfinite(b) for b in betas):
            return math.inf
        lb = self.ev.batch / sum(1.0 / b for b in betas)
        if len(layout) > 1:
            flat = np.array([d for p in layout for d in p], dtype=np.int64)
            ptr = np.cumsum([0] + [len(p) for p in layout]).astype(np.int64)
            w_star = _widest_holders(flat, ptr, self.bws)
            sync = max(self.grad_bytes / (w_star * min(len(p) for p in layout)),
                       _holder_bound(layout, self.bws, self.layer_bytes, self.grad_bytes))
            lb = max(lb, sync / self.sync_divisor)
        return lb


class ExhaustivePlanner:
    """Optimal plan under the cost model over the search space of the module docstring."""

    name = "exhaustive"

    def __init__(self, config: ExhaustiveConfig | None = None, **options):
        self.config = config or ExhaustiveConfig(**options)
        self.stats: dict[str, float] = {}

    def plan(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
        cfg = self.config
        check_inputs(cluster, workload, calibration)
        n = len(cluster)
        if n > cfg.max_devices:
            raise PlannerError(f"exhaustive: cluster {cluster.name!r} has {n} devices; exhaustive search covers at "
                               f"most {cfg.max_devices} (use --planner heuristic or ga)")
        ev = Evaluator(cluster, workload, calibration=calibration)
        return ev.to_plan(self.best_candidate(ev))

    def best_candidate(self, ev: Evaluator) -> Candidate:
        """The optimal candidate, its cuts moved (raises `PlannerError` when nothing fits)."""
        B = ev.batch
        labels = ev.classes
        members: dict[int, list[int]] = {}
        for i, c in enumerate(labels):
            members.setdefault(c, []).append(i)
        classes = sorted(members)
        counts = [len(members[c]) for c in classes]
        bound = LayoutBound(ev, max(p for _, p in sync_choices(self.config.allow_local_sgd)))

        def concrete(layout):
            used = [0] * len(classes)
            out = []
            for word in layout:
                devs = []
                for k in word:
                    devs.append(members[classes[k]][used[k]])
                    used[k] += 1
                out.append(tuple(devs))
            return tuple(out)

        bounds = []
        n_layouts = 0
        for layout in enumerate_layouts(counts, B):
            n_layouts += 1
            devs = concrete(layout)
            lb = bound(devs)
            if math.isfinite(lb):
                bounds.append((lb, devs))
        bounds.sort(key=lambda x: x[0])
        best: Candidate | None = None
        evaluated = 0
        for lb, layout in bounds:
            if best is not None and lb >= best.time:
                break
            evaluated += 1
            cand = self._best_for_layout(ev, layout, best.time if best is not None else math.inf)
            if cand is not None and (best is None or cand.time < best.time):
                best = cand
        self.stats = {"layouts": n_layouts, "bounded": len(bounds), "evaluated": evaluated,
                      "cost_model_calls": ev.calls}
        if best is None:
            raise no_fit_error(ev.model, self.name)
        return refine_cuts(ev, best)

    def _best_for_layout(self, ev: Evaluator, layout, incumbent: float) -> Candidate | None:
        best: Candidate | None = None
        syncs = sync_choices(self.config.allow_local_sgd) if len(layout) > 1 else [("allreduce", 1)]
        for m in MICRO_BATCH_SIZES:
            if m > ev.batch:
                continue
            for schedule in SCHEDULES:
                bar = min(incumbent, best.time if best is not None else math.inf)
                probe = Knobs(micro_batch_size=m, schedule=schedule)
                shares, worst = ev.water_fill(layout, probe, stop_at=bar)
                if not math.isfinite(worst):
                    continue
                for mode, period in syncs:
                    knobs = Knobs(micro_batch_size=m, schedule=schedule, sync=mode, period=period)
                    for cand in (ev.evaluate(layout, shares, knobs), ev.balance(layout, knobs, shares=shares),
                                 ev.balance(layout, knobs)):
                        if cand.feasible and (best is None or cand.time < best.time):
                            best = cand
        return best


def _holder_bound(layout, bws: np.ndarray, layer_bytes: np.ndarray, grad_bytes: float) -> float:
    """Sync lower bound from each device's own links: a device d collects the gradients
    of its layers from other pipelines' devices and takes part in one collective at a
    time, each lasting at least (its bytes) / (d's fastest link to another pipeline).
    d holds at least one layer (the embedding on a first stage, the head on a last one),
    and a pipeline's devices hold all the layers between them, so pipeline p needs at
    least max(max_d least_d / r_d, gradient bytes / sum_d r_d) with r_d that link speed."""
    owner = {d: k for k, p in enumerate(layout) for d in p}
    used = list(owner)
    least_layer = float(layer_bytes.min())
    out = 0.0
    for k, p in enumerate(layout):
        others = [d for d in used if owner[d] != k]
        rates = bws[np.ix_(p, others)].max(axis=1)
        lo = np.full(len(p), least_layer)
        if len(p) == 1:
            lo[0] = grad_bytes
        else:
            lo[0] = max(lo[0], float(layer_bytes[0]))
            lo[-1] = max(lo[-1], float(layer_bytes[-1]))
        out = max(out, float((lo / rates).max()), grad_bytes / float(rates.sum()))
    return out


@cached_njit
def _widest_holders(flat, ptr, bws):
    """Max over choices of one holder device per pipeline of the smallest edge of the
    maximum spanning tree over the holders (edges: link bandwidth): whatever devices hold
    a layer, some split of its holders in two has no faster link across it."""
    P = ptr.shape[0] - 1
    choice = np.zeros(P, np.int64)
    best = 0.0
    nodes = np.empty(P, np.int64)
    inside = np.zeros(P, np.bool_)
    key = np.empty(P)
    while True:
        for p in range(P):
            nodes[p] = flat[ptr[p] + choice[p]]
        # Prim's maximum spanning tree; its smallest edge
        inside[:] = False
        inside[0] = True
        for k in range(P):
            key[k] = bws[nodes[0], nodes[k]]
        bott = np.inf
        for _ in range(P - 1):
            q = -1
            kq = -1.0
            for k in range(P):
                if not inside[k] and key[k] > kq:
                    kq = key[k]
                    q = k
            if kq < bott:
                bott = kq
            inside[q] = True
            for k in range(P):
                if not inside[k] and bws[nodes[q], nodes[k]] > key[k]:
                    key[k] = bws[nodes[q], nodes[k]]
        if bott > best:
            best = bott
        # next choice (odometer)
        p = 0
        while p < P:
            choice[p] += 1
            if choice[p] < ptr[p + 1] - ptr[p]:
                break
            choice[p] = 0
            p += 1
        if p == P:
            return best
