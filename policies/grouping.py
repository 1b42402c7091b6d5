"""Device groups for planning: network groups, compute units inside them, and classes of
interchangeable devices.

Network groups (first level). Two devices belong together when (a) they see the rest of
the cluster alike, the largest ratio over every third device k of their bandwidths to k
being at most `NET_RATIO`, and (b) the link between them is within `NET_RATIO` of the
slower of their two fastest links (so two lone devices that are equally far from
everything are not a "group" over a slow link). The distance is the larger of the two
log-ratios; average-linkage hierarchical clustering cut at log(`NET_RATIO`) gives the
groups. This is the profiler's idea (`spantrain.profiler.grouping`) with a maximum in
place of a mean over k, so that one 8-GPU server stays its own group in a 1024-device
data centre (a mean over k dilutes the 14 differing entries among 1022), computed by a
compiled loop that stops at the first differing k, so 1024 devices take well under a
second.

Compute units (second level): inside each network group, devices split by sustained
TFLOP/s with `spantrain.profiler.grouping.compute_groups` (factor 1.3).

Device classes: devices with equal TFLOP/s, memory and links to every other device
(modulo swapping the two) are interchangeable; exhaustive search enumerates up to them.
"""

from __future__ import annotations

import math

import numpy as np

from spantrain.cluster import Cluster
from spantrain.env.jit import cached_njit
from spantrain.env.symmetry import device_classes
from spantrain.profiler.grouping import compute_groups

__all__ = ["NET_RATIO", "network_groups", "compute_units", "device_classes"]

# `device_classes` lives with the plan-space code in env/ (the evaluator needs it); re-exported here.

NET_RATIO = 1.5
"""Bandwidths within this factor count as the same network (measurement noise is 5-15 %)."""


@cached_njit
def _profile_distance(logbw, limit):
    """Pairwise max over k != i, j of |logbw[i, k] - logbw[j, k]|, stopping early at `limit`."""
    n = logbw.shape[0]
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            d = 0.0
            for k in range(n):
                if k in (i, j):
                    continue
                x = abs(logbw[i, k] - logbw[j, k])
                if x > d:
                    d = x
                    if d > limit:
                        break
            out[i, j] = d
            out[j, i] = d
    return out


def network_groups(cluster: Cluster) -> list[list[int]]:
    """Device indices per network group (module docstring), groups in order of first device."""
    n = len(cluster)
    if n == 1:
        return [[0]]
    bw = np.asarray(cluster.bandwidth, dtype=np.float64)
    off = ~np.eye(n, dtype=bool)
    # log of the geometric mean of the two directions, as a mean of logs: the product
    # bw * bw.T under- or overflows for extreme (valid) bandwidths such as 1e-300 Gbit/s
    logbw = np.where(off, 0.5 * (np.log(bw) + np.log(bw.T)), 0.0)
    limit = 2.0 * math.log(NET_RATIO)  # beyond this the exact value does not change the cut
    dist = _profile_distance(logbw, limit)
    best = np.where(off, logbw, -np.inf).max(axis=1)
    direct = np.maximum(0.0, np.minimum(best[:, None], best[None, :]) - logbw)
    np.fill_diagonal(direct, 0.0)
    dist = np.maximum(dist, direct)
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    labels = fcluster(linkage(squareform(dist, checks=False), method="average"), t=math.log(NET_RATIO),
                      criterion="distance")
    groups: dict[int, list[int]] = {}
    for i, label in enumerate(labels.tolist()):
        groups.setdefault(label, []).append(i)
    return list(groups.values())


def compute_units(cluster: Cluster, groups: list[list[int]]) -> list[list[list[int]]]:
    """Per network group, its devices split by compute speed (second level)."""
    tflops = cluster.tflops
    return [compute_groups(tflops, g) for g in groups]
