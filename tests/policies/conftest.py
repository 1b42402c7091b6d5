"""Small clusters for the planner tests (specs built in code, so each test says what it needs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from spantrain.cluster import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parent))


def region_cluster(regions: dict[str, tuple[int, float, float, float]], cross_gbps: float, *,
                   cross_latency_ms: float = 20.0, lan_latency_ms: float = 0.02, name: str = "test") -> Cluster:
    """Regions of identical devices: name -> (count, tflops, memory_gb, LAN gbps); every
    pair of regions linked at `cross_gbps`."""
    devices = [{"id": r, "count": n, "region": r, "tflops": tf, "memory_gb": mem}
               if n > 1 else {"id": f"{r}-0", "region": r, "tflops": tf, "memory_gb": mem}
               for r, (n, tf, mem, _) in regions.items()]
    spec = {"name": name, "devices": devices,
            "network": {"regions": {r: {"gbps": g, "latency_ms": lan_latency_ms}
                                    for r, (_, _, _, g) in regions.items()},
                        "default": {"gbps": cross_gbps, "latency_ms": cross_latency_ms}}}
    return Cluster.from_spec(spec)


@pytest.fixture
def slow_link_cluster() -> Cluster:
    """Two regions of four A100s on 100 Gbit/s LANs, joined by a 100 Mbit/s link."""
    return region_cluster({"west": (4, 140, 40, 100), "east": (4, 140, 40, 100)}, 0.1, name="slow-link")


@pytest.fixture
def uniform_cluster() -> Cluster:
    """Four identical H100s on one 1.6 Tbit/s fabric: plain data parallelism is right."""
    return region_cluster({"node": (4, 400, 80, 1600)}, 1.0, name="uniform")
