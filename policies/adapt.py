"""Adapting a running plan to a cluster that changed: keep it, let the policy move it, or re-plan.

When links or devices change under a running job (re-measured with `spantrain profile`),
the plan that is running may no longer be the best one, but switching has a price: every
device that is to hold layers it does not hold now must receive their weights and
optimizer state (16 bytes per parameter, from the best-connected device that holds
them, devices in parallel: `PlanEnv.migration_s`). Over the ``remaining_steps``
iterations still to run, each option costs ``remaining_steps x iteration_s +
migration_s``, and the cheapest wins:

- ``keep``: the running plan as it is, scored on the cluster as it is now;
- ``recut``: the running plan's devices, micro-batches and knobs, with its layer cuts
  moved for the cluster as it is now (`spantrain.policies.cuts`; only the layers that
  cross a cut migrate); listed when moving a cut pays over the remaining steps;
- ``ppo``: the learned policy, starting from the running plan and weighing the
  migration over the same horizon (what it was trained for in adaptation episodes);
- a fresh plan of the named planner (the heuristic's for ``auto``), paying whatever
  migration it implies.

A device of the running plan that is no longer in the cluster (it failed or left) makes
keeping impossible; the options are then the fresh plans, compared by iteration time
alone, since the departed device's layers come back from the run's last checkpoint,
whose cost this module does not model.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from spantrain._say import warn
from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.evaluator import Candidate, Evaluator, Knobs
from spantrain.errors import PlanError, PolicyError
from spantrain.plan import Plan
from spantrain.planner import plan_with
from spantrain.policies.cuts import refine_cuts
from spantrain.policies.ppo import past_policy_size
from spantrain.workload import Workload

__all__ = ["Option", "Adaptation", "candidate_from_plan", "adapt_plan", "DEFAULT_REMAINING_STEPS"]

DEFAULT_REMAINING_STEPS = 500
"""Iterations still to run when the user does not say (the policy's training horizon)."""


@dataclass(frozen=True, kw_only=True)
class Option:
    """One way to continue the run."""

    name: str
    """``keep``, ``recut``, ``ppo`` or the re-planning planner's name."""
    iteration_s: float
    """Predicted seconds per iteration on the cluster as it is now (inf: does not fit)."""
    migration_s: float
    """Seconds to move state to the devices that need it (0 for ``keep``, and 0 when a
    device left: the state then comes from the checkpoint, not modelled)."""
    total_s: float
    """remaining steps x `iteration_s` + `migration_s`."""

    def to_dict(self) -> dict[str, Any]:
        """As JSON takes it: a plan that does not fit has no time (None, not inf)."""
        return {k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in dataclasses.asdict(self).items()}


@dataclass(frozen=True, kw_only=True)
class Adaptation:
    """What to run from now on, and why."""

    plan: Plan
    """The plan to continue with (the running one when keeping is cheapest)."""
    chosen: str
    """Name of the chosen `Option`."""
    remaining_steps: int
    """Iterations the choice was made for."""
    options: tuple[Option, ...]
    """Every option considered, in the order tried."""
    missing: tuple[str, ...] = ()
    """Devices of the running plan that are not in the cluster any more."""

    @property
    def switch(self) -> bool:
        """True when the run should move to a new plan."""
        return self.chosen != "keep"

    def option(self, name: str) -> Option:
        return next(o for o in self.options if o.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "switch": self.switch, "remaining_steps": self.remaining_steps,
                "options": [o.to_dict() for o in self.options], "missing_devices": list(self.missing)}


def candidate_from_plan(ev: Evaluator, plan: Plan) -> Candidate:
    """The plan exactly as written (its own layer ranges and micro-batches), scored on
    `ev`'s cluster; `PlanError` naming every problem when it does not match them."""
    plan.validate(ev.cluster, ev.workload)
    index = {d: i for i, d in enumerate(ev.cluster.ids)}
    built = [(tuple(index[s.device] for s in p.stages), tuple(s.layers[0] for s in p.stages),
              p.micro_batch_size, p.num_micro_batches) for p in plan.pipelines]
    knobs = Knobs(micro_batch_size=max(p.micro_batch_size for p in plan.pipelines), schedule=plan.schedule,
                  sync=plan.sync.mode, period=plan.sync.period)
    return ev.score_built(built, knobs)


def adapt_plan(cluster: Cluster, workload: Workload, running: Plan, *, remaining_steps: int = DEFAULT_REMAINING_STEPS,
               planner: str | Any = "auto", calibration: Calibration | None = None,
               **planner_options: Any) -> Adaptation:
    """The cheapest way to run the remaining steps from `running` (module docstring).

    `planner` decides the options: ``auto`` tries the policy and the heuristic, ``ppo``
    the policy alone, any other registered planner its fresh plan; keeping is always an
    option while every device of `running` is still there. `calibration`: the cost model's
    constants for every option (the built-in ones when None). `planner_options` go to the
    planner (``policy=FILE`` for ppo/auto). `planner` may also be a planner made already
    (its policy loaded: `spantrain plan` times loading apart)."""
    from spantrain.env.plan_env import EnvConfig, PlanEnv, Scenario, held_layers
    from spantrain.policies.heuristic import HeuristicPlanner
    from spantrain.policies.registry import get_planner

    if isinstance(remaining_steps, bool) or not isinstance(remaining_steps, int) or remaining_steps < 1:
        raise PlanError([f"remaining steps must be a positive integer, got {remaining_steps!r}"])
    problems = running.problems(None, workload)
    # only a valid plan has a batch (a micro-batch field may be a string), and only then is a hint right
    if not problems and running.batch != workload.global_batch:
        problems.append(f"the running plan's batch is {running.batch} samples but the workload's global batch is "
                        f"{workload.global_batch} (pass --global-batch {running.batch})")
    if problems:
        raise PlanError(problems)
    # unknown names and options fail before any work
    named = get_planner(planner, **planner_options) if isinstance(planner, str) else planner
    ppo = named.ppo if named.name == "auto" else named if named.name == "ppo" else None
    fresh_planner = HeuristicPlanner() if named.name == "auto" else named
    missing = tuple(d for d in running.devices if d not in cluster)
    ev = Evaluator(cluster, workload, calibration=calibration)
    H = remaining_steps
    found: dict[str, Candidate] = {}
    env = None
    if not missing:
        keep = candidate_from_plan(ev, running)
        env = PlanEnv(EnvConfig(max_devices=max(len(cluster), 2), min_devices=2, horizon=H))
        env.load(Scenario(key=("running",), cluster=cluster, workload=workload, evaluator=ev, start=keep,
                          running=held_layers(keep, workload.num_layers)))
        found["keep"] = keep
        recut = refine_cuts(ev, keep, cost=lambda c: H * c.time + env.migration_s(c))
        if recut is not keep:
            found["recut"] = recut
        # the policy improves a plan that runs; one that no longer fits memory is re-planned instead
        # the heuristic's options alone, as AutoPlanner plans
        too_many = named.name == "auto" and past_policy_size(len(cluster), "adapting without it")
        if keep.feasible and ppo is not None and not too_many and (named.name == "ppo" or _loads(ppo)):
            found["ppo"] = ppo.improve(env.scenario, horizon=H)
    if fresh_planner.name != "ppo" or missing or not keep.feasible:
        found[fresh_planner.name] = candidate_from_plan(ev, plan_with(fresh_planner, cluster, workload, calibration))
    options = []
    for name, cand in found.items():
        migration = 0.0 if env is None or name == "keep" else env.migration_s(cand)
        total = H * cand.time + migration
        options.append(Option(name=name, iteration_s=float(cand.time), migration_s=float(migration),
                              total_s=float(total)))
    best = min(options, key=lambda o: (o.total_s, o.name != "keep"))  # ties keep the running plan
    if not math.isfinite(best.total_s):
        raise PlanError(["no option fits memory on the cluster as it is now: "
                         + "; ".join(f"{n}: {c.note}" for n, c in found.items() if c.note)])
    chosen = found[best.name]
    plan = ev.to_plan(chosen)
    if best.name == "keep":  # the very plan that runs, with today's prediction
        plan = dataclasses.replace(running, predicted=plan.predicted)
    return Adaptation(plan=plan, chosen=best.name, remaining_steps=H, options=tuple(options), missing=missing)


def _loads(ppo) -> bool:
    """Whether the policy loads; if not, a one-line warning (``auto`` goes on without it)."""
    try:
        ppo.prepare()
    except PolicyError as e:
        warn(f"{e}; adapting without the policy")
        return False
    return True
