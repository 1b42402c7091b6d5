"""Interchangeable devices: swapping two of them changes no cost-model figure.

Searches use the classes to enumerate each arrangement of equivalent devices once.
"""

from __future__ import annotations

import numpy as np

from spantrain.cluster import Cluster

__all__ = ["device_classes"]


def device_classes(cluster: Cluster) -> list[int]:
    """A class label per device: equal labels mean interchangeable devices (same TFLOP/s,
    memory, region (hierarchical sync reads it), measured layer times, and the same
    links to every other device, in both directions, with equal links between the two).
    Swaps of interchangeable devices compose, so any relabelling within classes leaves
    every cost-model figure unchanged."""
    n = len(cluster)
    bw = np.asarray(cluster.bandwidth)
    lat = np.asarray(cluster.latency)
    labels = [-1] * n
    reps: dict[tuple, list[tuple[int, int]]] = {}  # attributes -> [(representative, label)]
    count = 0
    for i, d in enumerate(cluster.devices):
        key = (d.tflops, d.memory_gb, d.region, tuple(sorted((k, v.batch, v.forward_s, v.backward_s)
                                                             for k, v in d.layer_times.items())))
        bucket = reps.setdefault(key, [])
        for r, label in bucket:
            if _swappable(bw, i, r) and _swappable(lat, i, r):
                labels[i] = label
                break
        else:
            labels[i] = count
            bucket.append((i, count))
            count += 1
    return labels


def _swappable(a: np.ndarray, i: int, j: int) -> bool:
    """Whether swapping devices i and j leaves matrix `a` unchanged."""
    others = np.ones(len(a), dtype=bool)
    others[[i, j]] = False
    return bool(np.array_equal(a[i, others], a[j, others]) and np.array_equal(a[others, i], a[others, j])
                and a[i, j] == a[j, i])
