"""Layer partition of one pipeline by dynamic programming over heterogeneous devices.

Given the ordered devices of a pipeline (one per stage), the micro-batch size m, the
micro-batch count M and the schedule, choose the contiguous layer range of every stage.
The time model the DP optimizes is the usual one for synchronous pipelines:

    T ~ (M - 1) x bottleneck + fill,

where the bottleneck is the largest per-micro-batch time of any stage (its F + B + W
seconds) or any link between neighbours (the seconds a micro-batch's activation, or its
gradient, occupies the link), and the fill is the sum over stages and links of one
micro-batch's times (plus link latencies). Every stage must fit its device's memory
(`CostModel.stage_memory` with the schedule's in-flight micro-batches per position).

Passes of O(S x L^2) time and O(S x L) memory over prefix sums (compiled with numba; a
stage's seconds and memory are worked out where a pass reads them, from prefix sums and a
sparse table of activation maxima):

1. min-max: the smallest achievable bottleneck T*;
2. the partition of least fill among those whose every stage and link is <= T, for T =
   T*, no limit, and `SLACKS` x T* in between; the one with the least (M-1) x its actual
   bottleneck + its fill wins. With many micro-batches that is the min-max partition
   with the shortest fill; with few, the fill may be worth a larger bottleneck. The
   thresholds in between are skipped once even (M-1) x T* + the unlimited least fill
   cannot beat the best so far.

The cost model judges the result; the DP only needs to rank partitions well.
`min_bottleneck_per_sample` is the memory-free relaxation used as a lower bound.

Deep models (more than `COARSE_CUTS` layers): the passes are quadratic in the layers, in
time and in memory (a 4,096-layer model on 32 devices took 13 minutes and 4.5 GB to plan),
so they run on `COARSE_CUTS` evenly spaced cut positions instead (2 S for pipelines of
more stages; ties of fill, which identical layers make common, broken towards even
stages), then again on every layer boundary within a coarse interval of the cuts found,
each cut between its neighbours' intervals, repeated from the new cuts while they move. A
pipeline that fits memory only with a cut between coarse positions is found by the exact
memory DP, whose partition then starts the refinement. The lower bound becomes a
relaxation over the coarse positions that stays a lower bound (`_min_bottleneck`), and
`memory_ratio`, which only words an error, is taken on the coarse positions (it may
overstate the shortfall). A search that ranks many pipelines can skip the refinement
(`Partitioner.screened`) and partition the ones it keeps in full.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import numpy as np

from spantrain.env.calibration import C_MSG, C_RESERVED, C_STATE
from spantrain.env.costmodel import CostModel
from spantrain.env.jit import cached_njit
from spantrain.planner import screening

__all__ = ["Partitioner", "SLACKS", "COARSE_CUTS"]

SLACKS = np.array([1.03, 1.1, 1.25, 1.5, 2.0])
"""Bottleneck limits tried between the min-max one and none, as multiples of it."""
COARSE_CUTS = 512
"""Models with more layers are partitioned on this many evenly spaced cut positions, then
refined layer by layer (module docstring)."""
_REFINE_ROUNDS = 16
"""At most this many refining passes."""
_TIE = 1e-6
"""The coarse pass's tie-breaker towards even stages, relative to the bottleneck."""

_INF = np.inf


def _max_table(act: np.ndarray) -> np.ndarray:
    """Sparse table of `act`: row k, column x is the largest of act[x : x + 2^k], so the
    largest of any range is the larger of two entries (`_range_max`), in O(L log L) memory.
    The last row holds floor(log2(n)) at column n, which picks the row for a range of n."""
    L = len(act)
    rows = [np.asarray(act, dtype=np.float64)]
    while 2 ** len(rows) <= L:
        prev, w = rows[-1], 2 ** (len(rows) - 1)
        rows.append(np.maximum(prev[:-w], prev[w:]))
    table = np.zeros((len(rows) + 1, L + 1))
    for k, row in enumerate(rows):
        table[k, :len(row)] = row
    table[-1, 1:] = [n.bit_length() - 1 for n in range(1, L + 1)]
    return table


@cached_njit
def _range_max(big, lo, hi):
    """The largest of act[lo:hi] (lo < hi) from its sparse table `big` (`_max_table`)."""
    k = int(big[-1, hi - lo])
    x = big[k, lo]
    y = big[k, hi - (1 << k)]
    return x if x > y else y


@cached_njit
def _stage_mem(a, b, m, infl, P, pp, pa, bb, big, state, reserved, L, edges=True):
    """Bytes a stage holding cut positions [a, b) needs (`CostModel.stage_memory`, summed in
    its order); without its boundary messages if not `edges` (adding 0.0 leaves the rest as is)."""
    in_b = bb[a - 1] if edges and a > 0 else 0.0
    out_b = bb[b - 1] if edges and b < L else 0.0
    return ((pp[b] - pp[a]) * state + infl * m * (pa[b] - pa[a]) + 2.0 * m * (in_b + out_b)
            + m * _range_max(big, P[a], P[b]) + reserved)


@cached_njit
def _partition(devs, tfb, op_dev, P, bb, bw, lat, pp, pa, big, cap, calib, infl, m, M, n_ops, check_memory, lo, hi,
               tie=0.0):
    """Stage start positions (indices into the cut positions P, length S) of the best
    partition, or an empty array if none fits. Stage s starts at an index in [lo[s], hi[s]]
    (lo[0] = hi[0] = 0; `Partitioner._run`'s default bands leave every partition possible).

    tfb: per-device per-sample prefix of F + B + W seconds at every layer boundary;
    op_dev: each device's fixed seconds per compute op, paid `n_ops` times per micro-batch;
    big: the sparse max table of activation bytes per layer (`_max_table`). `tie` > 0
    breaks ties of fill towards even stages (`_least_fill`). A stage's seconds are worked
    out where a pass needs them, not tabled (an S x len(P)^2 table took gigabytes at
    hundreds of stages), and the passes' tables hold each stage's band only: row s, column
    a - lo[s] is stage s starting at position a (the last row: the end, L)."""
    S = devs.shape[0]
    L = bb.shape[0]
    empty = np.empty(0, np.int64)
    if S > L:
        return empty
    msg = calib[C_MSG]
    state = calib[C_STATE]
    reserved = calib[C_RESERVED]
    fixed = op_dev * n_ops  # each device's per-micro-batch op overhead
    off = np.empty(S + 1, np.int64)
    off[:S] = lo
    off[S] = L
    W = 1
    for s in range(S):
        if hi[s] - lo[s] + 1 > W:
            W = hi[s] - lo[s] + 1
    # link[s, a - lo[s]]: occupancy of the link into stage s (s >= 1) when it starts at position a
    link = np.zeros((S, W))
    link_fill = np.zeros((S, W))
    for s in range(1, S):
        d0 = devs[s - 1]
        d1 = devs[s]
        slow = min(bw[d0, d1], bw[d1, d0])
        for a in range(lo[s], hi[s] + 1):
            occ = m * bb[a - 1] / slow + msg
            link[s, a - lo[s]] = occ
            link_fill[s, a - lo[s]] = 2.0 * occ + lat[d0, d1] + lat[d1, d0]
    ctx = (devs, tfb, fixed, m, infl, P, pp, pa, bb, big, cap, calib, check_memory, lo, hi, off, link, link_fill)
    # pass 1: min-max. A stage's compute time only grows as its first layer moves down,
    # so the scan over first layers goes downwards and stops once compute alone reaches the best
    V = np.full((S + 1, W), _INF)
    V[0, 0] = 0.0
    for s in range(1, S + 1):
        d = devs[s - 1]
        for b in range(off[s], L + 1 if s == S else hi[s] + 1):
            best = _INF
            for a in range(min(b - 1, hi[s - 1]), lo[s - 1] - 1, -1):
                c = m * (tfb[d, P[b]] - tfb[d, P[a]]) + fixed[d]
                if c >= best:
                    break
                v = V[s - 1, a - lo[s - 1]]
                if v == _INF:
                    continue
                if c > v:
                    v = c
                if s > 1 and link[s - 1, a - lo[s - 1]] > v:
                    v = link[s - 1, a - lo[s - 1]]
                # the memory check, the costliest step, only for a range that would be the best
                if v < best and (not check_memory or _stage_mem(a, b, m, infl[s - 1], P, pp, pa, bb, big, state,
                                                                reserved, L) <= cap[d]):
                    best = v
            V[s, b - off[s]] = best
    t_star = V[S, 0]
    if t_star == _INF:
        return empty
    # pass 2: least fill under the min-max bottleneck, without a limit, and under a few
    # thresholds between; none can beat (M - 1) x T* + the unlimited least fill
    U = np.empty((S + 1, W))
    arg = np.empty((S + 1, W), np.int64)
    tie = tie / t_star if t_star > 0 else 0.0
    best_starts, fill, bott = _least_fill(t_star * (1.0 + 1e-12), U, arg, tie, ctx)
    best_obj = (M - 1) * bott + fill
    starts, fill_min, bott = _least_fill(_INF, U, arg, tie, ctx)
    obj = (M - 1) * bott + fill_min
    if obj < best_obj * (1.0 - 1e-12):
        best_obj = obj
        best_starts = starts
    for q in range(SLACKS.shape[0]):
        if (M - 1) * t_star + fill_min >= best_obj * (1.0 - 1e-9):
            break
        starts, fill, bott = _least_fill(t_star * SLACKS[q], U, arg, tie, ctx)
        obj = (M - 1) * bott + fill
        if obj < best_obj * (1.0 - 1e-12):
            best_obj = obj
            best_starts = starts
    return best_starts


@cached_njit
def _least_fill(T, U, arg, tie, ctx):
    """Partition of least fill whose stages and links all take <= T per micro-batch:
    (starts, fill, actual bottleneck); fill inf when there is none. `tie` > 0 adds tie x
    stage seconds squared to each stage: of partitions with the same fill (identical
    layers), the evenest; the fill returned is without it. `ctx`: `_partition`'s."""
    devs, tfb, fixed, m, infl, P, pp, pa, bb, big, cap, calib, check_memory, lo, hi, off, link, link_fill = ctx
    S = devs.shape[0]
    L = bb.shape[0]
    state = calib[C_STATE]
    reserved = calib[C_RESERVED]
    U[:, :] = _INF
    U[0, 0] = 0.0
    # least[a - lo[s - 1]]: the least over first layers a' <= a of the fill before stage s - 1
    # plus its link in, less m x its compute prefix at a'; with m x its prefix at b, its fixed
    # seconds and the tie term of a range starting at a, a lower bound on every such range
    least = np.empty(U.shape[1])
    for s in range(1, S + 1):
        d = devs[s - 1]
        o = lo[s - 1]
        run = _INF
        for a in range(o, hi[s - 1] + 1):
            g = U[s - 1, a - o] - m * tfb[d, P[a]]
            if s > 1:
                g += link_fill[s - 1, a - o]
            if g < run:
                run = g
            least[a - o] = run
        for b in range(off[s], L + 1 if s == S else hi[s] + 1):
            best = _INF
            ba = -1
            top = m * tfb[d, P[b]] + fixed[d]
            # downwards: the stage's seconds only grow, so the scan stops once they exceed T
            # or the bound exceeds the best (by more than rounding can account for)
            for a in range(min(b, hi[s - 1] + 1) - 1, o - 1, -1):
                c = m * (tfb[d, P[b]] - tfb[d, P[a]]) + fixed[d]
                if c > T or least[a - o] + top + tie * c * c > best * (1.0 + 1e-9):
                    break
                if U[s - 1, a - o] == _INF:
                    continue
                if s > 1 and link[s - 1, a - o] > T:
                    continue
                u = U[s - 1, a - o] + c + tie * c * c
                if s > 1:
                    u += link_fill[s - 1, a - o]
                # <=: of equal fills the lowest first layer, as an upward scan would pick
                if u <= best and (not check_memory or _stage_mem(a, b, m, infl[s - 1], P, pp, pa, bb, big, state,
                                                                 reserved, L) <= cap[d]):
                    best = u
                    ba = a
            U[s, b - off[s]] = best
            arg[s, b - off[s]] = ba
    starts = np.empty(S, np.int64)
    if U[S, 0] == _INF:
        return starts, _INF, _INF
    b = L
    bott = 0.0
    fill = 0.0
    for s in range(S, 0, -1):
        a = arg[s, b - off[s]]
        starts[s - 1] = a
        d = devs[s - 1]
        c = m * (tfb[d, P[b]] - tfb[d, P[a]]) + fixed[d]
        fill += c
        if c > bott:
            bott = c
        if s > 1:
            fill += link_fill[s - 1, a - lo[s - 1]]
            if link[s - 1, a - lo[s - 1]] > bott:
                bott = link[s - 1, a - lo[s - 1]]
        b = a
    return starts, fill if tie > 0 else U[S, 0], bott


@cached_njit
def _memory_ratio(devs, P, bb, pp, pa, big, cap, calib, infl, m):
    """(min over partitions of the max over stages of stage memory / device memory, the
    stage starts of such a partition, as indices into P): the ratio is <= 1 exactly when
    some partition fits."""
    S = devs.shape[0]
    L = bb.shape[0]
    starts = np.zeros(S, np.int64)
    if S > L:
        return _INF, starts
    state = calib[C_STATE]
    reserved = calib[C_RESERVED]
    V = np.full((S + 1, L + 1), _INF)
    arg = np.zeros((S + 1, L + 1), np.int64)
    V[0, 0] = 0.0
    for s in range(1, S + 1):
        d = devs[s - 1]
        for b in range(s, L - (S - s) + 1):
            best = _INF
            # downwards, stopping once the stage's memory without its boundary messages (which
            # only grows as its first layer moves down) exceeds the best; of equal ratios the
            # lowest first layer, as an upward scan would pick
            for a in range(b - 1, s - 2, -1):
                held = _stage_mem(a, b, m, infl[s - 1], P, pp, pa, bb, big, state, reserved, L, False) / cap[d]
                if held > best:
                    break
                v = V[s - 1, a]
                if v == _INF:
                    continue
                r = _stage_mem(a, b, m, infl[s - 1], P, pp, pa, bb, big, state, reserved, L) / cap[d]
                if r > v:
                    v = r
                if v <= best:
                    best = v
                    arg[s, b] = a
            V[s, b] = best
    b = L
    for s in range(S, 0, -1):
        starts[s - 1] = arg[s, b]
        b = arg[s, b]
    return V[S, L], starts


@cached_njit
def _min_bottleneck(devs, tfb, bb, bw, P):
    """Min over partitions of the max per-sample stage or link seconds (no memory limit),
    with cuts at the positions `P` (0 and L among them): a lower bound of the same over
    every layer boundary, which it equals when `P` is every one. A cut in coarse interval g
    lies in (P[g-1], P[g]]: a stage from interval g0 to g computes at least the layers
    [P[g0], P[g-1] + 1), a link at least the least boundary in its interval, and an
    interval of two or more positions may hold several cuts."""
    S = devs.shape[0]
    L = bb.shape[0]
    K = P.shape[0] - 1
    if S > L:
        return _INF
    bbmin = np.full(K + 1, _INF)
    for g in range(1, K + 1):
        for a in range(P[g - 1] + 1, min(P[g], L - 1) + 1):
            if bb[a - 1] < bbmin[g]:
                bbmin[g] = bb[a - 1]
    V = np.full((S + 1, K + 1), _INF)
    V[0, 0] = 0.0
    for s in range(1, S + 1):
        d = devs[s - 1]
        lo = 0 if s == 1 else 1  # the first stage starts at layer 0 exactly
        for g in range(1, K + 1) if s < S else range(K, K + 1):
            end = tfb[d, L] if s == S else tfb[d, P[g - 1] + 1]  # the last stage ends at L exactly
            top = g if P[g] - P[g - 1] > 1 else g - 1
            best = _INF
            for g0 in range(top, lo - 1, -1):  # compute only grows downwards: stop at the best
                c = end - tfb[d, P[g0]]
                if c >= best:
                    break
                v = V[s - 1, g0]
                if v == _INF:
                    continue
                if c > v:
                    v = c
                if s > 1:
                    d0 = devs[s - 2]
                    occ = bbmin[g0] / min(bw[d0, d], bw[d, d0])
                    if occ > v:
                        v = occ
                if v < best:
                    best = v
            V[s, g] = best
    return V[S, K]


class Partitioner:
    """Layer partitions for one cost model; results are memoized per request.

    `classes` (optional, one label per device, `spantrain.env.symmetry.device_classes`)
    lets pipelines whose devices are interchangeable position by position share one
    result: relabelling interchangeable devices changes nothing the DP reads."""

    def __init__(self, model: CostModel, classes: list[int] | None = None):
        self.model = model
        L = model.num_layers
        self.num_layers = L
        self._tfb = np.ascontiguousarray(model.forward_prefix + model.input_grad_prefix + model.weight_grad_prefix)
        act = model.activation_bytes
        self._big = _max_table(act)
        self._bb = np.ascontiguousarray(model.boundary_bytes)
        # the cut positions the DP passes consider: every layer boundary, or for deep models
        # evenly spaced ones (module docstring); the arrays below are the DP's view of them
        self._act = act
        self._views: dict[int, tuple[np.ndarray, tuple[np.ndarray, ...]]] = {}
        self._cuts = self._positions(1)[0]
        self._coarse = len(self._cuts) < L + 1
        # fixed seconds per op as the cost model charges them (an empty layer range)
        self._op = np.array([model.compute_time(d, 0, 0, 1)[0] for d in range(len(model.cluster))])
        self._classes = list(classes) if classes is not None else None
        self.screening = False
        """True: deep models keep their coarse partitions, unrefined (`screened`)."""
        self._cache: dict[tuple, tuple[int, ...] | None] = {}
        self._exact: dict[tuple, tuple[float, np.ndarray]] = {}
        self._lb_cache: dict[tuple[int, ...], float] = {}
        self._infl: dict[tuple[str, int, int], np.ndarray] = {}

    def _word(self, devices: tuple[int, ...]) -> tuple[int, ...]:
        c = self._classes
        return devices if c is None else tuple(map(c.__getitem__, devices))

    def screened(self) -> AbstractContextManager[None]:
        """Within: deep models' partitions stay on the coarse positions, not refined layer by
        layer (which takes most of a deep split's time), to rank many candidates; the ones a
        search keeps are partitioned again in full after it. No effect on other models."""
        return screening(self)

    @property
    def coarse(self) -> bool:
        """Whether the model is deep: partitioned on coarse positions, then refined."""
        return self._coarse

    @property
    def mode(self) -> bool:
        """What a cache of partition-based results must key on besides its request: whether
        partitions are screened ones (which differ only for deep models)."""
        return self.screening and self._coarse

    def in_flight(self, schedule: str, S: int, M: int) -> np.ndarray:
        """Micro-batches each stage position keeps for backward (memoized)."""
        key = (schedule, S, M)
        hit = self._infl.get(key)
        if hit is None:
            hit = np.array([CostModel.in_flight(schedule, s, S, M) for s in range(S)], dtype=np.float64)
            self._infl[key] = hit
        return hit

    def memory_floor(self, S: int) -> float:
        """Least possible bytes of the fullest stage when the model is cut into S stages (at
        most its layers) at micro-batch 1 under 1F1B (its in-flight counts): the memory DP of
        `memory_ratio` over every layer boundary (coarse positions could overstate it), for
        the devices alike with one byte each."""
        S = max(1, min(S, self.num_layers))
        infl = self.in_flight("1f1b", S, 1 << 30)
        P, bb, pp, pa = self._positions(self.num_layers)[1]
        return float(_memory_ratio(np.zeros(S, dtype=np.int64), P, bb, pp, pa, self._big, np.ones(1),
                                   self.model.calib, infl, 1.0)[0])

    def split(self, devices: tuple[int, ...], m: int, M: int, schedule: str,
              check_memory: bool = True) -> tuple[int, ...] | None:
        """First layer of each stage for `devices` in pipeline order, or None when no
        partition fits in memory (or there are more devices than layers)."""
        key = (self._word(devices), m, M, schedule, check_memory, self.mode)
        hit = self._cache.get(key, False)
        if hit is not False:
            return hit
        S = len(devices)
        infl = self.in_flight(schedule, S, M)
        n_ops = 2.0 if schedule in ("gpipe", "1f1b") else 3.0
        devs = np.array(devices, dtype=np.int64)
        cuts, view = self._positions(S)
        coarse = len(cuts) < self.num_layers + 1
        starts = self._run(devs, view, infl, m, M, n_ops, check_memory, _TIE if coarse else 0.0)
        if coarse and not len(starts) and check_memory and self._near_fit(devs, cuts, view, infl, m):
            # it may fit only with a cut between coarse positions: the exact memory DP says so,
            # and where (its partition then starts the refinement)
            ratio, fits = self._exact_fit(devices, devs, infl, m)
            if ratio <= 1.0:
                starts = fits.copy()
        if coarse and len(starts) and not self.screening:
            starts = self._refine(devs, starts, infl, m, M, n_ops, check_memory)
        out = tuple(starts.tolist()) if len(starts) else None
        if len(self._cache) > 500_000:
            self._cache.clear()
        self._cache[key] = out
        return out

    def _positions(self, S: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """The cut positions for an S-stage pipeline and the DP's view of them: every layer
        boundary for models of at most `COARSE_CUTS` layers, else `COARSE_CUTS` evenly spaced
        ones, or 2 S when there are that many stages (each stage needs room to move)."""
        L = self.num_layers
        n = L if L <= COARSE_CUTS else min(L, max(COARSE_CUTS, 2 * S))
        hit = self._views.get(n)
        if hit is None:
            P = np.arange(L + 1) if n == L else np.unique(np.linspace(0, L, n + 1).round().astype(np.int64))
            hit = self._views[n] = (P, self._at(P))
        return hit

    def _exact_fit(self, devices: tuple[int, ...], devs: np.ndarray, infl: np.ndarray, m: int
                   ) -> tuple[float, np.ndarray]:
        """`_memory_ratio` over every layer boundary (quadratic in the layers: 34 ms at 4,096),
        memoized by what it depends on: the devices' classes, the micro-batch size and the
        in-flight counts, the same for every micro-batch count of at least the stages (a
        search that shares out the batch asks for many)."""
        key = (self._word(devices), m, infl.tobytes())
        hit = self._exact.get(key)
        if hit is None:
            P, bb, pp, pa = self._positions(self.num_layers)[1]
            hit = _memory_ratio(devs, P, bb, pp, pa, self._big, self.model.capacity_bytes, self.model.calib,
                                infl, float(m))
            if len(self._exact) > 100_000:
                self._exact.clear()
            self._exact[key] = hit
        return hit

    def _near_fit(self, devs, cuts, view, infl, m) -> bool:
        """Whether a pipeline that no partition on the coarse positions fits may fit with cuts
        between them: its coarse memory ratio is within what moving each cut by one coarse
        interval changes (that interval's state and activations, its largest activation and
        boundaries), else the exact memory DP, quadratic in the layers, is not worth running."""
        mdl = self.model
        P, bb, pp, pa = view
        ratio = _memory_ratio(devs, P, bb, pp, pa, self._big, mdl.capacity_bytes, mdl.calib, infl, float(m))[0]
        state = mdl.calib[C_STATE]
        span = (state * np.max(np.diff(pp)) + float(np.max(infl)) * m * np.max(np.diff(pa))
                + m * float(np.max(self._act)) + 4.0 * m * float(np.max(self._bb)))
        return bool(ratio <= 1.0 + 2.0 * span / float(np.min(mdl.capacity_bytes[devs])))

    def _refine(self, devs, starts, infl, m, M, n_ops, check_memory) -> np.ndarray:
        """From a coarse partition: the DP again on every layer boundary within a coarse
        interval of its cuts, from the new cuts while they move, until they stop or cycle (the
        DP is not exact for its objective). The last round's, not the best by that objective:
        the cost model, which judges the plan, preferred the last on every deep case measured
        (up to 6 % faster plans)."""
        L, S = self.num_layers, len(devs)
        reach = int(np.max(np.diff(self._positions(S)[0])))
        seen = {tuple(starts.tolist())}
        for _ in range(_REFINE_ROUNDS):
            near = np.unique(np.clip(starts[1:, None] + np.arange(-reach, reach + 1)[None, :], 1, L - 1))
            window = np.concatenate(([0], near, [L])).astype(np.int64)
            # each cut moves within the window between its neighbours' furthest positions: the
            # DP is linear in the stages (over the whole window it was quadratic in it, which
            # had to cap it at 768 positions)
            ends = np.concatenate((starts, [L]))
            ranges = np.clip(np.stack((ends[:-2] - reach, ends[2:] + reach)), 1, L - 1)
            bands = np.zeros((2, S), np.int64)
            bands[0, 1:] = np.searchsorted(window, ranges[0])
            bands[1, 1:] = np.searchsorted(window, ranges[1], side="right") - 1
            fine = self._run(devs, self._at(window), infl, m, M, n_ops, check_memory, 0.0, bands)
            if not len(fine) or tuple(fine.tolist()) in seen:
                break
            seen.add(tuple(fine.tolist()))
            starts = fine
        return starts

    def _at(self, P: np.ndarray) -> tuple[np.ndarray, ...]:
        """The DP's arrays for cut positions `P` (0 and L among them): the positions, the
        boundary at each position, parameter and activation prefixes."""
        mdl = self.model
        return (np.ascontiguousarray(P, dtype=np.int64),
                np.ascontiguousarray(self._bb[P[1:] - 1]), np.ascontiguousarray(mdl.params_prefix[P]),
                np.ascontiguousarray(mdl.activation_prefix[P]))

    def _run(self, devs, view, infl, m, M, n_ops, check_memory, tie, bands=None) -> np.ndarray:
        """`_partition` over the cut positions of `view` (`_at`); the stage start layers (empty: none fits).
        `bands` (2, S): the least and the most index into P each stage may start at (default:
        any that leaves every stage a position)."""
        P, bb, pp, pa = view
        mdl = self.model
        if bands is None:
            S = len(devs)
            bands = np.zeros((2, S), np.int64)
            bands[0, 1:] = np.arange(1, S)
            bands[1, 1:] = np.arange(1, S) + len(P) - 1 - S
        starts = _partition(devs, self._tfb, self._op, P, bb, mdl.bandwidth, mdl.latency, pp, pa, self._big,
                            mdl.capacity_bytes, mdl.calib, infl, float(m), int(M), n_ops, check_memory, bands[0],
                            bands[1], tie)
        return P[starts] if len(starts) else starts

    def min_bottleneck_per_sample(self, devices: tuple[int, ...]) -> float:
        """Lower bound on per-sample seconds of the pipeline's slowest stage or link, over
        all partitions (memory ignored): a pipeline processing b samples needs at least
        b times this (every op of a stage, every message on a link, runs one at a time)."""
        key = self._word(devices)
        hit = self._lb_cache.get(key)
        if hit is None:
            mdl = self.model
            devs = np.array(devices, dtype=np.int64)
            hit = float(_min_bottleneck(devs, self._tfb, self._bb, mdl.bandwidth, self._positions(len(devs))[0]))
            self._lb_cache[key] = hit
        return hit

    def memory_ratio(self, devices: tuple[int, ...], m: int, M: int, schedule: str) -> float:
        """Least achievable max over stages of memory needed / memory available (> 1: no
        partition fits; how far off says how much more memory the pipeline needs)."""
        infl = self.in_flight(schedule, len(devices), M)
        mdl = self.model
        P, bb, pp, pa = self._positions(len(devices))[1]
        return float(_memory_ratio(np.array(devices, dtype=np.int64), P, bb, pp, pa, self._big, mdl.capacity_bytes,
                                   mdl.calib, infl, float(m))[0])
