"""From measurements to a cluster spec and the ``--json`` document.

Regions are the network groups (``net-0``, ``net-1``, ... in rank order): a region's LAN
is the median of its measured intra-group pairs, a link between two regions the median of
the pairs between them (both directions). A device pair whose measured bandwidth or
latency deviates from its group figure by more than `OVERRIDE_TOLERANCE` (15 %; latency
also by more than 0.05 ms, below which the software floor dominates) keeps its measured
figure as a device-pair override (directional where the directions differ). A region of
one device has no pair of its own: its LAN figure is the fastest measured pair (or, for a
cluster of one device, `UNUSED_LAN`), which no plan can use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from spantrain.cluster import GBPS, Cluster, Device, LayerTimes, NetLink, Network
from spantrain.profiler.grouping import compute_groups, network_groups
from spantrain.profiler.network import PairMeasurement

__all__ = ["OVERRIDE_TOLERANCE", "UNUSED_LAN", "DeviceMeasurement", "Profile", "assemble"]

OVERRIDE_TOLERANCE = 0.15
_LATENCY_FLOOR_S = 0.05e-3
UNUSED_LAN = NetLink(gbps=100.0, latency_ms=0.0)


@dataclass(frozen=True)
class DeviceMeasurement:
    """One device's own figures (sent by every rank to rank 0)."""

    rank: int
    id: str
    host: str
    local_rank: int
    gpu: str
    tflops: float
    memory_gb: float
    model: str
    layer_times: LayerTimes


@dataclass(frozen=True)
class Profile:
    """The assembled result: the spec and the ``--json`` document."""

    cluster: Cluster
    document: dict[str, Any]


def _matrices(n: int, pairs: list[PairMeasurement]) -> tuple[np.ndarray, np.ndarray]:
    bw = np.full((n, n), np.inf)
    lat = np.zeros((n, n))
    for p in pairs:
        bw[p.a, p.b], bw[p.b, p.a] = p.a_to_b, p.b_to_a
        lat[p.a, p.b] = lat[p.b, p.a] = p.latency_s
    off = ~np.eye(n, dtype=bool)
    if n > 1 and not np.all(np.isfinite(bw[off])):
        raise ValueError("a device pair was not measured")
    return bw, lat


def _deviates(measured: np.ndarray, base: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """Off-diagonal entries where `measured` is off `base` by more than the tolerance."""
    out = np.zeros(measured.shape, dtype=bool)
    off = ~np.eye(len(measured), dtype=bool)
    out[off] = np.abs(measured[off] - base[off]) > np.maximum(OVERRIDE_TOLERANCE * base[off], floor)
    return out


def assemble(devices: list[DeviceMeasurement], pairs: list[PairMeasurement], *, name: str) -> Profile:
    """Group the devices and build the spec and the JSON document from the measurements."""
    devices = sorted(devices, key=lambda d: d.rank)
    n = len(devices)
    bw, lat = _matrices(n, pairs)
    labels = network_groups(bw) if n > 1 else [0]
    members = [[i for i in range(n) if labels[i] == g] for g in range(max(labels) + 1)]
    regions = [f"net-{g}" for g in range(len(members))]
    off = ~np.eye(n, dtype=bool)
    fastest = NetLink(gbps=float(bw[off].max()) / GBPS, latency_ms=float(lat[off].min()) * 1e3) if n > 1 \
        else UNUSED_LAN

    def median_link(rows: list[int], cols: list[int]) -> NetLink | None:
        sel = [(i, j) for i in rows for j in cols if i != j]
        if not sel:
            return None
        return NetLink(gbps=float(np.median([bw[i, j] for i, j in sel])) / GBPS,
                       latency_ms=float(np.median([lat[i, j] for i, j in sel])) * 1e3)

    lans = {regions[g]: median_link(m, m) or fastest for g, m in enumerate(members)}
    links = {}
    for g in range(len(members)):
        for h in range(g + 1, len(members)):
            links[tuple(sorted((regions[g], regions[h])))] = _between(bw, lat, members[g], members[h])
    cluster_devices = [Device(id=d.id, region=regions[labels[k]], tier="measured", gpu=d.gpu,
                              tflops=d.tflops, memory_gb=d.memory_gb, host=d.host, local_rank=d.local_rank,
                              layer_times={d.model: d.layer_times}) for k, d in enumerate(devices)]
    base = Cluster(name=name, devices=cluster_devices, network=Network(regions=lans, links=links))
    new_bw = np.where(_deviates(bw, base.bandwidth), bw, base.bandwidth)
    new_lat = np.where(_deviates(lat, base.latency, _LATENCY_FLOOR_S), lat, base.latency)
    cluster = base.with_arrays(bandwidth=new_bw, latency=new_lat) if n > 1 else base

    tflops = np.array([d.tflops for d in devices])
    groups = []
    for g, m in enumerate(members):
        lan = median_link(m, m)
        groups.append({"region": regions[g], "devices": [devices[i].id for i in m],
                       "gbps": lan.gbps if lan else None, "latency_ms": lan.latency_ms if lan else None,
                       "compute_groups": [{"devices": [devices[i].id for i in cg],
                                           "tflops": float(np.median(tflops[cg]))}
                                          for cg in compute_groups(tflops, m)]})
    document = {
        "devices": [{"id": d.id, "rank": d.rank, "host": d.host, "local_rank": d.local_rank,
                     "region": regions[labels[k]], "gpu": d.gpu, "tflops": d.tflops, "memory_gb": d.memory_gb,
                     "layer_times": {d.model: d.layer_times.to_spec()}} for k, d in enumerate(devices)],
        "pairs": [{"a": devices[i].id, "b": devices[j].id, "gbps": float(bw[i, j]) / GBPS,
                   "latency_ms": float(lat[i, j]) * 1e3} for i in range(n) for j in range(n) if i != j],
        "groups": groups,
    }
    return Profile(cluster=cluster, document=document)


def _between(bw: np.ndarray, lat: np.ndarray, g: list[int], h: list[int]) -> NetLink:
    """Median of every directed pair between groups `g` and `h`."""
    sel = [(i, j) for i in g for j in h] + [(j, i) for i in g for j in h]
    return NetLink(gbps=float(np.median([bw[i, j] for i, j in sel])) / GBPS,
                   latency_ms=float(np.median([lat[i, j] for i, j in sel])) * 1e3)
