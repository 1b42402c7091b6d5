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
5. iteration = slowest pipeline + exposed sync + slowest optimizer step (+ the
   per-iteration overhead). A pipeline's time is its steady-state period
   (`spantrain.env.schedules.period`: stages start their next iteration when they are
   done, so for ZB-H2 it is shorter than the makespan). A stage can start its next
   iteration only once the collectives of its layers have ended, so the pace is set by
   max over stages of (last collective end - first op start); exposed sync is how much
   that exceeds the slowest pipeline. For local SGD the parameter average follows the
   step, and that iteration cannot overlap the next (it lasts the slowest makespan, not the
   period): the average's whole time and that difference, divided by the period, are exposed.

With ``Calibration.sync_overlap`` false (spantrain's runtime: every rank runs its whole
schedule, then its collectives, then its optimizer step, and all ranks meet at the end
of the iteration) steps 4 and 5 become: collectives are ready when all their holders'
schedules have ended and run per device in layer order (the order every rank visits its
holder groups); stage g is done at ``its last collective's end (or its schedule's end) +
its optimizer step + the iteration overhead``, and the iteration lasts until the last
stage is done (all pipelines start together, so no ZB-H2 steady-state gain). Local SGD
with period H > 1 syncs (`Calibration.local_sgd_bytes_per_param` per parameter) once in
H iterations: iteration = plain + (syncing - plain) / H.

Compute ops pay ``op_overhead_s + op_overhead_flops / device FLOP/s`` each (a fused
backward once, a split one twice); a split backward's B and W cost their FLOP shares of
the fused backward times ``split_input_grad_factor`` / ``split_weight_grad_factor``.

Speed (the cold path, every pipeline simulated, is what the RL environment and the
planners mostly pay for):

- `evaluate` is the entry `CostModel` calls, with the model's arrays packed into a few
  (`pack_model`) so a call passes few arguments, writing into an output buffer the caller
  may reuse (`out_size`, `split_out`), memo records included (`memo_record`);
- one call allocates two flat workspaces once and simulates every candidate order of
  every pipeline in place (`_best`: the 1F1B order with B and W split, the greedy);
- the simulations' loops call no other compiled function (a call passing arrays costs
  atomic reference counting), keep the deciding stage's state in locals while it keeps
  the turn, and index with unsigned integers (no negative-index wraparound code);
- collectives allocate nothing (node lists and scratch are slices of one int array).

Every compiled function of the cost model is in this module: numba's cache checks only
the file that defines a function, so a compiled callee in another module could be
served stale after an edit there. `evaluate_plan` keeps the unpacked signature.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from spantrain.env.calibration import (
    C_GRAD,
    C_ITF,
    C_LSGD,
    C_MEMBW,
    C_MSG,
    C_OP,
    C_OPF,
    C_OPT,
    C_OVERLAP,
    C_RESERVED,
    C_SPB,
    C_SPW,
    C_STATE,
)
from spantrain.env.jit import cached_njit

__all__ = ["evaluate_plan", "evaluate", "plan_ints", "plan_views", "out_size", "workspace_size",
           "memo_record", "split_out", "pack_model", "sync_groups", "STAGE_COLUMNS", "SCALARS",
           "SCREEN_FROM"]

STAGE_COLUMNS = ("f_s", "b_s", "w_s", "end_s", "in_flight", "memory_bytes", "optimizer_s", "start_s",
                 "sync_done_s")
"""Columns of the per-stage output array."""
SCALARS = ("iteration_s", "pipeline_max_s", "sync_alone_s", "exposed_comm_s", "optimizer_s", "samples_per_s",
           "feasible")
"""Entries of the scalar output array (`feasible` is 1.0 or 0.0: every stage fits its
device's memory; `samples_per_s` is 0 for an infeasible plan, as in `Estimate`)."""

_INF = np.inf
SCREEN_FROM = 2160
"""Screening (`evaluate`'s ``screen``) extrapolates pipelines of this many micro-batches or
more from simulations of `_SCREEN_A` and `_SCREEN_A` + `_SCREEN_D`."""
_SCREEN_A = 240
_SCREEN_D = 840
"""A multiple of every steady-state cycle of up to 8 micro-batches (lcm(1..8)): timings
repeat with such cycles, and a difference over whole cycles is their exact slope."""
_u = np.uint64  # array indices known >= 0: no negative-index wraparound code


# ---- pipeline schedules (`spantrain.env.schedules`) -------------------------------------------
#
# The kernels work in two flat workspaces, so that their loops keep few base pointers in
# registers (numba passes every array as a struct of pointer, shape and strides; a loop
# over a dozen arrays spills them and runs several times slower):
#
# - ``x`` (float64): a record of `_FR` values per stage (op seconds, the outgoing links,
#   and the scheduler's clock), then message arrival times fa / ga (S x M each), then for
#   each of two candidate orders its channels (forward, backward) and each stage's peak
#   micro-batches held between F and W (S each; the peaks right after the backward
#   channels: the greedy tallies them as it goes, `_best` writes the fixed orders'
#   closed form), and op start / end times (S x K each);
# - ``n`` (int64): a record of `_IR` counters per stage, then for each candidate its op
#   kinds and micro-batches (S x K each).
#
# `_offsets` gives where each part starts for workspaces sized by `_workspace`; inside a
# part, stage s row j is at ``s * K + j`` (or ``s * M + k``). `evaluate` allocates one
# workspace per plan and simulates every candidate of every pipeline in it.

_FR = 10
_F, _B, _W, _BWF, _CFO, _CFL, _CBO, _CBL, _TFREE, _EV = range(_FR)
"""Float record per stage: F, B, W, fused backward seconds; occupancy and latency of the
link to the next stage (forward) and from it (backward); when the stage is free; its
next event (greedy)."""
_IR = 8
_NF, _NB, _NW, _LASTB, _WAIT, _LIMFB, _LIMTOT, _POS = range(_IR)
"""Int record per stage: F, B, W ops done; last F-or-B was a B; waiting for a message;
memory bounds (F to B, F to W); next position in a fixed order."""


@cached_njit
def _workspace(S, M):
    """Sizes (floats, ints) of the workspaces for pipelines of up to S stages, M micro-batches."""
    K = 3 * M
    return S * _FR + 2 * S * M + 6 * S + 4 * S * K, S * _IR + 4 * S * K


@cached_njit
def _offsets(S, M, c):
    """(fa, ga, chf, chb, start, end, kind, mb) offsets of candidate c in workspaces sized
    by `_workspace(S, M)`."""
    K = 3 * M
    fa = S * _FR
    ga = fa + S * M
    ch = ga + S * M + 3 * S * c  # chf, chb, then the peaks held (S each)
    t = ga + S * M + 6 * S + 2 * S * K * c
    kd = S * _IR + 2 * S * K * c
    return fa, ga, ch, ch + S, t, t + S * K, kd, kd + S * K


@cached_njit
def _fill_fixed(code, S, M, split, n, kd0, mb0):
    """Write the gpipe (code 0) or 1f1b (code 1) order: K = 2M ops per stage with fused
    backwards, 3M when `split` (B then W at once)."""
    K = 3 * M if split else 2 * M
    for s in range(S):
        warm = M if code == 0 else min(S - s - 1, M)
        j = kd0 + s * K
        i = mb0 + s * K
        for k in range(warm):
            n[_u(j)] = 0
            n[_u(i)] = k
            j += 1
            i += 1
        for k in range(warm, M + warm):  # steady 1F1B, then the drain
            nb = k - warm
            if k < M:
                n[_u(j)] = 0
                n[_u(i)] = k
                j += 1
                i += 1
            if split:
                n[_u(j)] = 1
                n[_u(i)] = nb
                n[_u(j + 1)] = 2
                n[_u(i + 1)] = nb
                j += 2
                i += 2
            else:
                n[_u(j)] = 3
                n[_u(i)] = nb
                j += 1
                i += 1


@cached_njit
def _simulate(S, K, M, x, n, fa0, ga0, chf0, chb0, t0, e0, kd0, mb0):
    """`simulate_order` in the workspaces (op times of the order at kd0 / mb0 go to t0 /
    e0). Stages are swept alternately forwards and backwards, each running its ops until
    one waits for a message; the times do not depend on the sweep order (each channel
    carries one stage's messages, in that stage's order)."""
    for s in range(S):
        for k in range(M):
            x[_u(fa0 + s * M + k)] = 0.0 if s == 0 else _INF
            x[_u(ga0 + s * M + k)] = _INF
        n[_u(s * _IR + _POS)] = 0
        x[_u(s * _FR + _TFREE)] = 0.0
        x[_u(chf0 + s)] = 0.0
        x[_u(chb0 + s)] = 0.0
    remaining = S * K
    sweep = 0
    while remaining > 0:
        progressed = False
        for i in range(S):
            s = i if sweep % 2 == 0 else S - 1 - i
            r = s * _FR
            row = s * K
            j = n[_u(s * _IR + _POS)]
            j0 = j
            tf = x[_u(r + _TFREE)]
            while j < K:
                op = n[_u(kd0 + row + j)]
                k = n[_u(mb0 + row + j)]
                if op == 0:
                    dep = x[_u(fa0 + s * M + k)]
                    dur = x[_u(r + _F)]
                elif op == 2:
                    dep = 0.0
                    dur = x[_u(r + _W)]
                else:
                    dep = x[_u(ga0 + s * M + k)]
                    dur = x[_u(r + _B)] if op == 1 else x[_u(r + _BWF)]
                if dep == _INF:
                    break
                st = tf if tf > dep else dep
                en = st + dur
                x[_u(t0 + row + j)] = st
                x[_u(e0 + row + j)] = en
                tf = en
                j += 1
                if op == 0:
                    if s < S - 1:
                        c = x[_u(chf0 + s)]
                        y = (en if en > c else c) + x[_u(r + _CFO)]
                        x[_u(chf0 + s)] = y
                        x[_u(fa0 + (s + 1) * M + k)] = y + x[_u(r + _CFL)]
                    else:
                        x[_u(ga0 + s * M + k)] = en
                elif op != 2 and s > 0:
                    q = r - _FR
                    c = x[_u(chb0 + s - 1)]
                    y = (en if en > c else c) + x[_u(q + _CBO)]
                    x[_u(chb0 + s - 1)] = y
                    x[_u(ga0 + (s - 1) * M + k)] = y + x[_u(q + _CBL)]
            if j > j0:
                progressed = True
                remaining -= j - j0
                n[_u(s * _IR + _POS)] = j
                x[_u(r + _TFREE)] = tf
        sweep += 1
        if not progressed:
            raise ValueError("pipeline order deadlocks")


@cached_njit
def _greedy(S, M, x, n, fa0, ga0, chf0, chb0, t0, e0, kd0, mb0):
    """`zb_greedy` in the workspaces (stage records hold times and bounds; the order goes
    to kd0 / mb0, its times to t0 / e0).

    An event loop over the stages: a stage's ``_EV`` is when it next decides (INF while
    it waits for a message whose time is unknown); the earliest decides, ties to the
    lowest stage. A send recomputes the receiver's wake time if it waits (which can only
    bring it forward). The deciding stage keeps the turn, its state in local variables,
    while its next decision is still the earliest; other stages' events only change when
    it sends to them, so the runner-up among them is tracked rather than searched again."""
    K = 3 * M
    for s in range(S):
        for k in range(M):
            x[_u(fa0 + s * M + k)] = 0.0 if s == 0 else _INF
            x[_u(ga0 + s * M + k)] = _INF
        q = s * _IR
        n[_u(q + _NF)] = 0
        n[_u(q + _NB)] = 0
        n[_u(q + _NW)] = 0
        n[_u(q + _LASTB)] = 0
        n[_u(q + _WAIT)] = 1 if s > 0 else 0
        x[_u(s * _FR + _TFREE)] = 0.0
        x[_u(s * _FR + _EV)] = _INF if s > 0 else 0.0
        x[_u(chf0 + s)] = 0.0
        x[_u(chb0 + s)] = 0.0
        x[_u(chb0 + S + s)] = 0.0
    remaining = S * K
    while remaining > 0:
        # the earliest event (ties to the lowest stage) and the earliest among the others
        s = -1
        t = _INF
        i2 = S
        t2 = _INF
        for i in range(S):
            v = x[_u(i * _FR + _EV)]
            if v < t:
                t2 = t
                i2 = s
                t = v
                s = i
            elif v < t2:
                t2 = v
                i2 = i
        if s < 0:
            raise ValueError("zero-bubble scheduler deadlocked")
        r = s * _FR
        q = s * _IR
        nf = n[_u(q + _NF)]
        nb = n[_u(q + _NB)]
        nw = n[_u(q + _NW)]
        last_b = n[_u(q + _LASTB)]
        lim_fb = n[_u(q + _LIMFB)]
        lim_tot = n[_u(q + _LIMTOT)]
        tfree = x[_u(r + _TFREE)]
        peak = x[_u(chb0 + S + s)]
        fs = x[_u(r + _F)]
        bs = x[_u(r + _B)]
        ws = x[_u(r + _W)]
        fa_row = fa0 + s * M
        ga_row = ga0 + s * M
        row = s * K
        while True:
            can_b = nb < nf
            r_b = x[_u(ga_row + nb)] if can_b else _INF
            fb_ok = nf < M and nf - nb < lim_fb
            tot_ok = nf - nw < lim_tot
            can_f = fb_ok and tot_ok
            r_f = x[_u(fa_row + nf)] if can_f else _INF
            ready_b = r_b <= t
            ready_f = r_f <= t
            op = -1
            if ready_b and ready_f:
                op = 0 if last_b else 1
            elif ready_b:
                op = 1
            elif ready_f:
                op = 0
            elif nw < nb:
                if fb_ok and not tot_ok:
                    op = 2  # recycle memory so the next F may run
                else:
                    t_next = _INF
                    if can_b:
                        if r_b < _INF:
                            t_next = r_b
                        else:  # s < S-1 here: the last stage's B input is its own F, always known
                            u = r + _FR
                            t_next = max(x[_u(u + _TFREE)], t) + x[_u(u + _B)] + x[_u(r + _CBO)] + x[_u(r + _CBL)]
                    if can_f:
                        y = r_f
                        if y == _INF:
                            u = r - _FR
                            y = max(x[_u(u + _TFREE)], t) + x[_u(u + _F)] + x[_u(u + _CFO)] + x[_u(u + _CFL)]
                        if y < t_next:
                            t_next = y
                    if t_next == _INF or t + ws <= t_next:
                        op = 2
            if op < 0:  # wait for the earliest known arrival
                waiting = 1
                y = r_b
                if can_f and r_f < y:
                    y = r_f
                nxt = y if y > tfree else tfree
            else:
                j = row + nf + nb + nw
                v = -1  # a neighbour woken by this op's message
                if op == 0:
                    k = nf
                    en = t + fs
                    nf += 1
                    last_b = 0
                    if nf - nw > peak:
                        peak = nf - nw
                    if s < S - 1:
                        c = x[_u(chf0 + s)]
                        y = (en if en > c else c) + x[_u(r + _CFO)]
                        x[_u(chf0 + s)] = y
                        x[_u(fa0 + (s + 1) * M + k)] = y + x[_u(r + _CFL)]
                        v = s + 1
                    else:
                        x[_u(ga_row + k)] = en
                elif op == 1:
                    k = nb
                    en = t + bs
                    nb += 1
                    last_b = 1
                    if s > 0:
                        u = r - _FR
                        c = x[_u(chb0 + s - 1)]
                        y = (en if en > c else c) + x[_u(u + _CBO)]
                        x[_u(chb0 + s - 1)] = y
                        x[_u(ga0 + (s - 1) * M + k)] = y + x[_u(u + _CBL)]
                        v = s - 1
                else:
                    k = nw
                    en = t + ws
                    nw += 1
                if v >= 0:
                    u = v * _IR
                    if n[_u(u + _WAIT)]:  # its wake time, as above
                        vf = n[_u(u + _NF)]
                        vb = n[_u(u + _NB)]
                        y = x[_u(ga0 + v * M + vb)] if vb < vf else _INF
                        if (vf < M and vf - vb < n[_u(u + _LIMFB)] and vf - n[_u(u + _NW)] < n[_u(u + _LIMTOT)]
                                and x[_u(fa0 + v * M + vf)] < y):
                            y = x[_u(fa0 + v * M + vf)]
                        tf = x[_u(v * _FR + _TFREE)]
                        y = y if y > tf else tf
                        x[_u(v * _FR + _EV)] = y
                        if y < t2 or (y == t2 and v < i2):
                            t2 = y
                            i2 = v
                n[_u(kd0 + j)] = op
                n[_u(mb0 + j)] = k
                x[_u(t0 + j)] = t
                x[_u(e0 + j)] = en
                tfree = en
                waiting = 0
                remaining -= 1
                nxt = en if nf + nb + nw < K else _INF
            if nxt < t2 or (nxt == t2 and s < i2 and nxt < _INF):
                t = nxt  # still the earliest: decide again
                continue
            n[_u(q + _NF)] = nf
            n[_u(q + _NB)] = nb
            n[_u(q + _NW)] = nw
            n[_u(q + _LASTB)] = last_b
            n[_u(q + _WAIT)] = waiting
            x[_u(r + _TFREE)] = tfree
            x[_u(r + _EV)] = nxt
            x[_u(chb0 + S + s)] = peak
            break


@cached_njit
def _period(S, K, x, n, chf0, chb0, t0, e0, kd0):
    """`period` of the candidate at these offsets."""
    t = 0.0
    for s in range(S):
        row = s * K
        span = x[_u(e0 + row + K - 1)] - x[_u(t0 + row)]
        if span > t:
            t = span
        if s < S - 1:
            # first messages leave when micro-batch 0's F on s (forward) and its B or
            # fused backward on s+1 (backward) end; channels start free
            if x[_u(chf0 + s)] - x[_u(e0 + row)] > t:  # every order opens with F of micro-batch 0
                t = x[_u(chf0 + s)] - x[_u(e0 + row)]
            for j in range(row + K, row + 2 * K):
                if n[_u(kd0 + j)] == 1 or n[_u(kd0 + j)] == 3:
                    if x[_u(chb0 + s)] - x[_u(e0 + j)] > t:
                        t = x[_u(chb0 + s)] - x[_u(e0 + j)]
                    break
    return t


@cached_njit
def _peak(S, x, chb0):
    """Largest number of micro-batches any stage holds between F and W (or BW), as the
    candidate with backward channels at chb0 recorded it."""
    best = 0.0
    for s in range(S):
        if x[_u(chb0 + S + s)] > best:
            best = x[_u(chb0 + S + s)]
    return best


@cached_njit
def _best(code, S, M, x, n, Sw, Mw, held):
    """`best_order` in workspaces sized by `_workspace(Sw, Mw)`, the stage records filled.
    Returns (c, K, period): the winner is candidate c (`_offsets(Sw, Mw, c)`), K ops per
    stage. A `held` of S or more entries receives each stage's largest peak of micro-batches
    held over every candidate order (an upper bound on the winner's whichever wins)."""
    fa0, ga0, chf0, chb0, t0, e0, kd0, mb0 = _offsets(Sw, Mw, 0)
    split = code >= 2
    K = 3 * M if split else 2 * M
    _fill_fixed(1 if split else code, S, M, split, n, kd0, mb0)
    _simulate(S, K, M, x, n, fa0, ga0, chf0, chb0, t0, e0, kd0, mb0)
    keep = held.shape[0] >= S
    for s in range(S):  # micro-batches held: all (gpipe), 1F1B's warm-up + 1
        x[_u(chb0 + S + s)] = M if code == 0 else min(S - s, M)
        if keep:
            held[s] = x[_u(chb0 + S + s)]
    best_t = _period(S, K, x, n, chf0, chb0, t0, e0, kd0)
    c = 0
    if not split:
        return c, K, best_t
    best_peak = -1.0  # computed when a tie needs it
    for variant in range(2 if code == 3 else 1):
        for s in range(S):
            q = s * _IR
            if code == 3 and variant == 0:
                n[_u(q + _LIMFB)] = 2 * (S - s) - 1
                n[_u(q + _LIMTOT)] = 2 * S - 1
            else:
                n[_u(q + _LIMFB)] = S - s
                n[_u(q + _LIMTOT)] = S
        o = 1 - c
        fa0, ga0, chf0, chb0, t0, e0, kd0, mb0 = _offsets(Sw, Mw, o)
        _greedy(S, M, x, n, fa0, ga0, chf0, chb0, t0, e0, kd0, mb0)
        if keep:
            for s in range(S):
                held[s] = max(held[s], x[_u(chb0 + S + s)])
        t2 = _period(S, K, x, n, chf0, chb0, t0, e0, kd0)
        if t2 < best_t:
            c = o
            best_t = t2
            best_peak = -1.0
        elif t2 == best_t:
            if best_peak < 0:
                best_peak = _peak(S, x, _offsets(Sw, Mw, c)[3])
            p2 = _peak(S, x, chb0)
            if p2 < best_peak:
                c = o
                best_peak = p2
    return c, K, best_t


# ---- data-parallel collectives (`spantrain.env.collectives`) ----------------------------------------
#
# They allocate nothing (but a ring of `_SORTED_RING_FROM` nodes or more its neighbour lists)
# and take few arrays (every array argument costs reference counting per call): `links`
# stacks bandwidth and latency, (2, devices, devices); node lists and scratch are slices of
# one int array `w`, given by offsets.


_SORTED_RING_FROM = 128
"""Rings of this many nodes sort each node's others by hop time first (`_ring`); below it
a scan per hop is faster than the sort (and allocates nothing)."""


@cached_njit
def _nearest_first(links, msg, w, i0, n, chunk):
    """[i]: the other nodes of w[i0:i0+n] (indices into it) by hop time from node i, nearest
    first, ties to the lower index as a scan finds them (a stable sort)."""
    near = np.empty((n, n - 1), np.int32)
    cost = np.empty(n)
    for i in range(n):
        a = w[i0 + i]
        for j in range(n):
            z = w[i0 + j]
            cost[j] = chunk / links[0, a, z] + links[1, a, z] + msg
        cost[i] = _INF
        k = 0
        for j in np.argsort(cost, kind="mergesort"):
            if j != i:
                near[i, k] = j
                k += 1
    return near


@cached_njit
def _ring(links, msg, w, i0, n, chunk, w0, best0):
    """Step seconds of the best nearest-neighbour ring over the n nodes w[i0:i0+n]
    (`ring_order`); w[w0:w0+2n] is scratch; the ring goes to w[best0:best0+n] if best0 >= 0.

    A ring's step is its slowest hop, so a start is dropped once its ring reaches the best
    so far, and the search ends once a ring is as fast as every node's fastest hop allows.
    From `_SORTED_RING_FROM` nodes, each node's others are sorted nearest first once, so a
    hop skips only the visited ones nearer than the next: same result as scanning every
    node for every hop of every start (cubic in n: 104 s for 4,096 replicas)."""
    best_step = _INF
    used = w0
    order = w0 + n
    near = _nearest_first(links, msg, w, i0, n, chunk) if n >= _SORTED_RING_FROM else np.empty((0, 0), np.int32)
    bound = 0.0  # no ring is faster than its node with the slowest fastest hop
    for i in range(n):
        a = w[i0 + i]
        fastest = _INF
        for j in range(n):
            if j != i:
                z = w[i0 + j]
                c = chunk / links[0, a, z] + links[1, a, z] + msg
                if c < fastest:
                    fastest = c
        if n > 1 and fastest > bound:
            bound = fastest
    for s0 in range(n):
        if best_step <= bound:
            break
        for j in range(n):
            w[used + j] = 0
        w[used + s0] = 1
        w[order] = w[i0 + s0]
        cur = s0
        step = 0.0
        for k in range(1, n):
            nxt = -1
            cost = _INF
            a = w[i0 + cur]
            if near.shape[0]:
                p = 0
                while w[used + near[cur, p]] == 1:
                    p += 1
                z = w[i0 + near[cur, p]]
                c = chunk / links[0, a, z] + links[1, a, z] + msg
                if c < cost:
                    cost = c
                    nxt = near[cur, p]
            else:
                for j in range(n):
                    if w[used + j] == 0:
                        z = w[i0 + j]
                        c = chunk / links[0, a, z] + links[1, a, z] + msg
                        if c < cost:
                            cost = c
                            nxt = j
            if nxt < 0:  # no finite hop: take the last (as indexing with -1 did)
                nxt = n - 1
            w[used + nxt] = 1
            w[order + k] = w[i0 + nxt]
            cur = nxt
            if cost > step:
                step = cost
                if step >= best_step:
                    break
        if n > 1:
            a = w[i0 + cur]
            z = w[i0 + s0]
            c = chunk / links[0, a, z] + links[1, a, z] + msg
            if c > step:
                step = c
        if step < best_step:
            best_step = step
            if best0 >= 0:
                for k in range(n):
                    w[best0 + k] = w[order + k]
    return best_step


@cached_njit
def _chain(links, msg, w, i0, n, leader, nbytes, w0):
    """(reduce-to-leader, broadcast-from-leader) seconds along a nearest-neighbour chain from
    `leader` over the n nodes w[i0:i0+n], pipelined in small chunks; w[w0:w0+n] is scratch."""
    if n < 2:
        return 0.0, 0.0
    for j in range(n):
        w[w0 + j] = 0
    w[w0 + leader] = 1
    cur = leader
    min_up = _INF  # towards the leader (reduce)
    min_down = _INF  # away from it (broadcast)
    lat_up = 0.0
    lat_down = 0.0
    for _ in range(n - 1):
        nxt = -1
        cost = _INF
        a = w[i0 + cur]
        for j in range(n):
            if w[w0 + j] == 0:
                z = w[i0 + j]
                c = nbytes / links[0, a, z] + links[1, a, z]
                if c < cost:
                    cost = c
                    nxt = j
        if nxt < 0:
            nxt = n - 1
        w[w0 + nxt] = 1
        z = w[i0 + nxt]
        min_down = min(min_down, links[0, a, z])
        min_up = min(min_up, links[0, z, a])
        lat_down += links[1, a, z] + msg
        lat_up += links[1, z, a] + msg
        cur = nxt
    return nbytes / min_up + lat_up, nbytes / min_down + lat_down


@cached_njit
def _collective(mode, links, msg, region, w, i0, n, nbytes, w0):
    """`collective_time` over the n nodes w[i0:i0+n]; w[w0:w0+6n] is scratch."""
    if n < 2:
        return 0.0
    regs = w0  # distinct regions, in order of first appearance
    mem = w0 + n  # members of one region
    lead = w0 + 2 * n  # the regions' leaders
    work = w0 + 3 * n
    nreg = 0
    if mode == 1:
        for i in range(n):
            r = region[w[i0 + i]]
            seen = False
            for q in range(nreg):
                if w[regs + q] == r:
                    seen = True
            if not seen:
                w[regs + nreg] = r
                nreg += 1
    if nreg <= 1:  # a plain ring (also hierarchical within one region)
        return 2.0 * (n - 1) * _ring(links, msg, w, i0, n, nbytes / n, work, -1)
    t_reduce = 0.0
    t_bcast = 0.0
    for q in range(nreg):
        rq = w[regs + q]
        cnt = 0
        for i in range(n):
            if region[w[i0 + i]] == rq:
                w[mem + cnt] = w[i0 + i]
                cnt += 1
        li = 0
        best = -1.0
        for i in range(cnt):
            tot = 0.0
            a = w[mem + i]
            for j in range(n):
                z = w[i0 + j]
                if region[z] != rq:
                    tot += links[0, a, z]
            if tot > best:
                best = tot
                li = i
        w[lead + q] = w[mem + li]
        up, down = _chain(links, msg, w, mem, cnt, li, nbytes, work)
        t_reduce = max(t_reduce, up)
        t_bcast = max(t_bcast, down)
    ring = 2.0 * (nreg - 1) * _ring(links, msg, w, lead, nreg, nbytes / nreg, work, -1)
    return t_reduce + ring + t_bcast


@cached_njit
def _serialize(ready, duration, members, G, width, free, start, end, ascending):
    """`schedule_collectives` for the first G groups, `width` members each, into
    preallocated `start` / `end`; `free` (devices) is scratch. Groups are visited last
    first, or in layer order when `ascending`."""
    for d in range(free.shape[0]):
        free[d] = 0.0
    for q in range(G):
        g = q if ascending else G - 1 - q
        st = ready[g]
        for j in range(width):
            d = members[g, j]
            if d >= 0 and free[d] > st:
                st = free[d]
        en = st + duration[g]
        for j in range(width):
            d = members[g, j]
            if d >= 0:
                free[d] = en
        start[g] = st
        end[g] = en


# ---- the plan ---------------------------------------------------------------------------------


@cached_njit
def _groups(pipe_ptr, stage_a, stage_b, n_layers, cut, lo, hi, holder):
    """`sync_groups` into preallocated arrays (cut: n_layers + 1 scratch); returns G."""
    P = pipe_ptr.shape[0] - 1
    for k in range(n_layers + 1):
        cut[k] = 0
    for g in range(stage_a.shape[0]):
        cut[stage_a[g]] = 1
    G = 0
    for k in range(n_layers):
        if cut[k]:
            if G > 0:
                hi[G - 1] = k
            lo[G] = k
            G += 1
    hi[G - 1] = n_layers
    for p in range(P):
        cur = pipe_ptr[p]
        for g in range(G):
            while stage_b[cur] <= lo[g]:
                cur += 1
            holder[g, p] = cur
    return G


def sync_groups(pipe_ptr, stage_a, stage_b, stage_dev, n_layers):
    """Layer intervals held by the same devices in every pipeline.

    Returns (lo, hi, holder_stage): group g covers layers [lo[g], hi[g]); holder_stage[g, p]
    is the flat index of the stage of pipeline p that holds them.
    """
    NS = len(stage_a)
    lo = np.zeros(NS, np.int64)
    hi = np.zeros(NS, np.int64)
    holder = np.zeros((NS, len(pipe_ptr) - 1), np.int64)
    G = _groups(np.asarray(pipe_ptr, dtype=np.int64), np.asarray(stage_a, dtype=np.int64),
                np.asarray(stage_b, dtype=np.int64), int(n_layers), np.zeros(int(n_layers) + 1, np.int64), lo, hi,
                holder)
    return lo[:G].copy(), hi[:G].copy(), holder[:G].copy()


def out_size(P: int, NS: int) -> int:
    """Floats `evaluate` writes for P pipelines of NS stages in all."""
    return 7 + 6 * P + 12 * NS


def workspace_size(S: int, M: int) -> tuple[int, int]:
    """(floats, ints) of scratch `evaluate` needs for pipelines of up to S stages and M
    micro-batches."""
    return _workspace(S, M)


def memo_record(P: int, NS: int, p: int, g0: int) -> int:
    """Where `evaluate` writes pipeline p's memo record (g0: its first stage)."""
    return 7 + 3 * P + 9 * NS + 3 * p + 3 * g0


def split_out(out, P, NS):
    """(stage_out, pipe_out, scalars) views of an `evaluate` output buffer."""
    return (out[7 + 3 * P:7 + 3 * P + 9 * NS].reshape(NS, 9), out[7:7 + 3 * P].reshape(P, 3), out[:7])


def plan_ints(pipe_ptr, stage_dev, stage_a, stage_b, mbs, nmb) -> np.ndarray:
    """A flattened plan as the one int64 array `evaluate` takes: pipe_ptr (P + 1), then
    stage_dev, stage_a, stage_b (NS each), then micro-batch sizes and counts (P each).
    Takes lists or 1-d arrays (one conversion: `CostModel` calls this per estimate)."""
    parts = (pipe_ptr, stage_dev, stage_a, stage_b, mbs, nmb)
    return np.fromiter(chain(*parts), np.int64, sum(map(len, parts)))


def plan_views(ints: np.ndarray, P: int, NS: int) -> tuple[np.ndarray, ...]:
    """The six arrays of a `plan_ints` array, as views: (pipe_ptr, stage_dev, stage_a,
    stage_b, micro-batch sizes, micro-batch counts); `evaluate` slices the same way."""
    c = P + 1 + 3 * NS
    return (ints[:P + 1], ints[P + 1:P + 1 + NS], ints[P + 1 + NS:P + 1 + 2 * NS], ints[P + 1 + 2 * NS:c],
            ints[c:c + P], ints[c + P:c + 2 * P])


def pack_model(tf, tb, tw, bb, pp, pa, act, flops, capacity, bw, lat):
    """The model's arrays as `evaluate` takes them: (tables (3, devices, layers + 1):
    F/B/W prefix seconds; layer (4, layers + 1): boundary bytes, parameter prefix,
    activation prefix, activation bytes; dev (2, devices): FLOP/s, memory bytes;
    links (2, devices, devices): bandwidth, latency)."""
    return pack_tables(np.stack([tf, tb, tw]), bb, pp, pa, act, flops, capacity, bw, lat)


def pack_tables(tables, bb, pp, pa, act, flops, capacity, bw, lat):
    """`pack_model` with the F/B/W prefix tables given stacked, (3, devices, layers + 1): taken
    as they are when C-contiguous float64 (a copy of the three was 400 MB at 4,096 devices and
    layers)."""
    L = bb.shape[0]
    layer = np.zeros((4, L + 1))
    layer[0, :L] = bb
    layer[1] = pp
    layer[2] = pa
    layer[3, :L] = act
    return (np.ascontiguousarray(tables, dtype=np.float64), layer,
            np.ascontiguousarray(np.stack([flops, capacity]), dtype=np.float64),
            np.ascontiguousarray(np.stack([bw, lat]), dtype=np.float64))


@cached_njit
def _simulated(M, S, screen):
    """Micro-batches `evaluate` simulates for a pipeline of M (its ``screen`` doc)."""
    if screen and M >= SCREEN_FROM and _SCREEN_A >= 4 * S:
        return _SCREEN_A + _SCREEN_D
    return M


@cached_njit
def evaluate(tables, layer, dev, links, region, calib, ints, P, NS, code, sync_code, period, memo_at, memo, out,
             ws_x, ws_n, screen=False):
    """Estimate a flattened plan (module docstring); the model's arrays as `pack_model`
    returns them. Writes into `out` (at least `out_size(P, NS)` floats) the scalars
    `SCALARS`, then pipe_out (P x 3: makespan_s, bubble_fraction, period_s), then
    stage_out (NS x 9: `STAGE_COLUMNS`); `split_out` views them. (Filling a buffer the
    caller keeps saves boxing three new arrays per call.)

    Pipelines with ``memo_at[p] >= 0`` are not simulated again: their record (3 + 3 x its
    stages floats: makespan, bubble fraction, period, then per stage the end of its last op,
    its peak micro-batches in flight and the start of its first op) is read from
    ``memo[memo_at[p]:]`` (a memo of earlier results for the same devices, layers and
    micro-batching); ``memo_at`` may be longer than the number of pipelines. Every
    pipeline's record is also written after stage_out, pipeline p's at
    `memo_record(P, NS, p, pipe_ptr[p])`, for the caller to remember.

    ``ws_x`` (float64) and ``ws_n`` (int64) are scratch workspaces (`workspace_size`);
    too short ones (even empty) are replaced by fresh ones.

    ``screen``: an approximation for ranking many candidates at large batches. A pipeline
    of `SCREEN_FROM` micro-batches or more is simulated at `_SCREEN_A` and `_SCREEN_A` +
    `_SCREEN_D` micro-batches, and its stage ends and period are extrapolated linearly
    from them (past the warm-up, every further micro-batch adds the steady state's cycle);
    a stage's in-flight peak is its largest over the candidate orders of the larger run
    (gpipe's: all M), so memory is never under-counted. Its records differ from exact
    ones, so a caller memoizing them keeps the two apart.
    """
    tf = tables[0]
    tb = tables[1]
    tw = tables[2]
    pp = layer[1]
    pa = layer[2]
    bw = links[0]
    lat = links[1]
    # the plan: one int array (`plan_ints`), so a call unboxes one array instead of six
    pipe_ptr = ints[:P + 1]
    stage_dev = ints[P + 1:P + 1 + NS]
    stage_a = ints[P + 1 + NS:P + 1 + 2 * NS]
    stage_b = ints[P + 1 + 2 * NS:P + 1 + 3 * NS]
    mbs = ints[P + 1 + 3 * NS:2 * P + 1 + 3 * NS]
    nmb = ints[2 * P + 1 + 3 * NS:3 * P + 1 + 3 * NS]
    L = layer.shape[1] - 1
    op0 = calib[C_OP]
    opf = calib[C_OPF]
    spb = calib[C_SPB]
    spw = calib[C_SPW]
    msg = calib[C_MSG]
    if out.shape[0] < 7 + 6 * P + 12 * NS or memo_at.shape[0] < P:
        raise ValueError("evaluate: `out` or `memo_at` too short")
    out[:7 + 6 * P + 12 * NS] = 0.0
    scalars = out[:7]
    pipe_out = out[7:7 + 3 * P].reshape((P, 3))
    stage_out = out[7 + 3 * P:7 + 3 * P + 9 * NS].reshape((NS, 9))
    # workspaces for the schedule simulations, sized for the largest pipeline simulated
    Smax = 1
    Mmax = 1
    for p in range(P):
        if memo_at[p] < 0:
            S = pipe_ptr[p + 1] - pipe_ptr[p]
            Smax = max(Smax, S)
            Mmax = max(Mmax, _simulated(nmb[p], S, screen))
    nx, ni = _workspace(Smax, Mmax)
    x = ws_x  # the caller's workspaces, kept warm in cache across calls, if large enough
    if x.shape[0] < nx:
        x = np.empty(nx)
    n = ws_n
    if n.shape[0] < ni:
        n = np.empty(ni, np.int64)
    pipe_max = 0.0
    opt_max = 0.0
    batch = 0
    feasible = True
    for p in range(P):
        g0 = pipe_ptr[p]
        S = pipe_ptr[p + 1] - g0
        m = float(mbs[p])
        M = nmb[p]
        batch += mbs[p] * M
        o = memo_at[p]
        for s in range(S):
            g = g0 + s
            d = stage_dev[g]
            a = stage_a[g]
            z = stage_b[g]
            db = tb[d, z] - tb[d, a]
            dw = tw[d, z] - tw[d, a]
            op = op0 + opf / dev[0, d]
            stage_out[g, 0] = m * (tf[d, z] - tf[d, a]) + op
            stage_out[g, 1] = m * db * spb + op
            stage_out[g, 2] = m * dw * spw + op
            if o < 0:  # to be simulated: its stage record in the workspace
                r = s * _FR
                x[r + _F] = stage_out[g, 0]
                x[r + _B] = stage_out[g, 1]
                x[r + _W] = stage_out[g, 2]
                x[r + _BWF] = m * (db + dw) + op
                if s < S - 1:
                    e = stage_dev[g + 1]
                    nbytes = m * layer[0, z - 1]
                    x[r + _CFO] = nbytes / bw[d, e] + msg
                    x[r + _CFL] = lat[d, e]
                    x[r + _CBO] = nbytes / bw[e, d] + msg
                    x[r + _CBL] = lat[e, d]
        if o >= 0:
            makespan = memo[o]
            pipe_out[p, 1] = memo[o + 1]
            pipe_out[p, 2] = memo[o + 2]
            for s in range(S):
                stage_out[g0 + s, 3] = memo[o + 3 + 3 * s]
                stage_out[g0 + s, 4] = memo[o + 4 + 3 * s]
                stage_out[g0 + s, 7] = memo[o + 5 + 3 * s]
        else:
            Ms = _simulated(M, S, screen)
            # screened, `_best` leaves each stage's largest in-flight peak over the candidate
            # orders in its stage_out column (the order that wins at M may not win at Ms: so
            # memory is never under-counted); exact, nothing (an empty view: no allocation)
            held = stage_out[g0:g0 + (S if Ms < M else 0), 4]
            per_a = 0.0
            if Ms < M:  # screened: the first of the two runs the stage ends are extrapolated from
                c, K, per_a = _best(code, S, _SCREEN_A, x, n, Smax, Mmax, held)
                e0 = _offsets(Smax, Mmax, c)[5]
                for s in range(S):
                    stage_out[g0 + s, 3] = x[e0 + s * K + K - 1]
            c, K, per = _best(code, S, Ms, x, n, Smax, Mmax, held)
            _, _, _, chb0, t0, e0, _, _ = _offsets(Smax, Mmax, c)
            grow = (M - Ms) / _SCREEN_D
            if Ms < M:
                per += grow * (per - per_a)
            makespan = 0.0
            busy = 0.0
            for s in range(S):
                r = s * _FR  # busy: the sum of its op durations (as `reference` computes it)
                busy += M * (x[r + _F] + x[r + _B] + x[r + _W]) if code >= 2 else M * (x[r + _F] + x[r + _BWF])
                row = s * K
                last = x[e0 + row + K - 1]
                if Ms < M:
                    last += grow * (last - stage_out[g0 + s, 3])
                stage_out[g0 + s, 3] = last
                if Ms == M:
                    stage_out[g0 + s, 4] = x[chb0 + S + s]
                elif code == 0:  # gpipe holds all M
                    stage_out[g0 + s, 4] = M
                stage_out[g0 + s, 7] = x[t0 + row]
                if last > makespan:
                    makespan = last
            # at least 0: a pipeline never idle rounded to -4e-16 (plan --json printed it)
            pipe_out[p, 1] = max(1.0 - busy / (S * per), 0.0) if per > 0 else 0.0
            pipe_out[p, 2] = per
        for s in range(S):
            g = g0 + s
            peak = stage_out[g, 4]
            d = stage_dev[g]
            a = stage_a[g]
            z = stage_b[g]
            params = pp[z] - pp[a]
            in_b = layer[0, a - 1] if a > 0 else 0.0
            out_b = layer[0, z - 1] if z < L else 0.0
            big = 0.0
            for k in range(a, z):
                if layer[3, k] > big:
                    big = layer[3, k]
            mem = (params * calib[C_STATE] + peak * m * (pa[z] - pa[a]) + 2.0 * m * (in_b + out_b)
                   + m * big + calib[C_RESERVED])
            if mem > dev[1, d]:
                feasible = False
            opt = params * calib[C_OPT] / (dev[0, d] * calib[C_MEMBW])
            if opt > opt_max:
                opt_max = opt
            stage_out[g, 5] = mem
            stage_out[g, 6] = opt
        pipe_out[p, 0] = makespan
        if pipe_out[p, 2] > pipe_max:
            pipe_max = pipe_out[p, 2]
        r = 7 + 3 * P + 9 * NS + 3 * p + 3 * g0  # the pipeline's memo record
        out[r] = makespan
        out[r + 1] = pipe_out[p, 1]
        out[r + 2] = pipe_out[p, 2]
        for s in range(S):
            out[r + 3 + 3 * s] = stage_out[g0 + s, 3]
            out[r + 4 + 3 * s] = stage_out[g0 + s, 4]
            out[r + 5 + 3 * s] = stage_out[g0 + s, 7]

    overlap = calib[C_OVERLAP] != 0.0
    # bytes per parameter of one sync: the gradient, or at a local-SGD sync point what is averaged
    per_param = calib[C_LSGD] if sync_code == 2 and period > 1 else calib[C_GRAD]
    sync_alone = 0.0
    for g in range(NS):
        stage_out[g, 8] = stage_out[g, 3]
    if P > 1:
        # one collective per run of layers held by the same devices (at most one per stage)
        lo = np.empty(NS, np.int64)
        hi = np.empty(NS, np.int64)
        holder = np.empty((NS, P), np.int64)
        members = np.empty((NS, P), np.int64)
        cut = np.empty(L + 1, np.int64)
        work = np.empty(7 * P, np.int64)  # a group's devices, then the collective's scratch
        G = _groups(pipe_ptr, stage_a, stage_b, L, cut, lo, hi, holder)
        ready = np.empty(G)
        dur = np.empty(G)
        start = np.empty(G)
        end_c = np.empty(G)
        free = np.empty(dev.shape[1])
        mode = 0 if sync_code == 2 else sync_code
        for g in range(G):
            r = 0.0
            for p in range(P):
                h = holder[g, p]
                members[g, p] = work[p] = stage_dev[h]
                if stage_out[h, 3] > r:
                    r = stage_out[h, 3]
            ready[g] = r
            dur[g] = _collective(mode, links, msg, region, work, 0, P, (pp[hi[g]] - pp[lo[g]]) * per_param, P)
        _serialize(np.zeros(G), dur, members, G, P, free, start, end_c, not overlap)
        sync_alone = end_c.max()
        if sync_code != 2 or not overlap:
            _serialize(ready, dur, members, G, P, free, start, end_c, not overlap)
            for g in range(G):
                for p in range(P):
                    h = holder[g, p]
                    if end_c[g] > stage_out[h, 8]:
                        stage_out[h, 8] = end_c[g]
    if overlap:
        # a stage repeats every (its span + the wait for its gradients' sync); the slowest sets the pace
        cycle = pipe_max
        it_max = 0.0
        for g in range(NS):
            c = stage_out[g, 8] - stage_out[g, 7]
            if c > cycle:
                cycle = c
            c = calib[C_ITF] / dev[0, stage_dev[g]]
            if c > it_max:
                it_max = c
        if sync_code == 2:
            # the averaging follows the step: that iteration cannot overlap the next one, so it
            # lasts the slowest pipeline's makespan (ZB-H2's exceeds its period), once per period
            drain = 0.0
            for p in range(P if P > 1 else 0):  # one pipeline has nothing to average
                if pipe_out[p, 0] - pipe_max > drain:
                    drain = pipe_out[p, 0] - pipe_max
            exposed = (sync_alone + drain) / period
        else:
            exposed = cycle - pipe_max
        it = pipe_max + exposed + opt_max + it_max
    else:
        # every stage: schedule, its collectives, optimizer, bookkeeping; the last one ends the iteration
        plain = 0.0
        synced = 0.0
        pipe_max = 0.0
        for p in range(P):
            if pipe_out[p, 0] > pipe_max:
                pipe_max = pipe_out[p, 0]
        for g in range(NS):
            tail = stage_out[g, 6] + calib[C_ITF] / dev[0, stage_dev[g]]
            if stage_out[g, 3] + tail > plain:
                plain = stage_out[g, 3] + tail
            if stage_out[g, 8] + tail > synced:
                synced = stage_out[g, 8] + tail
        it = plain + (synced - plain) / period if sync_code == 2 else synced
        exposed = it - plain
    scalars[0] = it
    scalars[1] = pipe_max
    scalars[2] = sync_alone
    scalars[3] = exposed
    scalars[4] = opt_max
    scalars[5] = batch / it if feasible and it > 0 else 0.0
    scalars[6] = 1.0 if feasible else 0.0


def evaluate_plan(tf, tb, tw, bb, pp, pa, act, flops, bw, lat, region,
                  pipe_ptr, stage_dev, stage_a, stage_b, mbs, nmb, code, sync_code, period, calib,
                  known, known_stage, known_pipe, capacity=None):
    """`evaluate` with the model's arrays one by one (slower to call: it packs them).
    Pipelines with ``known[p]`` take their stages' (end_s, in_flight, start_s) from
    ``known_stage[g]`` and (makespan, bubble, period) from ``known_pipe[p]``.
    `capacity`: memory bytes per device for the `feasible` scalar (None: unbounded).
    Returns (stage_out, pipe_out, scalars)."""
    cap = np.full(flops.shape[0], np.inf) if capacity is None else capacity
    tables, layer, dev, links = pack_model(tf, tb, tw, bb, pp, pa, act, flops, cap, bw, lat)
    P, NS = len(pipe_ptr) - 1, len(stage_dev)
    at = np.full(P, -1, np.int64)
    recs = []
    pos = 0
    for p in range(P):
        if known[p]:
            g0, g1 = int(pipe_ptr[p]), int(pipe_ptr[p + 1])
            recs.append(np.concatenate([np.asarray(known_pipe[p], dtype=np.float64),
                                        np.asarray(known_stage[g0:g1], dtype=np.float64).reshape(-1)]))
            at[p] = pos
            pos += recs[-1].shape[0]
    memo = np.concatenate(recs) if recs else np.zeros(0)
    out = np.empty(out_size(P, NS))
    ints = plan_ints(pipe_ptr, stage_dev, stage_a, stage_b, mbs, nmb)
    evaluate(tables, layer, dev, links, region, calib, ints, P, NS, int(code), int(sync_code), int(period), at, memo,
             out, np.zeros(0), np.zeros(0, np.int64))
    return split_out(out, P, NS)
