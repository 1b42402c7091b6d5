"""Baseline planners: what users run today, configured as they would configure them.

- `ddp` (PyTorch DDP): every device a full replica with an equal share of the batch
  (shares differ by at most one sample when the batch does not divide), one stage
  each, flat ring all-reduce. Each replica accumulates gradients over micro-batches of
  the largest size that fits its memory (the usual gradient-accumulation setting).
  With more devices than samples, the first `global_batch` devices in spec order run.
- `gpipe` (PyTorch pipelining as users run it): one pipeline over all devices in spec
  order (at most one per layer), layers split equally, GPipe schedule; the micro-batch
  size is the fastest of 1, 2, 4, 8 that fits (users tune the chunk count).
- `megatron` (Megatron-LM / DeepSpeed): a homogeneous PP x DP grid over every device
  in spec order with Megatron's rank layout (data-parallel ranks adjacent, pipeline
  stages strided: stage i is ranks [i DP, (i+1) DP), so replicas of a stage share a
  server), layers split equally, equal batch shares, 1F1B, all-reduce; the PP degree
  (a divisor of the device count) and the micro-batch size are chosen by the cost
  model, as a user sweeping the documented knobs would.

When the model fits nowhere in the baseline's arrangement, the planner still returns
its plan (what the user would launch); the plan's estimate is infeasible and says
which device runs out of memory. `spantrain compare` reports it as not feasible.
"""

from __future__ import annotations

from dataclasses import dataclass

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.evaluator import MICRO_BATCH_SIZES, Candidate, Evaluator, Knobs, round_shares
from spantrain.errors import PlannerError
from spantrain.plan import Plan
from spantrain.workload import Workload

__all__ = ["BaselineConfig", "DDPPlanner", "GPipePlanner", "MegatronPlanner", "equal_split"]


@dataclass(frozen=True, kw_only=True)
class BaselineConfig:
    """Options shared by the baseline planners (none change what they model)."""

    micro_batch_sizes: tuple[int, ...] = MICRO_BATCH_SIZES
    """Micro-batch sizes gpipe and megatron sweep."""

    def __post_init__(self) -> None:
        sizes = self.micro_batch_sizes
        if not sizes or not all(isinstance(m, int) and not isinstance(m, bool) and m > 0 for m in sizes):
            raise PlannerError(f"micro_batch_sizes must be positive integers, got {sizes!r}")


def equal_split(num_layers: int, num_stages: int) -> tuple[int, ...]:
    """First layer of each of `num_stages` stages of (nearly) equal layer counts."""
    return tuple(round(i * num_layers / num_stages) for i in range(num_stages))


def _best(cands: list[Candidate]) -> Candidate:
    return min(cands, key=lambda c: c.rank)


class _Baseline:
    name = "baseline"

    def __init__(self, config: BaselineConfig | None = None, **options):
        self.config = config or BaselineConfig(**options)

    def plan(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
        ev = Evaluator(cluster, workload, calibration=calibration)
        return ev.to_plan(self.best_candidate(ev))

    def best_candidate(self, ev: Evaluator) -> Candidate:
        raise NotImplementedError


class DDPPlanner(_Baseline):
    """PyTorch DDP: one full replica per device (module docstring)."""

    name = "ddp"

    def best_candidate(self, ev: Evaluator) -> Candidate:
        B = ev.batch
        devices = list(range(min(len(ev.cluster), B)))
        shares = [B // len(devices) + (1 if k < B % len(devices) else 0) for k in range(len(devices))]
        built = []
        for d, b in zip(devices, shares):
            # largest micro-batch (a divisor of the share) whose activations fit
            m = next((k for k in range(b, 0, -1) if b % k == 0 and ev.part.split((d,), k, b // k, "1f1b")), 1)
            built.append(((d,), (0,), m, b // m))
        return ev.score_built(built, Knobs(micro_batch_size=max(m for *_, m, _ in built), schedule="1f1b",
                                           sync="allreduce"))


class GPipePlanner(_Baseline):
    """One pipeline over all devices in spec order, equal layers, GPipe (module docstring)."""

    name = "gpipe"

    def best_candidate(self, ev: Evaluator) -> Candidate:
        B = ev.batch
        L = ev.model.num_layers
        devs = tuple(range(min(len(ev.cluster), L)))
        starts = equal_split(L, len(devs))
        cands = []
        for m in self.config.micro_batch_sizes:
            if B % m:
                continue
            cands.append(ev.score_built([(devs, starts, m, B // m)], Knobs(micro_batch_size=m, schedule="gpipe",
                                                                            sync="allreduce")))
        return _best(cands)


class MegatronPlanner(_Baseline):
    """Homogeneous PP x DP grid with Megatron's rank layout (module docstring)."""

    name = "megatron"

    def best_candidate(self, ev: Evaluator) -> Candidate:
        n = len(ev.cluster)
        B = ev.batch
        L = ev.model.num_layers
        cands = []
        for pp in range(1, min(n, L) + 1):
            if n % pp:
                continue
            dp = n // pp
            if dp > B:
                continue
            starts = equal_split(L, pp)
            shares = round_shares([1.0] * dp, B)
            for m in self.config.micro_batch_sizes:
                if any(b % m for b in shares) and m > 1:
                    continue
                built = [(tuple(j + i * dp for i in range(pp)), starts, m, b // m) for j, b in enumerate(shares)]
                cands.append(ev.score_built(built, Knobs(micro_batch_size=m, schedule="1f1b", sync="allreduce")))
        if not cands:
            # more replicas than samples for every degree: the largest pipeline the layers allow
            pp = min(n, L)
            built = [(tuple(range(pp)), equal_split(L, pp), 1, B)]
            cands.append(ev.score_built(built, Knobs(micro_batch_size=1, schedule="1f1b", sync="allreduce")))
        return _best(cands)
