"""Per-region figures of a cluster, vectorized: devices of each region, median links between regions."""

from __future__ import annotations

import numpy as np

from spantrain.cluster import GBPS, Cluster

__all__ = ["RegionStats", "region_groups", "region_pair_stats", "region_stats", "strongest_pairs"]

_CHUNK = 1 << 22  # matrix entries gathered at once: a block of all 4,096 devices was 2 x 134 MB


def region_groups(cluster: Cluster) -> list[np.ndarray]:
    """Device positions of each region, in the order of `cluster.regions` (devices in spec order)."""
    idx = cluster.region_index
    order = np.argsort(idx, kind="stable")
    return np.split(order, np.cumsum(np.bincount(idx, minlength=len(cluster.regions)))[:-1])


RegionStats = tuple[list[np.ndarray], np.ndarray, np.ndarray]
"""(devices of each region, median Gbit/s and ms between regions): what every view of a
cluster's regions reads (`region_stats`)."""


def region_stats(cluster: Cluster) -> RegionStats:
    """`region_groups` and `region_pair_stats` at once, for views that share them."""
    groups = region_groups(cluster)
    return (groups, *region_pair_stats(cluster, groups))


def region_pair_stats(cluster: Cluster, groups: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Median bandwidth (Gbit/s) and latency (ms) between every pair of regions; on the diagonal,
    inside the region (its spec figure when it holds one device)."""
    groups = region_groups(cluster) if groups is None else groups
    r = len(groups)
    bw, lat = np.empty((r, r)), np.empty((r, r))
    # regions of one size at a time: their blocks stack into one array, one median call per size pair
    sizes = np.array([len(g) for g in groups])
    classes = [(int(s), np.nonzero(sizes == s)[0]) for s in np.unique(sizes)]
    members = {s: np.stack([groups[k] for k in ks]) for s, ks in classes}
    for s, ka in classes:
        for t, kb in classes:
            gb = members[t]
            step = max(1, _CHUNK // max(1, len(kb) * s * t))
            for lo in range(0, len(ka), step):
                ga = members[s][lo:lo + step]
                rows, cols = ga[:, None, :, None], gb[None, :, None, :]
                shape = (len(ga), len(kb), s * t)
                bw[np.ix_(ka[lo:lo + step], kb)] = np.median(cluster.bandwidth[rows, cols].reshape(shape), axis=-1)
                lat[np.ix_(ka[lo:lo + step], kb)] = np.median(cluster.latency[rows, cols].reshape(shape), axis=-1)
    bw /= GBPS
    lat *= 1e3
    for s, ks in classes:  # inside a region: its device pairs, not a device with itself
        if s == 1:
            for k in ks:
                link = cluster.network.regions[cluster.devices[groups[k][0]].region]
                bw[k, k], lat[k, k] = link.gbps, link.latency_ms
            continue
        g = members[s]
        off = ~np.eye(s, dtype=bool)
        rows, cols = g[:, :, None], g[:, None, :]
        bw[ks, ks] = np.median(cluster.bandwidth[rows, cols][:, off], axis=-1) / GBPS
        lat[ks, ks] = np.median(cluster.latency[rows, cols][:, off], axis=-1) * 1e3
    return bw, lat


def strongest_pairs(bw: np.ndarray, lat: np.ndarray, per_region: int, limit: int) -> np.ndarray:
    """Region pairs (a < b) to draw when all are too many: each region's `per_region` fastest
    links (then lowest latency, then nearest in region order), at most `limit` in all, fastest kept.
    Returns (k, 2) positions, slowest first (so the fastest are drawn on top)."""
    r = len(bw)
    a_idx, b_idx = np.indices((r, r))
    ring = np.minimum(abs(a_idx - b_idx), r - abs(a_idx - b_idx))
    key_bw = np.where(a_idx == b_idx, -np.inf, bw)
    k = min(per_region, r - 1)
    # lexsort's last key is the primary one: bandwidth (descending), then latency, then ring distance
    best = np.lexsort((ring, lat, -key_bw), axis=1)[:, :k]
    pairs = np.stack([np.repeat(np.arange(r), k), best.ravel()], axis=1)
    pairs = np.unique(np.sort(pairs, axis=1), axis=0)
    a, b = pairs[:, 0], pairs[:, 1]
    order = np.lexsort((ring[a, b], lat[a, b], -bw[a, b]))[:limit]
    return pairs[order[::-1]]
