"""The planner interface every planner implements, so the fallback is a drop-in."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from spantrain.cluster import Cluster
    from spantrain.env.calibration import Calibration
    from spantrain.plan import Plan
    from spantrain.workload import Workload

__all__ = ["Planner", "prepare", "plan_with", "gc_paused", "screening"]


@runtime_checkable
class Planner(Protocol):
    """Anything with a name that turns a cluster and a workload into a plan."""

    name: str

    def plan(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
        """A valid plan whose iteration batch aims at `workload.global_batch`, the fastest the
        planner finds by a cost model with `calibration`'s constants (the built-in ones when
        None; a profile of the executor that will run the plan makes it fastest there)."""
        ...


def prepare(planner: Planner) -> None:
    """Do a planner's one-time loading now, when it has any (`prepare()`: the learned policy
    imports torch, seconds in a fresh process), so that timing `plan` times planning."""
    load = getattr(planner, "prepare", None)
    if load is not None:
        load()


def plan_with(planner: Planner, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
    """`planner.plan`, passing `calibration` only when there is one: a planner written before
    `Planner.plan` took it still plans with the built-in constants."""
    if calibration is None:
        return planner.plan(cluster, workload)
    return planner.plan(cluster, workload, calibration)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a planner's search (nests).

    A search allocates hundreds of thousands of short-lived objects (tuples, candidates)
    that reference counting frees as it goes, yet their allocation keeps triggering
    collections, and now and then a full one: with torch and SB3 loaded (~500k tracked
    objects) a full collection costs ~0.3 s, a third of the 1 s budget of a 64-device
    plan. Nothing leaks: cycles made meanwhile are collected once the search is over."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@contextmanager
def screening(owner) -> Iterator[None]:
    """`owner.screening` true within, as it was after (nests): a search ranks many candidates
    on cheaper, approximate scores (`Partitioner.screened`, `CostModel.screened`) and scores
    the ones it keeps again outside."""
    before, owner.screening = owner.screening, True
    try:
        yield
    finally:
        owner.screening = before
