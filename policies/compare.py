"""Run planners side by side on one cluster and workload (`spantrain compare`, benchmarks).

Every planner's plan is re-estimated with a fresh cost model, so the figures compare
like with like whatever the planner predicted. A planner that raises a
`SpantrainError` (nothing fits, too many devices for exhaustive search) or returns an
infeasible plan is reported with ``feasible: False`` and the reason.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.costmodel import CostModel
from spantrain.errors import SpantrainError
from spantrain.estimate import Estimate
from spantrain.plan import Plan
from spantrain.planner import plan_with, prepare
from spantrain.policies.registry import available_planners, get_planner
from spantrain.workload import Workload

__all__ = ["PlannerResult", "run_planner", "warm_up", "default_planners", "EXHAUSTIVE_MAX_DEVICES"]

EXHAUSTIVE_MAX_DEVICES = 8
"""Largest cluster the default planner list includes exhaustive search for."""


@dataclass(frozen=True, kw_only=True)
class PlannerResult:
    """One planner's outcome."""

    name: str
    """Registered planner name."""
    plan: Plan | None
    """The plan, or None when the planner raised."""
    estimate: Estimate | None
    """The cost model's estimate of the plan (None without a plan)."""
    plan_s: float
    """Wall seconds the planner took."""
    cpu_s: float = 0.0
    """CPU seconds of this process while planning (what a shared machine's load cannot inflate)."""
    reason: str = ""
    """Why the result is not feasible (the planner's error or the estimate's reasons)."""

    @property
    def feasible(self) -> bool:
        return self.estimate is not None and self.estimate.feasible

    @property
    def samples_per_s(self) -> float:
        return self.estimate.samples_per_s if self.feasible else 0.0

    @property
    def iteration_s(self) -> float | None:
        return self.estimate.iteration_s if self.estimate is not None else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"samples_per_s": self.samples_per_s, "iteration_s": self.iteration_s,
                               "feasible": self.feasible, "plan_s": self.plan_s,
                               "plan": self.plan.to_dict() if self.plan is not None else None}
        if not self.feasible:
            out["reason"] = self.reason
        return out


def default_planners(cluster: Cluster) -> list[str]:
    """Every registered planner, without exhaustive search on clusters above 8 devices."""
    return [n for n in available_planners() if n != "exhaustive" or len(cluster) <= EXHAUSTIVE_MAX_DEVICES]


def warm_up(names: tuple[str, ...] = ("ddp", "heuristic"), **options: Any) -> None:
    """Run `names` once on a 4-device cluster, so that no timed planner pays the process's
    one-time loading of the compiled kernels (~0.6 s, more when they compile)."""
    from spantrain.profiler.topology import generate

    cluster, workload = generate(4, 0, "cee"), Workload.from_preset("gpt2-small")
    for name in names:
        run_planner(name, cluster, workload, **options)


def run_planner(name: str, cluster: Cluster, workload: Workload, *, calibration: Calibration | None = None,
                **options: Any) -> PlannerResult:
    """Plan with `name` (built with `options`) scoring plans with `calibration`'s constants (the
    built-in ones when None), time it, and estimate the plan with the same. A planner's
    `prepare()`, when it has one (loading the learned policy, which imports torch: ~4 s
    in a fresh process), runs before the clock starts: plan time is planning."""
    planner = get_planner(name, **options)
    try:
        prepare(planner)
    except SpantrainError as e:
        return PlannerResult(name=name, plan=None, estimate=None, plan_s=0.0, reason=_reason(name, e))
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        plan = plan_with(planner, cluster, workload, calibration)
    except SpantrainError as e:
        return PlannerResult(name=name, plan=None, estimate=None, plan_s=time.perf_counter() - t0,
                             cpu_s=time.process_time() - c0, reason=_reason(name, e))
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    est = CostModel(cluster, workload, calibration, memo=False).estimate(plan)
    return PlannerResult(name=name, plan=plan, estimate=est, plan_s=dt, cpu_s=dc,
                         reason="" if est.feasible else "infeasible: " + "; ".join(est.reasons))


def _reason(name: str, error: Exception) -> str:
    """A planner's error without its own "NAME: " prefix: results are keyed by the name already."""
    return str(error).removeprefix(f"{name}: ")
