"""Clusters built in code for the planner tests (a module of its own: `conftest` is a
name every test folder has, so importing it by name picks whichever folder came first)."""

from __future__ import annotations

from spantrain.cluster import Cluster

__all__ = ["region_cluster"]


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
