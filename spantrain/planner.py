"""The planner interface every planner implements, so the fallback is a drop-in."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from spantrain.cluster import Cluster
    from spantrain.plan import Plan
    from spantrain.workload import Workload

__all__ = ["Planner"]


@runtime_checkable
class Planner(Protocol):
    """Anything with a name that turns a cluster and a workload into a plan."""

    name: str

    def plan(self, cluster: Cluster, workload: Workload) -> Plan:
        """A valid plan whose iteration batch aims at `workload.global_batch`."""
        ...
