"""Grouping devices: by network first, then by compute inside each network group.

Network: two devices belong together when they see the rest of the cluster alike. The
distance between i and j is the mean, over every third device k, of
``|log bw(i, k) - log bw(j, k)|`` (bw: geometric mean of both directions). Devices of one
region are fast to each other and equally slow to the others, so their rows agree; it
also separates two regions whose LANs are as fast as each other but slow between them.
Average-linkage hierarchical clustering (scipy) cut at a factor `NET_RATIO` (1.5) in
bandwidth keeps the measurement's ~5-15 % noise inside a group and the >= 2x steps
between real regions outside it.

Compute: inside each network group, the same clustering on log TFLOP/s cut at a factor
`COMPUTE_RATIO` (1.3).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["NET_RATIO", "COMPUTE_RATIO", "network_groups", "compute_groups"]

NET_RATIO = 1.5
COMPUTE_RATIO = 1.3


def _cluster(dist: np.ndarray, threshold: float) -> list[int]:
    """Average-linkage clusters of a square distance matrix cut at `threshold`; labels by first appearance."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    n = len(dist)
    if n < 2:
        return [0] * n
    raw = fcluster(linkage(squareform(dist, checks=False), method="average"), t=threshold, criterion="distance")
    order: dict[int, int] = {}
    return [order.setdefault(int(x), len(order)) for x in raw]


def network_groups(bandwidth: np.ndarray) -> list[int]:
    """A group label per device from a directed bandwidth matrix (diagonal ignored)."""
    n = len(bandwidth)
    sym = np.sqrt(bandwidth * bandwidth.T)
    logbw = np.log(np.where(np.eye(n, dtype=bool), 1.0, sym))
    dist = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            others = [k for k in range(n) if k not in (i, j)]
            d = float(np.mean(np.abs(logbw[i, others] - logbw[j, others]))) if others else 0.0
            dist[i, j] = dist[j, i] = d
    return _cluster(dist, math.log(NET_RATIO))


def compute_groups(tflops: np.ndarray, members: list[int]) -> list[list[int]]:
    """Members of one network group split by sustained TFLOP/s."""
    logt = np.log(np.asarray([tflops[m] for m in members], dtype=float))
    labels = _cluster(np.abs(logt[:, None] - logt[None, :]), math.log(COMPUTE_RATIO))
    groups: dict[int, list[int]] = {}
    for m, label in zip(members, labels):
        groups.setdefault(label, []).append(m)
    return list(groups.values())
