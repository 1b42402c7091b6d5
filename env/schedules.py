"""Pipeline schedules: the order of F, B, W ops on every stage, and their exact timing.

One pipeline of S stages runs M micro-batches. Stage s runs its ops one at a time in
the order its schedule gives; an op starts when the stage is free and its input is
there:

- ``F`` of micro-batch k on stage s > 0 needs k's activation from stage s-1;
- ``B`` (input gradient) or ``BW`` (fused backward) of k needs k's gradient from stage
  s+1, or, on the last stage, k's own F (the loss is part of it);
- ``W`` (weight gradient) of k follows k's B on the same stage (the order ensures it).

Every ordered pair of neighbouring stages has one channel per direction. A message
(an activation forward, its gradient backward, the same size) occupies the channel for
``occupancy`` = bytes / bandwidth (+ per-message overhead) and arrives ``latency`` after
that; messages queue in FIFO order, so a slow link throttles the pipeline instead of
carrying any number of messages at once. Sending does not occupy the stage's compute.

Schedules:

- ``gpipe``: all F, then all fused backwards (BW), micro-batches in order; keeps all M
  in flight.
- ``1f1b``: stage s runs min(S-s-1, M) warm-up F, then alternates F and BW, then drains;
  at most S-s micro-batches in flight.
- ``zb-h1`` / ``zb-h2`` (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): backward
  split into B and W. The order comes from a greedy list scheduler in the spirit of the
  paper's automatic scheduler (section 3.1), driven by the real per-stage F/B/W and
  channel times, under the paper's memory bounds: on stage s (0-based), at most
  ``S - s`` micro-batches between F and B (1F1B's in-flight count) and at most ``S``
  between F and W for ZB-H1, whose peak over all stages equals 1F1B's (paper, Table 2:
  worker i holds (p-i+1) M_B + (i-1) M_W); ``2(S-s) - 1`` and ``2S - 1`` for ZB-H2.
  The rules, applied whenever a stage is free, in time order over all stages:

  1. If a B and an F are both ready, alternate (F after a B, B after an F): the paper's
     steady 1F-1B pattern. Otherwise run whichever is ready; an F counts as ready only
     within the memory bounds, so the warm-up runs as many F as the bounds allow.
  2. Nothing ready and a W pending: run the W if F is blocked only by the F-to-W bound
     (it frees memory), or if it fits in the gap before the next F or B can arrive
     (the known arrival, else a lower bound from the neighbour's state), or if only Ws
     are left. Otherwise wait for the next arrival.

  The greedy order is compared with the 1F1B order with B and W split (and, for ZB-H2,
  with the greedy order under ZB-H1's bounds); the one with the shortest steady-state
  period (`period`) wins (ties go to the lower-memory order), the paper's "search over
  hyperparameters" in small. So a zero-bubble schedule is never predicted slower than
  1F1B on the same stages.

Iterations repeat: a stage starts its next iteration as soon as it has finished this
one (and its optimizer step), without waiting for the other stages, as the paper's
ZB-H2 assumes (it replaces the optimizer's global synchronization by post-validation).
So a pipeline's time per iteration is its steady-state `period`, not the makespan of
one iteration in isolation; the two are equal for gpipe, 1f1b and ZB-H1.

Decisions happen exactly at the moments the stage could start an op, so the greedy's
own timing equals the timing of simulating its order (`simulate_order`; tested).

`stage_orders` is the public entry the runtime uses to execute the very same order the
cost model timed. The compiled kernels here are reused by `spantrain.env.kernel`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from spantrain.errors import PlanError

__all__ = [
    "SCHEDULE_CODES",
    "OP_NAMES",
    "OP_F",
    "OP_B",
    "OP_W",
    "OP_BW",
    "stage_orders",
    "memory_bounds",
    "fixed_order",
    "simulate_order",
    "zb_greedy",
    "best_order",
    "period",
]

SCHEDULE_CODES = {"gpipe": 0, "1f1b": 1, "zb-h1": 2, "zb-h2": 3}
"""Integer codes the kernels use for `spantrain.plan.SCHEDULES`."""
GPIPE, ONE_F_ONE_B, ZB_H1, ZB_H2 = 0, 1, 2, 3

OP_F, OP_B, OP_W, OP_BW = 0, 1, 2, 3
OP_NAMES = ("F", "B", "W", "BW")
"""Op names by code, as `stage_orders` returns them."""

_INF = np.inf


def memory_bounds(schedule: str, num_stages: int) -> list[tuple[int, int]]:
    """Per stage (max micro-batches between F and B, max between F and W) a zero-bubble
    schedule may hold (module docstring); for gpipe / 1f1b the bounds their orders imply."""
    S = num_stages
    code = SCHEDULE_CODES[schedule]
    if code == ZB_H1:
        return [(S - s, S) for s in range(S)]
    if code == ZB_H2:
        return [(2 * (S - s) - 1, 2 * S - 1) for s in range(S)]
    if code == ONE_F_ONE_B:
        return [(S - s, S - s) for s in range(S)]
    return [(2**62, 2**62)] * S


# ---- compiled kernels ------------------------------------------------------------------------


@njit(cache=True)
def fixed_order(code, S, M, split):
    """The op order of gpipe (code 0) or 1f1b (code 1) as (kind, micro-batch) arrays of
    shape (S, K): K = 2M with fused backwards, 3M when `split` (B then W at once)."""
    K = 3 * M if split else 2 * M
    kind = np.empty((S, K), np.int64)
    mb = np.empty((S, K), np.int64)
    for s in range(S):
        pos = 0
        if code == 0:
            warm = M
        else:
            warm = min(S - s - 1, M)
        for k in range(warm):
            kind[s, pos] = 0
            mb[s, pos] = k
            pos += 1
        nxt_b = 0
        for k in range(warm, M):
            kind[s, pos] = 0
            mb[s, pos] = k
            pos += 1
            pos = _put_backward(kind, mb, s, pos, nxt_b, split)
            nxt_b += 1
        while nxt_b < M:
            pos = _put_backward(kind, mb, s, pos, nxt_b, split)
            nxt_b += 1
    return kind, mb


@njit(cache=True)
def _put_backward(kind, mb, s, pos, k, split):
    if split:
        kind[s, pos] = 1
        mb[s, pos] = k
        kind[s, pos + 1] = 2
        mb[s, pos + 1] = k
        return pos + 2
    kind[s, pos] = 3
    mb[s, pos] = k
    return pos + 1


@njit(cache=True)
def _send(ch, i, end, occ, lat):
    """Queue a message on channel i after `end`; return its arrival time."""
    st = end if end > ch[i] else ch[i]
    ch[i] = st + occ
    return st + occ + lat


@njit(cache=True)
def simulate_order(kind, mb, f, b, w, bw, cfo, cfl, cbo, cbl):
    """Start and end of every op of a given order (module docstring rules).

    f, b, w, bw: per-stage op durations (bw = fused backward); cfo/cfl: occupancy and
    latency of the channel stage s -> s+1, cbo/cbl: of s+1 -> s. Returns (start, end,
    chf, chb): op times shaped like `kind`, and when each channel's last message stops
    occupying it (forward, backward); raises ValueError when the order deadlocks.
    """
    S, K = kind.shape
    M = 0
    for s in range(S):
        for j in range(K):
            if mb[s, j] + 1 > M:
                M = mb[s, j] + 1
    start = np.empty((S, K))
    end = np.empty((S, K))
    fa = np.full((S, M), _INF)
    fa[0, :] = 0.0
    ga = np.full((S, M), _INF)
    chf = np.zeros(max(S - 1, 1))
    chb = np.zeros(max(S - 1, 1))
    pos = np.zeros(S, np.int64)
    tfree = np.zeros(S)
    remaining = S * K
    sweep = 0
    while remaining > 0:
        progressed = False
        for i in range(S):
            # alternate sweep direction so activations and gradients both travel fast
            s = i if sweep % 2 == 0 else S - 1 - i
            while pos[s] < K:
                j = pos[s]
                op = kind[s, j]
                k = mb[s, j]
                if op == 0:
                    dep = fa[s, k]
                    dur = f[s]
                elif op == 2:
                    dep = 0.0
                    dur = w[s]
                else:
                    dep = ga[s, k]
                    dur = b[s] if op == 1 else bw[s]
                if dep == _INF:
                    break
                st = tfree[s] if tfree[s] > dep else dep
                en = st + dur
                start[s, j] = st
                end[s, j] = en
                tfree[s] = en
                pos[s] = j + 1
                remaining -= 1
                progressed = True
                if op == 0:
                    if s < S - 1:
                        fa[s + 1, k] = _send(chf, s, en, cfo[s], cfl[s])
                    else:
                        ga[s, k] = en
                elif op != 2 and s > 0:
                    ga[s - 1, k] = _send(chb, s - 1, en, cbo[s - 1], cbl[s - 1])
        sweep += 1
        if not progressed:
            raise ValueError("pipeline order deadlocks")
    return start, end, chf, chb


@njit(cache=True)
def _wake_time(s, S, M, nF, nB, nW, tfree, fa, ga, lim_fb, lim_tot):
    """When a waiting stage can next start an F or B: the earliest known arrival."""
    t = _INF
    if nB[s] < nF[s]:
        t = ga[s, nB[s]]
    if nF[s] < M and nF[s] - nB[s] < lim_fb[s] and nF[s] - nW[s] < lim_tot[s] and fa[s, nF[s]] < t:
        t = fa[s, nF[s]]
    if t < tfree[s]:
        t = tfree[s]
    return t


@njit(cache=True)
def zb_greedy(M, f, b, w, cfo, cfl, cbo, cbl, lim_fb, lim_tot):
    """The zero-bubble greedy order (module docstring) with its timing.

    Returns (kind, mb, start, end, chf, chb) as `simulate_order` does. Bounds must be
    >= 1 with lim_fb <= lim_tot.
    """
    S = f.shape[0]
    K = 3 * M
    kind = np.empty((S, K), np.int64)
    mb = np.empty((S, K), np.int64)
    start = np.empty((S, K))
    end = np.empty((S, K))
    nF = np.zeros(S, np.int64)
    nB = np.zeros(S, np.int64)
    nW = np.zeros(S, np.int64)
    pos = np.zeros(S, np.int64)
    last_b = np.zeros(S, np.bool_)  # last F-or-B op was a B
    waiting = np.ones(S, np.bool_)
    tfree = np.zeros(S)
    ev = np.full(S, _INF)
    fa = np.full((S, M), _INF)
    fa[0, :] = 0.0
    ga = np.full((S, M), _INF)
    chf = np.zeros(max(S - 1, 1))
    chb = np.zeros(max(S - 1, 1))
    ev[0] = 0.0
    waiting[0] = False
    remaining = S * K
    while remaining > 0:
        s = -1
        t = _INF
        for i in range(S):
            if ev[i] < t:
                t = ev[i]
                s = i
        if s < 0:
            raise ValueError("zero-bubble scheduler deadlocked")
        can_b = nB[s] < nF[s]
        r_b = ga[s, nB[s]] if can_b else _INF
        fb_ok = nF[s] < M and nF[s] - nB[s] < lim_fb[s]
        tot_ok = nF[s] - nW[s] < lim_tot[s]
        can_f = fb_ok and tot_ok
        r_f = fa[s, nF[s]] if can_f else _INF
        ready_b = r_b <= t
        ready_f = r_f <= t
        op = -1
        if ready_b and ready_f:
            op = 0 if last_b[s] else 1
        elif ready_b:
            op = 1
        elif ready_f:
            op = 0
        elif nW[s] < nB[s]:
            if fb_ok and not tot_ok:
                op = 2  # recycle memory so the next F may run
            else:
                t_next = _INF
                if can_b:
                    if r_b < _INF:
                        t_next = r_b
                    else:  # s < S-1 here: the last stage's B input is its own F, always known
                        t_next = max(tfree[s + 1], t) + b[s + 1] + cbo[s] + cbl[s]
                if can_f:
                    x = r_f
                    if x == _INF:
                        x = max(tfree[s - 1], t) + f[s - 1] + cfo[s - 1] + cfl[s - 1]
                    if x < t_next:
                        t_next = x
                if t_next == _INF or t + w[s] <= t_next:
                    op = 2
        if op < 0:
            waiting[s] = True
            ev[s] = _wake_time(s, S, M, nF, nB, nW, tfree, fa, ga, lim_fb, lim_tot)
            continue
        j = pos[s]
        if op == 0:
            k = nF[s]
            en = t + f[s]
            nF[s] = k + 1
            last_b[s] = False
            if s < S - 1:
                fa[s + 1, k] = _send(chf, s, en, cfo[s], cfl[s])
                if waiting[s + 1]:
                    ev[s + 1] = _wake_time(s + 1, S, M, nF, nB, nW, tfree, fa, ga, lim_fb, lim_tot)
            else:
                ga[s, k] = en
        elif op == 1:
            k = nB[s]
            en = t + b[s]
            nB[s] = k + 1
            last_b[s] = True
            if s > 0:
                ga[s - 1, k] = _send(chb, s - 1, en, cbo[s - 1], cbl[s - 1])
                if waiting[s - 1]:
                    ev[s - 1] = _wake_time(s - 1, S, M, nF, nB, nW, tfree, fa, ga, lim_fb, lim_tot)
        else:
            k = nW[s]
            en = t + w[s]
            nW[s] = k + 1
        kind[s, j] = op
        mb[s, j] = k
        start[s, j] = t
        end[s, j] = en
        pos[s] = j + 1
        tfree[s] = en
        waiting[s] = False
        ev[s] = en if j + 1 < K else _INF
        remaining -= 1
    return kind, mb, start, end, chf, chb


@njit(cache=True)
def _peak_total(kind):
    """Largest number of micro-batches any stage holds between F and W (or BW)."""
    best = 0
    for s in range(kind.shape[0]):
        c = 0
        for j in range(kind.shape[1]):
            if kind[s, j] == 0:
                c += 1
                if c > best:
                    best = c
            elif kind[s, j] >= 2:
                c -= 1
    return best


@njit(cache=True)
def period(kind, start, end, chf, chb):
    """Steady-state seconds per iteration of a pipeline that repeats this timing.

    When every stage and channel starts iteration i+1 exactly `period` after iteration i,
    nothing overlaps as long as the period covers each stage's span (first op start to
    last op end) and each channel's span (first message sent to the last one's end of
    occupancy): the paper's "parallelogram". For gpipe, 1f1b and ZB-H1 the first stage
    starts first and ends last, so the period is the makespan; ZB-H2 gains here.
    """
    S, K = kind.shape
    t = 0.0
    for s in range(S):
        span = end[s, K - 1] - start[s, 0]
        if span > t:
            t = span
        if s < S - 1:
            # first messages leave when micro-batch 0's F on s (forward) and its B or
            # fused backward on s+1 (backward) end; channels start free
            if chf[s] - end[s, 0] > t:  # every order opens with F of micro-batch 0
                t = chf[s] - end[s, 0]
            for j in range(K):
                if kind[s + 1, j] == 1 or kind[s + 1, j] == 3:
                    if chb[s] - end[s + 1, j] > t:
                        t = chb[s] - end[s + 1, j]
                    break
    return t


@njit(cache=True)
def best_order(code, M, f, b, w, bw, cfo, cfl, cbo, cbl):
    """The order a schedule runs with these times (module docstring), with its timing:
    (kind, mb, start, end, period seconds)."""
    S = f.shape[0]
    if code <= 1:
        kind, mb = fixed_order(code, S, M, False)
        start, end, chf, chb = simulate_order(kind, mb, f, b, w, bw, cfo, cfl, cbo, cbl)
        return kind, mb, start, end, period(kind, start, end, chf, chb)
    kind, mb = fixed_order(1, S, M, True)
    start, end, chf, chb = simulate_order(kind, mb, f, b, w, bw, cfo, cfl, cbo, cbl)
    best_t = period(kind, start, end, chf, chb)
    best_peak = _peak_total(kind)
    for variant in range(2 if code == 3 else 1):
        lim_fb = np.empty(S, np.int64)
        lim_tot = np.empty(S, np.int64)
        for s in range(S):
            if code == 3 and variant == 0:
                lim_fb[s] = 2 * (S - s) - 1
                lim_tot[s] = 2 * S - 1
            else:
                lim_fb[s] = S - s
                lim_tot[s] = S
        k2, m2, s2, e2, f2, b2 = zb_greedy(M, f, b, w, cfo, cfl, cbo, cbl, lim_fb, lim_tot)
        t2 = period(k2, s2, e2, f2, b2)
        p2 = _peak_total(k2)
        if t2 < best_t or (t2 == best_t and p2 < best_peak):
            kind, mb, start, end = k2, m2, s2, e2
            best_t = t2
            best_peak = p2
    return kind, mb, start, end, best_t


# ---- public API ------------------------------------------------------------------------------


def _vec(x: Sequence[float] | None, n: int, what: str, default: Sequence[float] | None = None) -> np.ndarray:
    if x is None:
        x = default if default is not None else [0.0] * n
    arr = np.asarray(x, dtype=np.float64).reshape(-1)
    if arr.shape[0] != n:
        raise PlanError(f"{what}: expected {n} values, got {arr.shape[0]}")
    if not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise PlanError(f"{what}: values must be finite and >= 0")
    return arr


def stage_orders(schedule: str, num_stages: int, num_micro_batches: int, f: Sequence[float],
                 b: Sequence[float], w: Sequence[float], comm: Sequence[float] | None = None, *,
                 comm_backward: Sequence[float] | None = None, latency: Sequence[float] | None = None,
                 latency_backward: Sequence[float] | None = None) -> list[list[tuple[str, int]]]:
    """For each stage, its ops in execution order as ("F"|"B"|"W"|"BW", micro-batch index).

    `f`, `b`, `w`: seconds of one micro-batch's forward, input-gradient and weight-gradient
    op on each stage (gpipe / 1f1b fuse B and W into "BW"; their orders do not depend on
    the times). `comm[s]`: seconds a micro-batch's activation occupies the link from stage
    s to s+1 (S-1 values; None = free links); `comm_backward[s]`: the same for its gradient
    from s+1 to s (default: `comm`); `latency` / `latency_backward`: per-link latency added
    after the occupancy (default 0). `CostModel.stage_orders(plan)` calls this with the
    plan's own times, so the runtime can execute exactly the order that was costed.
    """
    if schedule not in SCHEDULE_CODES:
        raise PlanError(f"schedule {schedule!r} is unknown (choose from {', '.join(SCHEDULE_CODES)})")
    S, M = int(num_stages), int(num_micro_batches)
    if S < 1 or M < 1:
        raise PlanError(f"need at least one stage and one micro-batch, got {S} and {M}")
    fv, bv, wv = _vec(f, S, "f"), _vec(b, S, "b"), _vec(w, S, "w")
    n = max(S - 1, 1)
    cfo = _vec(comm, S - 1, "comm") if S > 1 else np.zeros(1)
    cbo = _vec(comm_backward, S - 1, "comm_backward", cfo) if S > 1 else np.zeros(1)
    cfl = _vec(latency, S - 1, "latency") if S > 1 else np.zeros(n)
    cbl = _vec(latency_backward, S - 1, "latency_backward", cfl) if S > 1 else np.zeros(n)
    kind, mb, _, _, _ = best_order(SCHEDULE_CODES[schedule], M, fv, bv, wv, bv + wv, cfo, cfl, cbo, cbl)
    return [[(OP_NAMES[int(o)], int(k)) for o, k in zip(kind[s], mb[s])] for s in range(S)]
