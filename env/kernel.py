"""The compiled estimate of one plan, over flat arrays (the fast path of `CostModel`).

A plan arrives flattened: pipeline p owns stages ``pipe_ptr[p] .. pipe_ptr[p+1]-1``;
stage g runs layers ``[stage_a[g], stage_b[g])`` on device ``stage_dev[g]``. Per-device
compute is given as per-sample prefix sums over layers (``tf[d, k]`` = seconds of
layers [0, k) forward for one sample on device d; likewise B and W), so a stage's op
time is one subtraction times the micro-batch size.

What the kernel computes, in order:

1. per stage: F, B, W and fused-backward seconds; the boundary transfers to the next
   stage (occupancy bytes/bandwidth + overhead, then latency, per direction);
2. per pipeline: the schedule's order and its exact timing (`spantrain.env.schedules`),
   makespan, steady-state period, bubble fraction (1 - busy / (stages x period)),
   per-stage first-op start and last-op end
   and peak micro-batches in flight (F to W) read off the order;
3. per stage: memory = params x state bytes + in-flight x micro-batch x activation
   bytes + working buffers + reserve. Working buffers: a receive and a send buffer for
   the incoming activation and the outgoing gradient, and for the outgoing activation
   and the incoming gradient (2 x m x (input + output boundary bytes)), plus one layer's
   activations as transient workspace for the op being computed (m x the stage's largest
   per-layer activation);
4. sync: layers are grouped by the exact set of devices holding them across pipelines
   (intervals between every pipeline's stage boundaries); each group is one collective
   of its parameters' gradient bytes (`spantrain.env.collectives`), ready when the last
   op on every holder's stage has finished (the end of its last W or fused backward:
   gradients are complete only then), serialized per device in backward order;
5. iteration = slowest pipeline + exposed sync + slowest optimizer step. A pipeline's
   time is its steady-state period (`spantrain.env.schedules.period`: stages start
   their next iteration when they are done, so for ZB-H2 it is shorter than the
   makespan). A stage can start its next iteration only once the collectives of its
   layers have ended, so the pace is set by max over stages of (last collective end -
   first op start); exposed sync is how much that exceeds the slowest pipeline. For
   local SGD the parameter average follows the step: its whole time divided by the
   period is exposed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from spantrain.env.calibration import C_GRAD, C_MEMBW, C_MSG, C_OP, C_OPT, C_RESERVED, C_STATE
from spantrain.env.collectives import collective_time, schedule_collectives
from spantrain.env.schedules import best_order

__all__ = ["evaluate_plan", "sync_groups", "STAGE_COLUMNS", "SCALARS"]

STAGE_COLUMNS = ("f_s", "b_s", "w_s", "end_s", "in_flight", "memory_bytes", "optimizer_s", "start_s",
                 "sync_done_s")
"""Columns of the per-stage output array."""
SCALARS = ("iteration_s", "pipeline_max_s", "sync_alone_s", "exposed_comm_s", "optimizer_s")
"""Entries of the scalar output array."""


@njit(cache=True)
def sync_groups(pipe_ptr, stage_a, stage_b, stage_dev, n_layers):
    """Layer intervals held by the same devices in every pipeline.

    Returns (lo, hi, holder_stage): group g covers layers [lo[g], hi[g]); holder_stage[g, p]
    is the flat index of the stage of pipeline p that holds them.
    """
    P = pipe_ptr.shape[0] - 1
    cuts = np.unique(stage_a)
    G = cuts.shape[0]
    lo = cuts.copy()
    hi = np.empty(G, np.int64)
    for g in range(G - 1):
        hi[g] = cuts[g + 1]
    hi[G - 1] = n_layers
    holder = np.empty((G, P), np.int64)
    for p in range(P):
        g0 = pipe_ptr[p]
        cur = g0
        for g in range(G):
            while stage_b[cur] <= lo[g]:
                cur += 1
            holder[g, p] = cur
    return lo, hi, holder


@njit(cache=True)
def evaluate_plan(tf, tb, tw, bb, pp, pa, act, flops, bw, lat, region,
                  pipe_ptr, stage_dev, stage_a, stage_b, mbs, nmb, code, sync_code, period, calib,
                  known, known_stage, known_pipe):
    """Estimate a flattened plan (module docstring). Returns (stage_out, pipe_out, scalars):
    stage_out columns `STAGE_COLUMNS`, pipe_out columns (makespan_s, bubble_fraction,
    period_s), scalars `SCALARS`.

    Pipelines with ``known[p]`` are not simulated again: their stages' (end_s, in_flight,
    start_s) come from ``known_stage[g]`` and their (makespan, bubble, period) from
    ``known_pipe[p]`` (a memo of earlier results for the same devices, layers and
    micro-batching)."""
    P = pipe_ptr.shape[0] - 1
    NS = stage_dev.shape[0]
    L = bb.shape[0]
    op = calib[C_OP]
    msg = calib[C_MSG]
    stage_out = np.zeros((NS, 9))
    pipe_out = np.zeros((P, 3))
    pipe_max = 0.0
    opt_max = 0.0
    for p in range(P):
        g0 = pipe_ptr[p]
        S = pipe_ptr[p + 1] - g0
        m = float(mbs[p])
        M = nmb[p]
        f = np.empty(S)
        b = np.empty(S)
        w = np.empty(S)
        bwf = np.empty(S)
        cfo = np.zeros(max(S - 1, 1))
        cfl = np.zeros(max(S - 1, 1))
        cbo = np.zeros(max(S - 1, 1))
        cbl = np.zeros(max(S - 1, 1))
        for s in range(S):
            g = g0 + s
            d = stage_dev[g]
            a = stage_a[g]
            z = stage_b[g]
            db = tb[d, z] - tb[d, a]
            dw = tw[d, z] - tw[d, a]
            f[s] = m * (tf[d, z] - tf[d, a]) + op
            b[s] = m * db + op
            w[s] = m * dw + op
            bwf[s] = m * (db + dw) + op
            if s < S - 1:
                e = stage_dev[g + 1]
                nbytes = m * bb[z - 1]
                cfo[s] = nbytes / bw[d, e] + msg
                cfl[s] = lat[d, e]
                cbo[s] = nbytes / bw[e, d] + msg
                cbl[s] = lat[e, d]
        if known[p]:
            makespan = known_pipe[p, 0]
            pipe_out[p, 1] = known_pipe[p, 1]
            pipe_out[p, 2] = known_pipe[p, 2]
            for s in range(S):
                stage_out[g0 + s, 3] = known_stage[g0 + s, 0]
                stage_out[g0 + s, 4] = known_stage[g0 + s, 1]
                stage_out[g0 + s, 7] = known_stage[g0 + s, 2]
        else:
            kind, _, start, end, per = best_order(code, M, f, b, w, bwf, cfo, cfl, cbo, cbl)
            K = kind.shape[1]
            makespan = 0.0
            busy = 0.0
            for s in range(S):
                inflight = 0
                peak = 0
                for j in range(K):
                    busy += end[s, j] - start[s, j]
                    if kind[s, j] == 0:
                        inflight += 1
                        if inflight > peak:
                            peak = inflight
                    elif kind[s, j] >= 2:
                        inflight -= 1
                stage_out[g0 + s, 3] = end[s, K - 1]
                stage_out[g0 + s, 4] = peak
                stage_out[g0 + s, 7] = start[s, 0]
                if end[s, K - 1] > makespan:
                    makespan = end[s, K - 1]
            pipe_out[p, 1] = 1.0 - busy / (S * per) if per > 0 else 0.0
            pipe_out[p, 2] = per
        for s in range(S):
            g = g0 + s
            peak = stage_out[g, 4]
            d = stage_dev[g]
            a = stage_a[g]
            z = stage_b[g]
            params = pp[z] - pp[a]
            in_b = bb[a - 1] if a > 0 else 0.0
            out_b = bb[z - 1] if z < L else 0.0
            big = 0.0
            for k in range(a, z):
                if act[k] > big:
                    big = act[k]
            mem = (params * calib[C_STATE] + peak * m * (pa[z] - pa[a]) + 2.0 * m * (in_b + out_b)
                   + m * big + calib[C_RESERVED])
            opt = params * calib[C_OPT] / (flops[d] * calib[C_MEMBW])
            if opt > opt_max:
                opt_max = opt
            stage_out[g, 0] = f[s]
            stage_out[g, 1] = b[s]
            stage_out[g, 2] = w[s]
            stage_out[g, 5] = mem
            stage_out[g, 6] = opt
        pipe_out[p, 0] = makespan
        if pipe_out[p, 2] > pipe_max:
            pipe_max = pipe_out[p, 2]

    sync_alone = 0.0
    for g in range(NS):
        stage_out[g, 8] = stage_out[g, 3]
    if P > 1:
        lo, hi, holder = sync_groups(pipe_ptr, stage_a, stage_b, stage_dev, L)
        G = lo.shape[0]
        ready = np.zeros(G)
        dur = np.zeros(G)
        members = np.empty((G, P), np.int64)
        nodes = np.empty(P, np.int64)
        mode = 0 if sync_code == 2 else sync_code
        for g in range(G):
            r = 0.0
            for p in range(P):
                nodes[p] = stage_dev[holder[g, p]]
                members[g, p] = nodes[p]
                if stage_out[holder[g, p], 3] > r:
                    r = stage_out[holder[g, p], 3]
            ready[g] = r
            dur[g] = collective_time(mode, nodes, (pp[hi[g]] - pp[lo[g]]) * calib[C_GRAD], bw, lat, msg, region)
        n_dev = flops.shape[0]
        _, end_alone = schedule_collectives(np.zeros(G), dur, members, n_dev)
        sync_alone = end_alone.max()
        if sync_code != 2:
            _, end_ov = schedule_collectives(ready, dur, members, n_dev)
            for g in range(G):
                for p in range(P):
                    h = holder[g, p]
                    if end_ov[g] > stage_out[h, 8]:
                        stage_out[h, 8] = end_ov[g]
    # a stage repeats every (its span + the wait for its gradients' sync); the slowest sets the pace
    cycle = pipe_max
    for g in range(NS):
        c = stage_out[g, 8] - stage_out[g, 7]
        if c > cycle:
            cycle = c
    if sync_code == 2:
        exposed = sync_alone / period
    else:
        exposed = cycle - pipe_max
    scalars = np.empty(5)
    scalars[0] = pipe_max + exposed + opt_max
    scalars[1] = pipe_max
    scalars[2] = sync_alone
    scalars[3] = exposed
    scalars[4] = opt_max
    return stage_out, pipe_out, scalars
