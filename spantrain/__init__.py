"""spantrain: plan and run training across heterogeneous, geo-distributed devices.

The core types here import no torch, gymnasium or PyG. They are imported on first use
(``from spantrain import Cluster`` works as always): importing the package itself costs
nothing, so the command line's entry (`spantrain.__main__`) has its Ctrl-C handling in
place before numpy and the command's modules load.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from spantrain.cluster import GBPS, Cluster, Device, LayerTimes, NetLink, Network
    from spantrain.errors import (
        EmulationError,
        ExecutionError,
        InfeasibleError,
        PlanError,
        PlannerError,
        PolicyError,
        SpantrainError,
        SpecError,
        WorkloadError,
    )
    from spantrain.estimate import Estimate
    from spantrain.plan import SCHEDULES, SYNC_MODES, Pipeline, Plan, Stage, Sync
    from spantrain.planner import Planner
    from spantrain.workload import PRESETS, Architecture, Layer, Workload, load_workload

__version__ = "0.1.0"

_EXPORTS = {
    "cluster": ["GBPS", "Cluster", "Device", "LayerTimes", "NetLink", "Network"],
    "errors": ["SpantrainError", "SpecError", "WorkloadError", "PlanError", "InfeasibleError", "PlannerError",
               "ExecutionError", "EmulationError", "PolicyError"],
    "estimate": ["Estimate"],
    "plan": ["SCHEDULES", "SYNC_MODES", "Pipeline", "Plan", "Stage", "Sync"],
    "planner": ["Planner"],
    "workload": ["PRESETS", "Architecture", "Layer", "Workload", "load_workload"],
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [  # literal, for linters and readers: the names of _EXPORTS
    "GBPS", "Cluster", "Device", "LayerTimes", "NetLink", "Network",
    "SpantrainError", "SpecError", "WorkloadError", "PlanError", "InfeasibleError", "PlannerError",
    "ExecutionError", "EmulationError", "PolicyError",
    "Estimate", "SCHEDULES", "SYNC_MODES", "Pipeline", "Plan", "Stage", "Sync", "Planner",
    "PRESETS", "Architecture", "Layer", "Workload", "load_workload", "__version__",
]


def __getattr__(name: str):
    """An export, imported from its module on first use; or a core module (``spantrain.cluster``
    after a bare ``import spantrain``, as when the package imported them all)."""
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"spantrain.{module}"), name)
        globals()[name] = value
        return value
    if name in _EXPORTS:
        return importlib.import_module(f"spantrain.{name}")
    raise AttributeError(f"module 'spantrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
