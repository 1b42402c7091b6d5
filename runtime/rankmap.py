"""Which process (global rank) runs which plan device, and what each rank does.

Only the devices a plan uses get a rank. Three ways to decide, in this order:

1. an explicit mapping file (``--rank-map FILE``, YAML or JSON): either ``{device: rank}``
   or a list of device ids in rank order;
2. the cluster spec's ``host`` / ``local_rank`` records (what the profiler measured): every
   process reports its host name (``SPANTRAIN_HOST`` if set, else the machine's host name)
   and torchrun's ``LOCAL_RANK``, and the device with the same record gets that rank;
3. otherwise plan order: pipeline by pipeline, stage by stage (what local runs use).

Pure Python (no torch), so it is tested without processes.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spantrain._spec import other_kind, plural, read_structured, shown
from spantrain.cluster import Cluster
from spantrain.errors import ExecutionError, join_problems
from spantrain.plan import Plan

__all__ = ["Role", "Layout", "plan_order_ranks", "ranks_from_file", "ranks_from_records", "resolve_ranks",
           "host_record"]


@dataclass(frozen=True)
class Role:
    """What one rank runs."""

    rank: int
    device: str
    pipeline: int
    stage: int
    layers: tuple[int, int]
    region: str


class Layout:
    """The plan seen through the rank map: roles, pipelines' rank lists, holders of each layer."""

    def __init__(self, plan: Plan, cluster: Cluster, rank_of: dict[str, int]):
        self.plan = plan
        self.rank_of = dict(rank_of)
        self.roles: dict[int, Role] = {}
        for i, p in enumerate(plan.pipelines):
            for j, s in enumerate(p.stages):
                r = rank_of[s.device]
                self.roles[r] = Role(rank=r, device=s.device, pipeline=i, stage=j, layers=s.layers,
                                     region=cluster.device(s.device).region)
        self.world_size = len(self.roles)

    def pipeline_ranks(self, pipeline: int) -> list[int]:
        """Global ranks of a pipeline's stages, in stage order."""
        return [self.rank_of[s.device] for s in self.plan.pipelines[pipeline].stages]

    def holders(self, layer: int) -> tuple[int, ...]:
        """Sorted global ranks holding `layer` (one per pipeline)."""
        out = []
        for p in self.plan.pipelines:
            for s in p.stages:
                if s.layers[0] <= layer < s.layers[1]:
                    out.append(self.rank_of[s.device])
        return tuple(sorted(out))

    def holder_sets(self, num_layers: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """(ranks, layers) for each distinct set of holders, ordered by its first layer.

        Layers held by the same ranks sync together in one message; the fixed order is what
        every rank follows, so blocking collectives on different groups cannot deadlock.
        """
        groups: dict[tuple[int, ...], list[int]] = {}
        for layer in range(num_layers):
            groups.setdefault(self.holders(layer), []).append(layer)
        return sorted(((r, tuple(ls)) for r, ls in groups.items()), key=lambda x: x[1][0])


def plan_order_ranks(plan: Plan) -> dict[str, int]:
    """Rank i runs the plan's i-th device (pipeline by pipeline, stage by stage)."""
    return {d: i for i, d in enumerate(plan.devices)}


def ranks_from_file(path: str | Path, plan: Plan) -> dict[str, int]:
    """A mapping file: ``{device: rank}`` (optionally under ``ranks:``) or a list of devices in rank order."""
    raw: Any = read_structured(path, ExecutionError)
    if isinstance(raw, dict) and set(raw) == {"ranks"}:
        raw = raw["ranks"]
    if isinstance(raw, list):
        if not all(isinstance(d, str) for d in raw):
            raise ExecutionError(f"{path}: a list mapping must hold device ids in rank order")
        raw = {d: i for i, d in enumerate(raw)}
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
                                            for k, v in raw.items()):
        if wrong := other_kind(raw, "rank map"):  # a model, spec or plan given here: said so, not just "expected"
            raise ExecutionError(f"{path}: {wrong}")
        raise ExecutionError(f"{path}: expected {{device: rank}} or a list of device ids in rank order")
    used = plan.devices
    mapping = {d: raw[d] for d in used if d in raw}
    missing = [d for d in used if d not in raw]
    if missing:
        # a file may rank more devices than the plan uses (the whole cluster's); next to a missing
        # one, those are likely the typo ("vm-9" for "vm-1")
        unknown = [d for d in raw if d not in used]
        hint = f" (it also ranks {', '.join(unknown)}, which the plan does not use)" if unknown else ""
        raise ExecutionError(f"{path}: no rank for plan device(s) {', '.join(missing)}{hint}")
    _check_bijection(mapping, len(used), str(path))
    return mapping


def host_record() -> tuple[str, int]:
    """(host, local rank) of this process, as the profiler records devices."""
    host = os.environ.get("SPANTRAIN_HOST") or socket.gethostname()
    return host, int(os.environ.get("LOCAL_RANK", "0"))


def _same_host(a: str, b: str) -> bool:
    return a == b or a.split(".")[0] == b.split(".")[0]


def ranks_from_records(plan: Plan, cluster: Cluster, records: Sequence[tuple[str, int]]) -> dict[str, int]:
    """Match each plan device's host/local_rank record to the process that reported it."""
    problems = []
    mapping: dict[str, int] = {}
    for d in plan.devices:
        dev = cluster.device(d)
        if dev.host is None or dev.local_rank is None:
            problems.append(f"device {shown(d)} has no host/local_rank record")
            continue
        hits = [r for r, (h, lr) in enumerate(records) if _same_host(h, dev.host) and lr == dev.local_rank]
        if not hits:
            problems.append(f"no process runs on host {shown(dev.host)} with local rank {dev.local_rank} "
                            f"(device {shown(d)})")
        elif len(hits) > 1:
            problems.append(f"processes {hits} all report host {shown(dev.host)} local rank {dev.local_rank}")
        else:
            mapping[d] = hits[0]
    if problems:
        raise ExecutionError("cannot map plan devices to ranks: " + join_problems(problems)
                             + " (the processes must run where the spec's host/local_rank records say, or pass "
                               "--rank-map FILE naming each plan device's rank)")
    _check_bijection(mapping, len(plan.devices), "host/local_rank records")
    return mapping


def _check_bijection(mapping: dict[str, int], world: int, source: str) -> None:
    ranks = sorted(mapping.values())
    if ranks != list(range(world)):
        raise ExecutionError(f"{source}: plan devices must take ranks 0..{world - 1} once each, got {ranks}")


def resolve_ranks(plan: Plan, cluster: Cluster, world_size: int, records: Sequence[tuple[str, int]] | None = None,
                  mapping_file: str | None = None) -> tuple[dict[str, int], str]:
    """(device -> rank, how it was decided) for a launch of `world_size` processes."""
    used = plan.devices
    if world_size != len(used):
        raise ExecutionError(f"the plan uses {plural(len(used), 'device')} but "
                             f"{plural(world_size, 'process', 'processes')} started "
                             f"(start exactly one process per plan device)")
    if mapping_file:
        return ranks_from_file(mapping_file, plan), f"mapping file {mapping_file}"
    recorded = [d for d in used if cluster.device(d).host is not None and cluster.device(d).local_rank is not None]
    if records is not None and recorded:
        if len(recorded) != len(used):
            missing = sorted(set(used) - set(recorded))
            raise ExecutionError(f"only some plan devices have host/local_rank records (missing: {', '.join(missing)});"
                                 " record all of them or pass --rank-map")
        return ranks_from_records(plan, cluster, records), "host/local_rank records"
    return plan_order_ranks(plan), "plan order"
