"""Scoring candidate layouts with the cost model: the shared core of every search planner.

A *layout* is the structural part of a plan: a tuple of pipelines, each a tuple of
device indices in stage order. *Knobs* are the rest: micro-batch size, schedule, sync
mode. `Evaluator.evaluate` turns (layout, batch shares, knobs) into a full candidate
(layer partition per pipeline by `spantrain.env.partition`, micro-batching per
pipeline) and scores it with `CostModel.estimate_arrays`; `Evaluator.balance` also
chooses the batch shares:

- start in proportion to each pipeline's speed (the inverse of its per-sample
  bottleneck, `Partitioner.min_bottleneck_per_sample`);
- then fit each pipeline's simulated period as T_p(b) = alpha_p + beta_p b (beta_p its
  per-sample bottleneck, alpha_p the rest: fill and drain) and solve min max_p T_p(b_p)
  with sum b_p = global batch in closed form, rounding to integers by largest
  remainder; repeat while the cost model says it helps;
- then move micro-batches one at a time from the slowest pipeline to the one that would
  finish first with it, while the iteration time improves.

A pipeline's share b_p is cut into micro-batches of the largest size <= the knob's
micro-batch size that divides b_p, so the iteration batch is exactly the global batch.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.costmodel import CostModel
from spantrain.env.partition import Partitioner
from spantrain.estimate import Estimate
from spantrain.plan import Pipeline, Plan, Stage, Sync
from spantrain.workload import Workload

__all__ = ["MICRO_BATCH_SIZES", "LOCAL_SGD_PERIODS", "Knobs", "Candidate", "Evaluator", "Layout", "sync_choices",
           "round_shares"]

MICRO_BATCH_SIZES = (1, 2, 4, 8)
"""Micro-batch sizes the search planners try (a pipeline takes the largest divisor of its
share up to the size; with zero per-op overhead smaller is never slower, but measured
overheads make larger ones pay)."""
LOCAL_SGD_PERIODS = (2, 4, 8)
"""Averaging periods tried when a planner may use local SGD."""
_FILL_STEPS = 64
"""Units past which `Evaluator.water_fill` finds its shares by rank, not unit by unit."""

Layout = tuple[tuple[int, ...], ...]
"""Pipelines as device-index tuples in stage order."""


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """Everything of a plan besides its layout and batch shares."""

    micro_batch_size: int = 1
    """Largest micro-batch size; a pipeline uses the largest divisor of its share up to it."""
    schedule: str = "1f1b"
    """Pipeline schedule (`spantrain.plan.SCHEDULES`)."""
    sync: str = "hierarchical"
    """Data-parallel sync mode (`spantrain.plan.SYNC_MODES`)."""
    period: int = 1
    """Local-SGD period (1 for the other modes)."""


@dataclass(kw_only=True)
class Candidate:
    """A scored plan candidate."""

    time: float
    """Predicted iteration seconds (inf when infeasible or unbuildable)."""
    layout: Layout
    """Pipelines as device tuples."""
    shares: tuple[int, ...]
    """Samples per pipeline per iteration."""
    knobs: Knobs
    """Micro-batching, schedule, sync."""
    built: list[tuple[tuple[int, ...], tuple[int, ...], int, int]] | None = None
    """Per pipeline (devices, stage starts, micro-batch size, count); None if a pipeline
    has no partition that fits memory."""
    estimate: Estimate | None = None
    """The cost model's estimate (None when not buildable)."""
    note: str = field(default="")
    """Why the candidate is infeasible, when it is."""
    shortfall: float = 0.0
    """For an infeasible candidate, how far it is from fitting: the largest ratio of
    memory needed to memory available over its pipelines' best partitions (> 1)."""

    @property
    def feasible(self) -> bool:
        return math.isfinite(self.time)

    @property
    def rank(self) -> tuple[int, float]:
        """Sort key: feasible candidates by time, then infeasible ones by shortfall."""
        return (0, self.time) if self.feasible else (1, self.shortfall if self.shortfall > 0 else math.inf)


def sync_choices(allow_local_sgd: bool) -> list[tuple[str, int]]:
    """(mode, period) pairs a search may pick: local SGD only when allowed, since it
    changes training semantics (replicas drift between averages)."""
    out = [("allreduce", 1), ("hierarchical", 1)]
    if allow_local_sgd:
        out += [("local-sgd", k) for k in LOCAL_SGD_PERIODS]
    return out


def _micro(b: int, m: int) -> int:
    """Largest divisor of b that is <= m."""
    for k in range(min(m, b), 0, -1):
        if b % k == 0:
            return k
    return 1


def _fill_lines(t, P: int, steps: int) -> list[tuple[float, float]]:
    """Each pipeline's time as a line in its units (through its times at half and all of
    them), where `_fill_by_rank` starts to look: a start only, any gives the same shares, and
    a near one saves most cost-model runs. Empty when some time is not finite or no line rises."""
    half = max(1, steps // 2)
    lines = []
    for k in range(P):
        a, b = t(k, half), t(k, steps)
        slope = (b - a) / max(1, steps - half)
        if not (math.isfinite(a) and math.isfinite(b) and slope > 0):
            return []
        lines.append((a - slope * half, slope))
    return lines


def _last_true(holds, guess: float, lo: int, hi: int) -> int:
    """The largest j in lo..hi where `holds(j)` (true up to some j, false after; `holds(lo)`
    is known to be true): galloping out from `guess`, then bisecting."""
    g = min(hi, max(lo, round(guess)))
    if g == lo or holds(g):
        lo, d = g, 1
        while lo < hi:
            nxt = min(hi, lo + d)
            if holds(nxt):
                lo, d = nxt, 2 * d
            else:
                hi = nxt - 1
                break
    else:
        hi, d = g - 1, 1
        while hi > lo:
            nxt = max(lo, hi - d)
            if nxt == lo or holds(nxt):
                lo = nxt
                break
            hi, d = nxt - 1, 2 * d
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def round_shares(x: np.ndarray, total: int, minimum: int = 1) -> list[int]:
    """Integers >= `minimum` summing to `total` (>= minimum x len(x)), close to the real
    targets `x` (largest remainder)."""
    x = np.asarray(x, dtype=np.float64)
    n = len(x)
    x = np.where(np.isfinite(x) & (x > 0), x, 0.0)
    s = x.sum()
    # plain floats from here: the arrays are a handful long, where numpy's per-call cost
    # dominates (searches call this thousands of times); the arithmetic is the same
    lo = float(minimum)
    target = [max(v * (total / s), lo) for v in x.tolist()] if s > 0 else [max(total / n, lo)] * n
    out = [max(math.floor(v), minimum) for v in target]
    diff = total - sum(out)
    if diff > 0:
        order = sorted(range(n), key=lambda i: out[i] - target[i])  # stable: ties keep index order
        for i in order[:diff]:
            out[i] += 1  # floor lost less than one per entry, so diff < n
    while diff < 0:
        # raised to the minimum: take back from the entries furthest above their target
        k = max(range(n), key=lambda i: out[i] - target[i] if out[i] > minimum else -math.inf)
        out[k] -= 1
        diff += 1
    assert sum(out) == total and n == len(out)
    return out


class Evaluator:
    """Builds and scores candidates for one cluster and workload; counts cost-model calls."""

    def __init__(self, cluster: Cluster, workload: Workload, model: CostModel | None = None, *,
                 calibration: Calibration | None = None):
        """`model` scores the candidates; without one, a cost model with `calibration`'s
        constants (the built-in ones when None)."""
        self.cluster = cluster
        self.workload = workload
        self.model = model or CostModel(cluster, workload, calibration)
        self.classes = self.model.classes
        """Interchangeable-device class of every device (`CostModel.classes`)."""
        self.part = Partitioner(self.model, self.classes)
        self.batch = workload.global_batch
        self.calls = 0
        self._cache: dict[tuple, Candidate] = {}
        self._pipe_cache: dict[tuple, float] = {}
        self._speeds: dict[Layout, np.ndarray] = {}

    # ---- building ----------------------------------------------------------------------

    @property
    def mode(self) -> tuple[bool, bool]:
        """What a cache of scores must key on besides the candidate: whether partitions
        (`Partitioner.screened`) and estimates (`CostModel.screened`) are screened ones."""
        return self.part.mode, self.model.mode

    def build(self, layout: Layout, shares: tuple[int, ...], knobs: Knobs):
        """Per pipeline (devices, starts, m, M), or None when some pipeline does not fit."""
        out = []
        for devs, b in zip(layout, shares):
            m = _micro(b, knobs.micro_batch_size)
            starts = self.part.split(devs, m, b // m, knobs.schedule)
            if starts is None:
                return None
            out.append((devs, starts, m, b // m))
        return out

    def evaluate(self, layout: Layout, shares: tuple[int, ...], knobs: Knobs) -> Candidate:
        """Score one fully specified candidate (memoized)."""
        key = (layout, shares, knobs, self.mode)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        built = self.build(layout, shares, knobs)
        if built is None:
            short = max(self.part.memory_ratio(devs, _micro(b, knobs.micro_batch_size),
                                               b // _micro(b, knobs.micro_batch_size), knobs.schedule)
                        for devs, b in zip(layout, shares))
            cand = Candidate(time=math.inf, layout=layout, shares=shares, knobs=knobs, shortfall=short,
                             note="a pipeline has no layer partition that fits its devices' memory")
        else:
            cand = self.score_built(built, knobs, layout=layout, shares=shares)
        if len(self._cache) > 20_000:  # entries hold estimates: bound the memory of long searches
            self._cache.clear()
        self._cache[key] = cand
        return cand

    def score_built(self, built, knobs: Knobs, *, layout: Layout | None = None,
                    shares: tuple[int, ...] | None = None) -> Candidate:
        """Score explicit pipelines (devices, starts, m, M) with the cost model."""
        mdl = self.model
        arrays = mdl.arrays([(list(d), list(s), m, M) for d, s, m, M in built], schedule=knobs.schedule,
                            sync=knobs.sync, period=knobs.period)
        self.calls += 1
        est = mdl.estimate_arrays(arrays)
        layout = layout if layout is not None else tuple(d for d, *_ in built)
        shares = shares if shares is not None else tuple(m * M for *_, m, M in built)
        t = est.iteration_s if est.feasible else math.inf
        short = 0.0
        if not est.feasible:
            cap = self.model.capacity_bytes
            short = max(est.peak_memory_gb[self.cluster.ids[d]] * 1e9 / cap[d] for p in built for d in p[0])
        return Candidate(time=t, layout=layout, shares=shares, knobs=knobs, built=built, estimate=est,
                         note="; ".join(est.reasons), shortfall=short)

    def pipeline_time(self, devs: tuple[int, ...], b: int, knobs: Knobs) -> float:
        """Seconds per iteration of one pipeline alone with share b (its steady-state period
        plus its optimizer step); inf when it does not fit memory. Memoized."""
        key = (devs, b, knobs.micro_batch_size, knobs.schedule, self.mode)
        hit = self._pipe_cache.get(key)
        if hit is None:
            built = self.build((devs,), (b,), knobs)
            if built is None:
                hit = math.inf
            else:
                d, s, m, M = built[0]
                est = self.model.estimate_arrays(self.model.arrays([(list(d), list(s), m, M)],
                                                                   schedule=knobs.schedule))
                self.calls += 1
                hit = est.iteration_s if est.feasible else math.inf
            self._pipe_cache[key] = hit
        return hit

    def water_fill(self, layout: Layout, knobs: Knobs, stop_at: float = math.inf) -> tuple[tuple[int, ...], float]:
        """Shares minimizing the slowest pipeline's time alone (`pipeline_time`): every
        pipeline starts with one unit (the micro-batch size when it divides the batch,
        else one sample), and each further unit goes to the pipeline that would finish
        first with it (the lowest index on a tie). Exact for times that grow with the share.
        Returns (shares, that slowest time); inf once the slowest time reaches `stop_at`
        (the shares then are where it stopped).

        Past `_FILL_STEPS` units of the micro-batch size the same shares are found by rank
        (`_fill_by_rank`), not unit by unit: one cost-model run per unit made the exhaustive
        planner take minutes at a global batch of 65,536."""
        B = self.batch
        P = len(layout)
        m = knobs.micro_batch_size
        unit = m if B % m == 0 and P * m <= B else 1
        if P * unit > B:
            return (), math.inf
        shares = [unit] * P
        cur = [self.pipeline_time(p, unit, knobs) for p in layout]
        worst = max(cur)
        if worst >= stop_at:
            return tuple(shares), math.inf
        steps = (B - P * unit) // unit
        # a unit of one sample under a larger micro-batch size: the micro-batch (the largest
        # divisor of the share up to it) changes from share to share, and so times fall
        if steps > _FILL_STEPS and unit == m:
            ranked = self._fill_by_rank(layout, knobs, unit, steps, stop_at)
            if ranked is not None:
                counts, last = ranked
                shares = [unit * (1 + c) for c in counts]
                if last >= stop_at or not math.isfinite(last):
                    return tuple(shares), math.inf
                return tuple(shares), max(worst, last)
        nxt = [self.pipeline_time(p, unit * 2, knobs) for p in layout]
        for _ in range(steps):
            k = int(np.argmin(nxt))
            if nxt[k] >= stop_at or not math.isfinite(nxt[k]):
                return tuple(shares), math.inf
            shares[k] += unit
            cur[k] = nxt[k]
            worst = max(worst, cur[k])
            nxt[k] = self.pipeline_time(layout[k], shares[k] + unit, knobs)
        return tuple(shares), worst

    def _fill_by_rank(self, layout: Layout, knobs: Knobs, unit: int, steps: int,
                      stop_at: float) -> tuple[list[int], float] | None:
        """The units `water_fill` gives each pipeline after `steps` of them, and the time of the
        last one given, from O(P^2 log^2 steps) pipeline times instead of one per unit; None
        when some time it reads falls as its share grows (or is nan), where only the unit-by-unit
        fill is exact.

        Why it is the same: with each pipeline's times t_k(1), t_k(2), ... (its j-th extra
        unit) non-decreasing, always taking the smallest next time (lowest pipeline on a tie)
        takes the units in the order of (time, pipeline, j), a merge of sorted sequences. So
        pipeline k's j-th unit is taken iff fewer than `steps` units precede it in that order:
        j - 1 of its own, and of every other pipeline q those of time <= t_k(j) (q < k) or
        < t_k(j) (q > k), each counted by bisection. The last unit taken is the largest time
        taken; the fill stops (inf) iff it reaches `stop_at` or is inf, and when it reaches
        `stop_at` it has taken every unit of time below it."""
        P = len(layout)
        seen: list[dict[int, float]] = [{} for _ in range(P)]
        # per pipeline, the units read so far and their times, in order: a bisection starts
        # between the nearest of them (the times are non-decreasing; checked below)
        units: list[list[int]] = [[] for _ in range(P)]
        times: list[list[float]] = [[] for _ in range(P)]

        def t(k: int, j: int) -> float:
            v = seen[k].get(j)
            if v is None:
                v = seen[k][j] = self.pipeline_time(layout[k], unit * (1 + j), knobs)
                at = bisect.bisect(units[k], j)
                units[k].insert(at, j)
                times[k].insert(at, v)
            return v

        def taken(q: int, v: float, ties: bool) -> int:
            """How many of pipeline q's units have a time below v (up to v when `ties`)."""
            cut = (bisect.bisect_right if ties else bisect.bisect_left)(times[q], v)
            lo = units[q][cut - 1] if cut else 0
            hi = units[q][cut] - 1 if cut < len(units[q]) else steps
            guess = hi if v == math.inf else (v - lines[q][0]) / lines[q][1] if lines else (lo + hi) / 2
            return _last_true(lambda j: t(q, j) < v or (ties and t(q, j) == v), guess, lo, hi)

        def before(k: int, j: int) -> int:
            v = t(k, j)
            return j - 1 + sum(taken(q, v, q < k) for q in range(P) if q != k)

        def falls() -> bool:
            return any(math.isnan(x) for k in range(P) for x in times[k]) or \
                any(b < a for k in range(P) for a, b in itertools.pairwise(times[k]))

        lines = _fill_lines(t, P, steps)
        # the greedy stops at its first unit of time >= stop_at (or inf), having taken every one below
        below = [taken(k, stop_at, False) for k in range(P)]
        if sum(below) < steps:
            return None if falls() else (below, math.inf)
        if lines:
            level = (steps + sum(a / s for a, s in lines)) / sum(1 / s for _, s in lines)
            guesses = [(level - a) / s for a, s in lines]
        else:
            guesses = [steps / P] * P
        counts = [_last_true(lambda j, k=k: before(k, j) < steps, g, 0, steps) for k, g in enumerate(guesses)]
        if falls() or sum(counts) != steps:
            return None
        return counts, max(t(k, c) for k, c in enumerate(counts) if c)


    # ---- batch shares ------------------------------------------------------------------

    def speeds(self, layout: Layout) -> np.ndarray:
        """Per pipeline, samples per second its bottleneck allows (an upper bound)."""
        hit = self._speeds.get(layout)
        if hit is None:
            hit = np.array([1.0 / max(self.part.min_bottleneck_per_sample(p), 1e-30) for p in layout])
            if len(self._speeds) > 100_000:
                self._speeds.clear()
            self._speeds[layout] = hit
        return hit

    def initial_shares(self, layout: Layout, knobs: Knobs) -> tuple[int, ...] | None:
        """Shares in proportion to speed; None when the batch is too small for the layout."""
        if len(layout) > self.batch:
            return None
        return tuple(round_shares(self.speeds(layout), self.batch))

    def balance(self, layout: Layout, knobs: Knobs, shares: tuple[int, ...] | None = None,
                refit: int = 2, moves: int = 8) -> Candidate:
        """The best candidate for `layout` and `knobs` over batch shares (module docstring)."""
        shares = shares or self.initial_shares(layout, knobs)
        if shares is None:
            return Candidate(time=math.inf, layout=layout, shares=(), knobs=knobs,
                             note=f"more pipelines ({len(layout)}) than samples ({self.batch})")
        best = self.evaluate(layout, shares, knobs)
        P = len(layout)
        if P == 1 or best.estimate is None:
            return best
        beta = 1.0 / self.speeds(layout)
        cur = best
        for _ in range(refit):
            per = np.array(cur.estimate.pipeline_period_s)
            b = np.array(cur.shares, dtype=np.float64)
            alpha = np.maximum(per - beta * b, 0.0)
            tau = (self.batch + (alpha / beta).sum()) / (1.0 / beta).sum()
            target = (tau - alpha) / beta
            new = tuple(round_shares(target, self.batch))
            if new == cur.shares:
                break
            cand = self.evaluate(layout, new, knobs)
            if cand.estimate is None:
                break
            cur = cand
            if cand.time < best.time:
                best = cand
        cur = best
        for _ in range(moves):
            if cur.estimate is None or not cur.feasible:
                break
            per = np.array(cur.estimate.pipeline_period_s)
            src = int(np.argmax(per))
            step = _micro(cur.shares[src], knobs.micro_batch_size)
            if cur.shares[src] - step < 1:
                break
            # receiver: the pipeline whose period grows least, estimated by its per-sample bottleneck
            grow = per + beta * step
            grow[src] = np.inf
            dst = int(np.argmin(grow))
            new = list(cur.shares)
            new[src] -= step
            new[dst] += step
            cand = self.evaluate(layout, tuple(new), knobs)
            if cand.time < cur.time * (1 - 1e-9):
                cur = cand
            else:
                break
        return cur if cur.time < best.time else best

    # ---- output ------------------------------------------------------------------------

    def to_plan(self, cand: Candidate) -> Plan:
        """The candidate as a `Plan`, with `predicted` filled from its estimate and `model` named."""
        if cand.built is None:
            raise ValueError("candidate has no buildable pipelines")
        ids = self.cluster.ids
        L = self.model.num_layers
        pipes = []
        for devs, starts, m, M in cand.built:
            ends = [*starts[1:], L]
            pipes.append(Pipeline(stages=tuple(Stage(devices=(ids[d],), layers=(a, z))
                                               for d, a, z in zip(devs, starts, ends)),
                                  micro_batch_size=m, num_micro_batches=M))
        est = cand.estimate
        predicted = None
        if est is not None:
            predicted = {"iteration_s": est.iteration_s, "samples_per_s": est.samples_per_s}
        return Plan(pipelines=tuple(pipes), schedule=cand.knobs.schedule,
                    sync=Sync(mode=cand.knobs.sync, period=cand.knobs.period), predicted=predicted,
                    model=self.workload.name)
