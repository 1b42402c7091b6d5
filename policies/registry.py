"""Planners by name, for `spantrain plan --planner NAME` and everything else that picks one.

Entries are import paths so that asking for one planner does not import the others
(the PPO planner pulls in torch and SB3; the heuristic must stay light).
"""

from __future__ import annotations

import importlib
from typing import Any

from spantrain.errors import PlannerError
from spantrain.planner import Planner

__all__ = ["PLANNERS", "available_planners", "get_planner"]

PLANNERS: dict[str, str] = {
    "heuristic": "spantrain.policies.heuristic:HeuristicPlanner",
    "ddp": "spantrain.policies.baselines:DDPPlanner",
    "gpipe": "spantrain.policies.baselines:GPipePlanner",
    "megatron": "spantrain.policies.baselines:MegatronPlanner",
    "ga": "spantrain.policies.genetic:GeneticPlanner",
    "exhaustive": "spantrain.policies.exhaustive:ExhaustivePlanner",
    "ppo": "spantrain.policies.ppo:PPOPlanner",
    "auto": "spantrain.policies.ppo:AutoPlanner",
}
"""Planner name -> ``module:factory``; the factory takes keyword options and returns a `Planner`."""


def available_planners() -> list[str]:
    return list(PLANNERS)


def get_planner(name: str, **options: Any) -> Planner:
    """The planner called `name`, built with `options` (unknown options are an error)."""
    if not isinstance(name, str) or name not in PLANNERS:  # a list was a TypeError (unhashable)
        known = ", ".join(PLANNERS) or "none yet"
        raise PlannerError(f"unknown planner {name!r} (available: {known})")
    module, _, attr = PLANNERS[name].partition(":")
    factory = getattr(importlib.import_module(module), attr)
    try:
        return factory(**options)
    except TypeError as e:
        raise PlannerError(f"planner {name!r}: {e}") from None
