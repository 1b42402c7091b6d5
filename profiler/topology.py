"""Synthetic but realistic cluster topologies, deterministic by seed.

Three profiles:

- ``cee``: DeepCEE's cloud / edge / end tiers. Cloud regions hold data-centre GPUs on a
  fast fabric, edge sites hold workstation and inference GPUs on a campus LAN, end sites
  hold consumer GPUs and Jetsons on home or office networks. Links between regions are
  drawn per tier pair (cloud-edge around 100 Mbit/s, as in DeepCEE's testbed).
- ``geo``: data centres in real cities. Latency follows great-circle distance over fibre
  (about 200 km per ms, times a routing detour), bandwidth falls with distance: tens of
  Mbit/s across oceans to a few Gbit/s between neighbours.
- ``datacenter``: one fast fabric of 8-GPU servers of mixed generations; each server is a
  region (NVLink inside, the fabric between).

Any size from 2 to 4096 devices; region counts are capped so spec files stay readable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spantrain.cluster import MAX_DEVICES, Cluster, Device, NetLink, Network
from spantrain.errors import SpecError
from spantrain.profiler.catalog import CATALOG

__all__ = ["PROFILES", "CITIES", "generate"]

PROFILES = ("cee", "geo", "datacenter")
MIN_DEVICES = 2

_TAGS = {"H100-80GB": "h100", "A100-80GB": "a100l", "A100-40GB": "a100", "V100-32GB": "v100", "T4": "t4",
         "RTX3090": "3090", "RTX3060": "3060", "Jetson-AGX-Orin": "orin"}

# GPU mix per tier: (label, weight)
_TIER_GPUS = {
    "cloud": [("H100-80GB", 0.2), ("A100-80GB", 0.3), ("A100-40GB", 0.3), ("V100-32GB", 0.2)],
    "edge": [("RTX3090", 0.5), ("T4", 0.3), ("A100-40GB", 0.2)],
    "end": [("RTX3060", 0.5), ("Jetson-AGX-Orin", 0.3), ("RTX3090", 0.2)],
}
# Inside a region: (gbps range, latency ms range)
_TIER_LAN = {"cloud": ((100, 200), (0.01, 0.03)), "edge": ((10, 25), (0.05, 0.2)), "end": ((1, 1), (0.3, 1.0))}
# Between regions, by sorted tier pair: (gbps range, latency ms range)
_TIER_WAN = {
    ("cloud", "cloud"): ((0.5, 5.0), (10, 60)),
    ("cloud", "edge"): ((0.08, 1.0), (10, 40)),
    ("cloud", "end"): ((0.05, 0.3), (30, 100)),
    ("edge", "edge"): ((0.3, 2.0), (5, 20)),
    ("edge", "end"): ((0.1, 1.0), (2, 15)),
    ("end", "end"): ((0.02, 0.2), (20, 60)),
}
# Tier shares of the devices and the most sites (regions) per tier.
_TIER_SHARE = {"cloud": 0.3, "edge": 0.35, "end": 0.35}
_TIER_MAX_SITES = {"cloud": 8, "edge": 16, "end": 24}
_TIER_SITE_SIZE = {"cloud": 16, "edge": 6, "end": 2}

CITIES: dict[str, tuple[float, float]] = {
    "virginia": (38.9, -77.4), "ohio": (40.0, -83.0), "oregon": (45.6, -121.2), "california": (37.4, -121.9),
    "montreal": (45.5, -73.6), "saopaulo": (-23.5, -46.6), "iowa": (41.3, -95.9), "texas": (32.8, -96.8),
    "london": (51.5, -0.1), "frankfurt": (50.1, 8.7), "paris": (48.9, 2.4), "stockholm": (59.3, 18.1),
    "milan": (45.5, 9.2), "madrid": (40.4, -3.7), "tokyo": (35.7, 139.7), "seoul": (37.6, 127.0),
    "singapore": (1.35, 103.8), "mumbai": (19.1, 72.9), "sydney": (-33.9, 151.2), "hongkong": (22.3, 114.2),
    "jakarta": (-6.2, 106.8), "johannesburg": (-26.2, 28.0), "telaviv": (32.1, 34.8), "dubai": (25.2, 55.3),
}
_GEO_GPUS = [("H100-80GB", 0.2), ("A100-80GB", 0.25), ("A100-40GB", 0.25), ("V100-32GB", 0.15), ("T4", 0.15)]
_DC_GPUS = [("H100-80GB", 0.25), ("A100-80GB", 0.25), ("A100-40GB", 0.25), ("V100-32GB", 0.25)]


@dataclass
class _Site:
    region: str
    tier: str
    gpu: str
    count: int


def generate(n_devices: int, seed: int = 0, profile: str = "cee", name: str | None = None) -> Cluster:
    """A cluster of exactly `n_devices` devices; the same arguments always give the same cluster."""
    if profile not in PROFILES:
        raise SpecError(f"unknown topology profile {profile!r} (choose from {', '.join(PROFILES)})")
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or not MIN_DEVICES <= n_devices <= MAX_DEVICES:
        raise SpecError(f"--devices must be an integer from {MIN_DEVICES} to {MAX_DEVICES}, got {n_devices!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise SpecError(f"--seed must be an integer >= 0, got {seed!r}")
    rng = np.random.default_rng([seed, PROFILES.index(profile), n_devices])
    build = {"cee": _cee, "geo": _geo, "datacenter": _datacenter}[profile]
    sites, regions, links, default = build(n_devices, rng)
    devices = []
    for s in sites:
        gpu = CATALOG[s.gpu]
        base = f"{s.region}-{_TAGS[s.gpu]}"
        ids = [base] if s.count == 1 else [f"{base}-{k}" for k in range(s.count)]
        devices += [Device(id=i, region=s.region, tier=s.tier, gpu=gpu.name, tflops=gpu.tflops,
                           memory_gb=gpu.memory_gb) for i in ids]
    assert len(devices) == n_devices, (len(devices), n_devices)
    return Cluster(name=name or f"{profile}-{n_devices}-s{seed}", devices=devices,
                   network=Network(regions=regions, links=links, default=default))


# ---- profiles ----------------------------------------------------------------------------------

def _loguniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(10 ** rng.uniform(math.log10(lo), math.log10(hi))) if hi > lo else float(lo)


def _round(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}")


def _pick(rng: np.random.Generator, choices: list[tuple[str, float]]) -> str:
    w = np.array([c[1] for c in choices])
    return choices[int(rng.choice(len(choices), p=w / w.sum()))][0]


def _split(total: int, parts: int, rng: np.random.Generator) -> list[int]:
    """`total` devices over `parts` sites, every site at least one, sizes uneven."""
    weights = rng.uniform(0.5, 1.5, size=parts)
    sizes = np.maximum(1, np.floor(weights / weights.sum() * total)).astype(int)
    while sizes.sum() > total:
        sizes[int(np.argmax(sizes))] -= 1
    while sizes.sum() < total:
        sizes[int(rng.integers(parts))] += 1
    return [int(s) for s in sizes]


def _lan(rng: np.random.Generator, tier: str) -> NetLink:
    (g0, g1), (l0, l1) = _TIER_LAN[tier]
    return NetLink(gbps=_round(_loguniform(rng, g0, g1)), latency_ms=_round(rng.uniform(l0, l1)))


def _cee(n: int, rng: np.random.Generator):
    counts = {"cloud": max(1, round(n * _TIER_SHARE["cloud"]))}
    counts["edge"] = max(1, round(n * _TIER_SHARE["edge"])) if n - counts["cloud"] > 0 else 0
    counts["end"] = n - counts["cloud"] - counts["edge"]
    sites: list[_Site] = []
    for tier, count in counts.items():
        if count <= 0:
            continue
        n_sites = min(_TIER_MAX_SITES[tier], max(1, math.ceil(count / _TIER_SITE_SIZE[tier])))
        for k, size in enumerate(_split(count, n_sites, rng)):
            region = f"{tier}-{k}"
            gpu = _pick(rng, _TIER_GPUS[tier])
            # big sites mix two GPU generations, as real clouds and labs do
            second = _pick(rng, _TIER_GPUS[tier]) if size >= 8 and rng.random() < 0.5 else gpu
            if second != gpu:
                sites += [_Site(region, tier, gpu, size - size // 2), _Site(region, tier, second, size // 2)]
            else:
                sites.append(_Site(region, tier, gpu, size))
    tiers = {s.region: s.tier for s in sites}
    regions = {r: _lan(rng, t) for r, t in tiers.items()}
    links = {}
    names = list(regions)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (g0, g1), (l0, l1) = _TIER_WAN[tuple(sorted((tiers[a], tiers[b])))]
            links[tuple(sorted((a, b)))] = NetLink(gbps=_round(_loguniform(rng, g0, g1)),
                                                   latency_ms=_round(rng.uniform(l0, l1)))
    return sites, regions, links, NetLink(gbps=0.05, latency_ms=80)


def _great_circle_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    lat1, lon1, lat2, lon2 = map(math.radians, (*a, *b))
    h = math.sin((lat2 - lat1) / 2) ** 2 + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    return 2 * 6371 * math.asin(math.sqrt(h))


def _geo(n: int, rng: np.random.Generator):
    n_cities = min(len(CITIES), max(2, math.ceil(n / 4)))
    names = [str(c) for c in rng.choice(list(CITIES), size=n_cities, replace=False)]
    sites = []
    for city, size in zip(names, _split(n, n_cities, rng)):
        sites.append(_Site(city, "cloud", _pick(rng, _GEO_GPUS), size))
    regions = {c: NetLink(gbps=_round(_loguniform(rng, 25, 100)), latency_ms=_round(rng.uniform(0.02, 0.1)))
               for c in names}
    links = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            km = _great_circle_km(CITIES[a], CITIES[b])
            latency = min(250.0, max(5.0, km / 200 * rng.uniform(1.3, 1.8) + 1))
            gbps = min(4.0, max(0.02, _loguniform(rng, 0.5, 4.0) * math.exp(-km / 5000)))
            links[tuple(sorted((a, b)))] = NetLink(gbps=_round(gbps), latency_ms=_round(latency))
    return sites, regions, links, None


def _datacenter(n: int, rng: np.random.Generator):
    n_nodes = math.ceil(n / 8)
    sites, regions = [], {}
    for k in range(n_nodes):
        gpu = _pick(rng, _DC_GPUS)
        region = f"node-{k:03d}" if n_nodes > 99 else f"node-{k:02d}"
        sites.append(_Site(region, "cloud", gpu, min(8, n - 8 * k)))
        regions[region] = NetLink(gbps=float(CATALOG[gpu].intra_node_gbps), latency_ms=0.005)
    fabric = NetLink(gbps=float(rng.choice([100, 200, 400])), latency_ms=_round(rng.uniform(0.008, 0.02)))
    return sites, regions, {}, fabric
