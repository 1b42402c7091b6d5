"""Data-parallel sync: collective times over the real links, and their order in time.

Model (alpha-beta per directed device pair: `bandwidth[i, j]` bytes/s, `latency[i, j]` s;
`msg` is the per-message overhead of `spantrain.env.calibration`):

- **Ring all-reduce** of B bytes over n devices in ring order r_0 .. r_{n-1}: 2(n-1)
  steps (reduce-scatter, then all-gather); in each step every device sends B/n bytes to
  its successor, and the step lasts as long as the slowest hop:
  ``2(n-1) * max_i (B/n / bw[r_i, r_i+1] + lat[r_i, r_i+1] + msg)``. On equal links that is
  the textbook ``2(n-1)/n * B/bw + 2(n-1) * lat``. The ring order is chosen by nearest
  neighbour from every start device (cheapest next hop), keeping the ring whose slowest
  hop is fastest; on a cluster of regions this keeps each region's devices together.
- **Hierarchical**: inside each region, reduce to a leader along a chain, pipelined in
  small chunks (``B / slowest hop bandwidth + sum of hop latencies``); ring all-reduce
  among the leaders; broadcast back along the chain the same way. Regions work in
  parallel, so each phase lasts as long as its slowest region. The leader is the member
  with the most bandwidth towards the other regions' holders. With a single region it is
  a plain ring.
- **Local SGD**: a ring all-reduce of the parameters every `period` iterations.

Contention: a device's link is one resource. Collectives that share a device run one
after another, in backward order (last layers first, as backward produces their
gradients first, like DDP's buckets; in layer order for a runtime that syncs after the
whole schedule, ``Calibration.sync_overlap`` false); the last of them finishes when it would under
fair bandwidth sharing, at a fraction of the cost of simulating sharing. The order is
fixed rather than by ready time so that a slower link or device can never reorder the
collectives into a faster sequence (the model stays monotone). Collectives on disjoint devices run concurrently; two
collectives can only share a link (a device pair) if they share its devices, so shared
links are covered. Pipeline point-to-point traffic is not counted against sync traffic.

The compiled versions (`_ring`, `_chain`, `_collective`, `_serialize`, allocation-free)
live in `spantrain.env.kernel` with every other compiled function; the functions here
wrap them for Python callers.
"""

from __future__ import annotations

import numpy as np

from spantrain.env.kernel import _collective, _ring, _serialize

__all__ = ["SYNC_CODES", "ring_order", "ring_time", "hierarchical_time", "collective_time",
           "schedule_collectives"]

SYNC_CODES = {"allreduce": 0, "hierarchical": 1, "local-sgd": 2}
"""Integer codes the kernels use for `spantrain.plan.SYNC_MODES`."""

# ---- public entry points -------------------------------------------------------------------------


def _work(nodes, extra: int = 6) -> tuple[np.ndarray, int]:
    """An int workspace holding `nodes` first, then room for `extra` x n scratch."""
    nodes = np.asarray(nodes, dtype=np.int64).reshape(-1)
    n = nodes.shape[0]
    w = np.zeros(n + extra * max(n, 1), np.int64)
    w[:n] = nodes
    return w, n


def _links(bw, lat) -> np.ndarray:
    return np.ascontiguousarray(np.stack([np.asarray(bw, dtype=np.float64), np.asarray(lat, dtype=np.float64)]))


def ring_order(nodes, chunk, bw, lat, msg):
    """Nearest-neighbour ring over `nodes` for `chunk`-byte steps: (order, step seconds)."""
    w, n = _work(nodes)
    step = _ring(_links(bw, lat), float(msg), w, 0, n, float(chunk), n, 3 * n)
    return w[3 * n:4 * n].copy(), step


def ring_time(nodes, nbytes, bw, lat, msg) -> float:
    """Seconds of a ring all-reduce of `nbytes` over `nodes` (0 for one node)."""
    w, n = _work(nodes)
    return _collective(0, _links(bw, lat), float(msg), np.zeros(1, np.int64), w, 0, n, float(nbytes), n)


def hierarchical_time(nodes, nbytes, bw, lat, msg, region) -> float:
    """Seconds of the hierarchical all-reduce (module docstring) of `nbytes` over `nodes`."""
    return collective_time(1, nodes, nbytes, bw, lat, msg, region)


def collective_time(mode, nodes, nbytes, bw, lat, msg, region) -> float:
    """Seconds of one collective of `mode` (a `SYNC_CODES` value) over `nodes`."""
    w, n = _work(nodes)
    return _collective(int(mode), _links(bw, lat), float(msg), np.ascontiguousarray(region, dtype=np.int64), w, 0,
                       n, float(nbytes), n)


def schedule_collectives(ready, duration, members, n_devices, ascending=False):
    """Start and end of each collective when those sharing a device run one after another,
    last group first (groups are in layer order), or first group first when `ascending` (as
    spantrain's runtime visits them after the schedule). `members[g]` lists group g's
    devices (-1 pads); a collective starts when it is ready and all its devices are free."""
    ready = np.ascontiguousarray(ready, dtype=np.float64)
    members = np.ascontiguousarray(members, dtype=np.int64)
    G = ready.shape[0]
    start = np.zeros(G)
    end = np.zeros(G)
    _serialize(ready, np.ascontiguousarray(duration, dtype=np.float64), members, G, members.shape[1],
               np.zeros(int(n_devices)), start, end, bool(ascending))
    return start, end
