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
gradients first, like DDP's buckets); the last of them finishes when it would under
fair bandwidth sharing, at a fraction of the cost of simulating sharing. The order is
fixed rather than by ready time so that a slower link or device can never reorder the
collectives into a faster sequence (the model stays monotone). Collectives on disjoint devices run concurrently; two
collectives can only share a link (a device pair) if they share its devices, so shared
links are covered. Pipeline point-to-point traffic is not counted against sync traffic.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["SYNC_CODES", "ring_order", "ring_time", "chain_time", "hierarchical_time", "collective_time",
           "schedule_collectives"]

SYNC_CODES = {"allreduce": 0, "hierarchical": 1, "local-sgd": 2}
"""Integer codes the kernels use for `spantrain.plan.SYNC_MODES`."""

_INF = np.inf


@njit(cache=True)
def ring_order(nodes, chunk, bw, lat, msg):
    """Nearest-neighbour ring over `nodes` for `chunk`-byte steps: (order, step seconds)."""
    n = nodes.shape[0]
    best = np.empty(n, np.int64)
    best_step = _INF
    cur_order = np.empty(n, np.int64)
    used = np.zeros(n, np.bool_)
    for s0 in range(n):
        used[:] = False
        used[s0] = True
        cur_order[0] = nodes[s0]
        cur = s0
        step = 0.0
        for k in range(1, n):
            nxt = -1
            cost = _INF
            for j in range(n):
                if not used[j]:
                    c = chunk / bw[nodes[cur], nodes[j]] + lat[nodes[cur], nodes[j]] + msg
                    if c < cost:
                        cost = c
                        nxt = j
            used[nxt] = True
            cur_order[k] = nodes[nxt]
            cur = nxt
            if cost > step:
                step = cost
        if n > 1:
            c = chunk / bw[nodes[cur], nodes[s0]] + lat[nodes[cur], nodes[s0]] + msg
            if c > step:
                step = c
        if step < best_step:
            best_step = step
            best[:] = cur_order
    return best, best_step


@njit(cache=True)
def ring_time(nodes, nbytes, bw, lat, msg):
    """Seconds of a ring all-reduce of `nbytes` over `nodes` (0 for one node)."""
    n = nodes.shape[0]
    if n < 2:
        return 0.0
    _, step = ring_order(nodes, nbytes / n, bw, lat, msg)
    return 2.0 * (n - 1) * step


@njit(cache=True)
def chain_time(nodes, leader, nbytes, bw, lat, msg):
    """(reduce-to-leader, broadcast-from-leader) seconds along a nearest-neighbour chain
    from `leader` (an index into `nodes`), pipelined in small chunks."""
    n = nodes.shape[0]
    if n < 2:
        return 0.0, 0.0
    used = np.zeros(n, np.bool_)
    used[leader] = True
    cur = leader
    min_up = _INF  # towards the leader (reduce)
    min_down = _INF  # away from it (broadcast)
    lat_up = 0.0
    lat_down = 0.0
    for _ in range(n - 1):
        nxt = -1
        cost = _INF
        for j in range(n):
            if not used[j]:
                c = nbytes / bw[nodes[cur], nodes[j]] + lat[nodes[cur], nodes[j]]
                if c < cost:
                    cost = c
                    nxt = j
        used[nxt] = True
        a, z = nodes[cur], nodes[nxt]
        min_down = min(min_down, bw[a, z])
        min_up = min(min_up, bw[z, a])
        lat_down += lat[a, z] + msg
        lat_up += lat[z, a] + msg
        cur = nxt
    return nbytes / min_up + lat_up, nbytes / min_down + lat_down


@njit(cache=True)
def hierarchical_time(nodes, nbytes, bw, lat, msg, region):
    """Seconds of the hierarchical all-reduce (module docstring) of `nbytes` over `nodes`."""
    n = nodes.shape[0]
    if n < 2:
        return 0.0
    regs = np.empty(n, np.int64)
    nreg = 0
    for i in range(n):
        r = region[nodes[i]]
        seen = False
        for q in range(nreg):
            if regs[q] == r:
                seen = True
        if not seen:
            regs[nreg] = r
            nreg += 1
    if nreg == 1:
        return ring_time(nodes, nbytes, bw, lat, msg)
    leaders = np.empty(nreg, np.int64)
    t_reduce = 0.0
    t_bcast = 0.0
    for q in range(nreg):
        cnt = 0
        for i in range(n):
            if region[nodes[i]] == regs[q]:
                cnt += 1
        members = np.empty(cnt, np.int64)
        cnt = 0
        for i in range(n):
            if region[nodes[i]] == regs[q]:
                members[cnt] = nodes[i]
                cnt += 1
        lead = 0
        best = -1.0
        for i in range(cnt):
            tot = 0.0
            for j in range(n):
                if region[nodes[j]] != regs[q]:
                    tot += bw[members[i], nodes[j]]
            if tot > best:
                best = tot
                lead = i
        leaders[q] = members[lead]
        up, down = chain_time(members, lead, nbytes, bw, lat, msg)
        t_reduce = max(t_reduce, up)
        t_bcast = max(t_bcast, down)
    return t_reduce + ring_time(leaders, nbytes, bw, lat, msg) + t_bcast


@njit(cache=True)
def collective_time(mode, nodes, nbytes, bw, lat, msg, region):
    """Seconds of one collective of `mode` (a `SYNC_CODES` value) over `nodes`."""
    if mode == 1:
        return hierarchical_time(nodes, nbytes, bw, lat, msg, region)
    return ring_time(nodes, nbytes, bw, lat, msg)


@njit(cache=True)
def schedule_collectives(ready, duration, members, n_devices):
    """Start and end of each collective when those sharing a device run one after another,
    last group first (groups are in layer order). `members[g]` lists group g's devices
    (-1 pads); a collective starts when it is ready and all its devices are free."""
    G = ready.shape[0]
    free = np.zeros(n_devices)
    start = np.zeros(G)
    end = np.zeros(G)
    for q in range(G):
        g = G - 1 - q
        st = ready[g]
        for j in range(members.shape[1]):
            d = members[g, j]
            if d >= 0 and free[d] > st:
                st = free[d]
        en = st + duration[g]
        for j in range(members.shape[1]):
            d = members[g, j]
            if d >= 0:
                free[d] = en
        start[g] = st
        end[g] = en
    return start, end
