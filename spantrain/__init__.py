"""spantrain: plan and run training across heterogeneous, geo-distributed devices.

The core types here import no torch, gymnasium or PyG.
"""

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

__all__ = [
    "GBPS", "Cluster", "Device", "LayerTimes", "NetLink", "Network",
    "SpantrainError", "SpecError", "WorkloadError", "PlanError", "InfeasibleError", "PlannerError",
    "ExecutionError", "EmulationError", "PolicyError",
    "Estimate", "SCHEDULES", "SYNC_MODES", "Pipeline", "Plan", "Stage", "Sync", "Planner",
    "PRESETS", "Architecture", "Layer", "Workload", "load_workload", "__version__",
]
