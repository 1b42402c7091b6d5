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
cost model timed. The functions here are thin wrappers: the compiled simulations
(`_simulate`, `_greedy`, `_best`, working in place in flat workspaces) live in
`spantrain.env.kernel` with every other compiled function, because numba's cache checks
only the file that defines a function and would otherwise run a stale callee after an
edit here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spantrain.env.kernel import (
    _B,
    _BWF,
    _CBL,
    _CBO,
    _CFL,
    _CFO,
    _F,
    _FR,
    _IR,
    _LIMFB,
    _LIMTOT,
    _W,
    _best,
    _fill_fixed,
    _greedy,
    _offsets,
    _period,
    _simulate,
    _workspace,
)
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


# ---- thin wrappers over the workspace kernels (tests, `stage_orders`, `CostModel` blocks) ----


def _f64(*xs):
    return [np.ascontiguousarray(v, dtype=np.float64).reshape(-1) for v in xs]


def _load(S: int, M: int, f, b, w, bw=None, cfo=None, cfl=None, cbo=None, cbl=None):
    """Workspaces for one pipeline with its stage records filled."""
    nx, ni = _workspace(S, M)
    x = np.zeros(nx)
    n = np.zeros(ni, np.int64)
    rec = x[:S * _FR].reshape(S, _FR)
    rec[:, _F], rec[:, _B], rec[:, _W] = f, b, w
    if bw is not None:
        rec[:, _BWF] = bw
    for col, v in ((_CFO, cfo), (_CFL, cfl), (_CBO, cbo), (_CBL, cbl)):
        if v is not None and S > 1:
            rec[:S - 1, col] = v[:S - 1]
    return x, n


def _take(x, n, S, K, off):
    t0, e0, kd0, mb0 = off[4:]
    return (n[kd0:kd0 + S * K].reshape(S, K).copy(), n[mb0:mb0 + S * K].reshape(S, K).copy(),
            x[t0:t0 + S * K].reshape(S, K).copy(), x[e0:e0 + S * K].reshape(S, K).copy())


def _channels(x, S, off):
    n = max(S - 1, 1)
    chf = np.zeros(n)
    chb = np.zeros(n)
    chf[:S - 1] = x[off[2]:off[2] + S - 1]
    chb[:S - 1] = x[off[3]:off[3] + S - 1]
    return chf, chb


def fixed_order(code: int, S: int, M: int, split: bool) -> tuple[np.ndarray, np.ndarray]:
    """The op order of gpipe (code 0) or 1f1b (code 1) as (kind, micro-batch) arrays of
    shape (S, K): K = 2M with fused backwards, 3M when `split` (B then W at once)."""
    S, M = int(S), int(M)
    K = 3 * M if split else 2 * M
    n = np.empty(2 * S * K, np.int64)
    _fill_fixed(int(code), S, M, bool(split), n, 0, S * K)
    return n[:S * K].reshape(S, K), n[S * K:].reshape(S, K)


def simulate_order(kind, mb, f, b, w, bw, cfo, cfl, cbo, cbl):
    """Start and end of every op of a given order (module docstring rules).

    f, b, w, bw: per-stage op durations (bw = fused backward); cfo/cfl: occupancy and
    latency of the channel stage s -> s+1, cbo/cbl: of s+1 -> s. Returns (start, end,
    chf, chb): op times shaped like `kind`, and when each channel's last message stops
    occupying it (forward, backward); raises ValueError when the order deadlocks.
    """
    kind = np.asarray(kind, dtype=np.int64)
    mb = np.asarray(mb, dtype=np.int64)
    S, K = kind.shape
    M = int(mb.max()) + 1 if mb.size else 0
    Mw = max(M, (K + 2) // 3)
    x, n = _load(S, Mw, *_f64(f, b, w, bw, cfo, cfl, cbo, cbl))
    off = _offsets(S, Mw, 0)
    n[off[6]:off[6] + S * K] = kind.reshape(-1)
    n[off[7]:off[7] + S * K] = mb.reshape(-1)
    _simulate(S, K, M, x, n, *off)
    _, _, start, end = _take(x, n, S, K, off)
    return (start, end, *_channels(x, S, off))


def zb_greedy(M, f, b, w, cfo, cfl, cbo, cbl, lim_fb, lim_tot):
    """The zero-bubble greedy order (module docstring) with its timing.

    Returns (kind, mb, start, end, chf, chb) as `simulate_order` does. Bounds must be
    >= 1 with lim_fb <= lim_tot.
    """
    f, b, w, cfo, cfl, cbo, cbl = _f64(f, b, w, cfo, cfl, cbo, cbl)
    S = f.shape[0]
    M = int(M)
    x, n = _load(S, M, f, b, w, None, cfo, cfl, cbo, cbl)
    rec = n[:S * _IR].reshape(S, _IR)
    rec[:, _LIMFB] = lim_fb
    rec[:, _LIMTOT] = lim_tot
    off = _offsets(S, M, 0)
    _greedy(S, M, x, n, *off)
    return (*_take(x, n, S, 3 * M, off), *_channels(x, S, off))


def period(kind, start, end, chf, chb) -> float:
    """Steady-state seconds per iteration of a pipeline that repeats this timing.

    When every stage and channel starts iteration i+1 exactly `period` after iteration i,
    nothing overlaps as long as the period covers each stage's span (first op start to
    last op end) and each channel's span (first message sent to the last one's end of
    occupancy): the paper's "parallelogram". For gpipe, 1f1b and ZB-H1 the first stage
    starts first and ends last, so the period is the makespan; ZB-H2 gains here.
    """
    kind = np.asarray(kind, dtype=np.int64)
    S, K = kind.shape
    x = np.concatenate([*_f64(start, end), np.zeros(2 * S)])
    x[2 * S * K:2 * S * K + S - 1] = np.asarray(chf, dtype=np.float64).reshape(-1)[:S - 1]
    x[2 * S * K + S:2 * S * K + 2 * S - 1] = np.asarray(chb, dtype=np.float64).reshape(-1)[:S - 1]
    return _period(S, K, x, kind.reshape(-1).copy(), 2 * S * K, 2 * S * K + S, 0, S * K, 0)


def best_order(code, M, f, b, w, bw, cfo, cfl, cbo, cbl):
    """The order a schedule runs with these times (module docstring), with its timing:
    (kind, mb, start, end, period seconds)."""
    f, b, w, bw, cfo, cfl, cbo, cbl = _f64(f, b, w, bw, cfo, cfl, cbo, cbl)
    S = f.shape[0]
    M = int(M)
    x, n = _load(S, M, f, b, w, bw, cfo, cfl, cbo, cbl)
    c, K, per = _best(int(code), S, M, x, n, S, M, np.empty(0))
    return (*_take(x, n, S, K, _offsets(S, M, c)), per)


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
