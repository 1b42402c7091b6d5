"""`heuristic`: the fallback planner, in the spirit of DeepCEE's profiler and planner.

1. **Group** the devices in two levels (`spantrain.policies.grouping`): network groups by
   hierarchical clustering of the bandwidths, then compute units (similar TFLOP/s)
   inside each group. A unit's devices are interchangeable enough to be dealt out
   evenly to the pipelines that use the unit.
2. **Structures**: a plan is built from *chains*. A chain is an ordered list of units
   and a pipeline count P; each unit is dealt into P chunks of balanced compute, and
   pipeline i runs chunk i of every unit of the chain in order. So a chain of one unit
   (or of the units of one network group) keeps pipelines inside a fast network and
   data parallelism across chains ("pipelines inside groups, DP across"), while a chain
   through several groups runs every pipeline across them, each stage's replicas
   staying inside one group ("pipelines across groups, DP inside"): the first puts the
   gradient traffic (which grows with the parameters) on the slow links, the second
   the activations (which grow with micro-batches). A plan with several chains mixes
   both. Every pipeline gets its own layer partition by dynamic programming over its
   devices' speeds, links and memory (`spantrain.env.partition`), and the batch
   is shared out unevenly in proportion to speed and rebalanced with the cost model
   (`Evaluator.balance`).
3. **Search** structures with the cost model under probe knobs (1F1B, micro-batch 1,
   hierarchical sync): start from the best of every single unit, every network group,
   all devices as one data-parallel set and all devices as one chain, each with its
   best P; then, greedily while the predicted iteration time improves, take the best
   neighbour: an unused unit added as a new chain or inserted anywhere in a chain, two
   chains merged, a unit moved within its chain (each scored at a hinted P, the best
   few re-scanned over P), or a unit dropped or a chain's P re-picked (always scanned
   over P: shrinking is how the plan sheds devices that only slow it). Large clusters
   consider the most promising unused units per round (fastest, best connected), and a
   chain of over 16 units sheds them in bulk: each drop scored at the chain's P, then the
   best 2, 4, 8, ... dropped together. Deep
   models (over `COARSE_CUTS` layers) rank structures on coarse, unrefined layer
   partitions, and partition the best 12 again in full (`Partitioner.screened`).
4. **Refine** the best few layouts device by device: drop a pipeline or a device, or
   (small layouts) move a run of 1-3 devices elsewhere in its pipeline, while it helps.
   Besides the best few layouts, the fastest device that holds the whole model is
   refined and tuned alone: units enter a plan whole, so where a unit's own links are
   slow, neither its pipelines nor its data parallelism beat one of its devices.
5. **Tune** their knobs: every schedule (gpipe, 1f1b, zb-h1, zb-h2), micro-batch sizes
   1, 2, 4, 8 (upward while they help), sync allreduce or hierarchical (local SGD only
   with `allow_local_sgd=True`, since it changes training semantics), re-balancing the
   batch shares for each.
6. **Again** with the tuned knobs (or the best zero-bubble ones, or ZB-H1 when no
   zero-bubble plan fit the layouts tuned so far): a zero-bubble schedule makes longer
   pipelines over slower links worth it, and fewer of them can fit where many short
   ones did not, so steps 3-5 run once more from the structure the best plan grew from;
   finally the layout is refined under the final knobs and under each schedule that does
   not fit its memory (dropping or moving a device can make a zero-bubble schedule fit).
   When the best plan is not ZB-H2 yet, steps 3-5 run once more from scratch under ZB-H2
   (on clusters of up to 24 devices, or at any size when the best plan has no pipeline of
   two stages): refined under 1F1B, a pipeline over slow links sheds its devices down to
   a few or one, each stage only adding bubbles, where under the nearly bubble-free ZB-H2
   the longer pipeline wins (four A100s on a 0.5 Gbit/s LAN, gpt2-xl: two of them, 3.54 s
   against one alone, 4.50 s). Steps 3-5 also run under GPipe: from scratch on clusters of
   up to 24 devices, from the best plan's structure on larger ones once tuning picked
   GPipe. On high-latency links 1F1B and the zero-bubble schedules wait a round trip per
   micro-batch where GPipe streams them, so only under GPipe do longer pipelines pay
   (three A100s on a 100 Gbit/s, 20 ms LAN, gpt2-medium: one three-stage GPipe pipeline,
   0.459 s, against 0.535 s for the structures 1F1B prefers). Every plan these passes
   find gets the final steps; the best is kept.
7. **Order and trim** long pipelines (11-16 stages, where step 4 moves single devices
   only by dropping them): under the final knobs, while it helps, swap two devices or
   move one elsewhere in its pipeline, drop any device, trim a network group's run of
   devices by several at once, insert an idle device next to one of its network group,
   or replace a device by an idle one so placed. Which device sits where changes the
   links between stages and so the layer cuts, and the stage count changes how evenly
   the layers divide: dropping two devices can pay where dropping one does not. This
   only ever keeps a better plan.
8. **Lockstep** moves (`spantrain.policies.lockstep`): units enter a plan whole and
   each pipeline runs its units' chunks in chain order, so two kinds of plan lie outside
   steps 3-7: part of a unit (one more V100 in front of each of four pipelines, four of a
   site's seven: 16.8 % faster on a 64-device cloud-edge-end cluster with gpt2-xl), and
   device classes interleaved along a pipeline rather than in blocks (3.6 % on another,
   gpt2-medium). Single-device moves do not reach them, since the data-parallel pipelines
   must change together to stay balanced: a move here changes every pipeline of one class
   sequence alike (reorder the classes, drop a position, insert or swap in an idle device
   of one class), while it helps.
9. **Cuts** (`spantrain.policies.cuts`): move the layer cuts a layer or two while the cost
   model says it helps, data-parallel replicas of one kind alike. The partitioner's
   dynamic programming optimizes a per-stage proxy that leaves out warm-up, bubbles and
   sync (1.6 % on a 128-device geo cluster with llama2-7b).
10. **Uneven twins** (`spantrain.policies.uneven`): hand a set of devices from one
   data-parallel pipeline to its twin (same class sequence), the shares rebalanced and the
   cuts moved as in step 9; where the model barely fits a pipeline, a long and a short one
   can beat two equal ones (2.8 % on a 24-device datacenter cluster with llama2-7b: 17 and
   7 stages, not 12 and 12).

At batches that give a pipeline thousands of micro-batches, every step scores with the
cost model's screening (`CostModel.screened`: timings extrapolated from about a thousand
micro-batches, within 1e-3 of exact on the tests' random pipelines; memory never
under-counted), and the plan found is scored in full: llama2-7b at 65,536 samples plans
6-12x faster, the same plans on 47 of 48 cases measured.

The result is a valid plan with `predicted` filled, or a `PlannerError` when the model
fits nowhere (naming the memory needed against the largest device).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.evaluator import MICRO_BATCH_SIZES, Candidate, Evaluator, Knobs, Layout, sync_choices
from spantrain.errors import PlannerError
from spantrain.plan import SCHEDULES, Plan
from spantrain.planner import gc_paused
from spantrain.policies.cuts import refine_cuts
from spantrain.policies.feasibility import no_fit_error
from spantrain.policies.grouping import compute_units, network_groups
from spantrain.policies.lockstep import lockstep_refine, reorderings
from spantrain.policies.uneven import split_unevenly
from spantrain.workload import Workload

__all__ = ["HeuristicConfig", "HeuristicPlanner"]

Chain = tuple[tuple[int, ...], int]
"""(unit ids in pipeline order, pipeline count)."""
Structure = tuple[Chain, ...]

_SCREEN_KEEP = 4
"""A deep model's structure search ranks on coarse partitions; this many times `tune_top`
of its best are partitioned again in full, the best `tune_top` of those kept."""
_LONG_CHAIN = 16
"""A chain of more units than this sheds them in bulk (`_ChainSearch.bulk_drops`); shorter ones
try dropping each unit with every pipeline count."""
_P_STEPS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
"""Pipeline counts a chain may take (denser where the choice matters most)."""


@dataclass(frozen=True, kw_only=True)
class HeuristicConfig:
    """Options of the heuristic planner."""

    allow_local_sgd: bool = False
    """Let the search pick local-SGD sync (changes training semantics; off by default)."""
    tune_top: int = 3
    """Distinct layouts whose knobs (schedule, micro-batch, sync) are tuned at the end."""
    units_per_round: int = 8
    """Unused units considered for addition per greedy round (the most promising)."""
    max_rounds: int = 64
    """Upper bound on greedy structure rounds."""
    repick: int = 4
    """Best screened moves per round whose pipeline count is re-picked by a full scan."""

    def __post_init__(self) -> None:
        problems = []  # every one at once
        if not isinstance(self.allow_local_sgd, bool):
            problems.append(f"allow_local_sgd must be true or false, got {self.allow_local_sgd!r}")
        for name in ("tune_top", "units_per_round", "max_rounds", "repick"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                problems.append(f"{name} must be a positive integer, got {v!r}")
        if problems:
            raise PlannerError("heuristic: " + "; ".join(problems))


_PROBE = Knobs(micro_batch_size=1, schedule="1f1b", sync="hierarchical")
_ZB_PROBE = Knobs(micro_batch_size=1, schedule="zb-h2", sync="hierarchical")
_GPIPE_PROBE = Knobs(micro_batch_size=1, schedule="gpipe", sync="hierarchical")
_EXTRA_PASS_DEVICES = 24
"""Clusters up to this size always get the ZB-H2 and GPipe structure passes (step 6); larger ones only
the ZB-H2 pass, when the best plan so far has no pipeline of two stages (a pass costs up to 1.5x
planning time at 64 devices)."""


class HeuristicPlanner:
    """Grouping, chain search, device refinement and knob tuning (module docstring)."""

    name = "heuristic"

    def __init__(self, config: HeuristicConfig | None = None, **options):
        self.config = config or HeuristicConfig(**options)
        self.stats: dict[str, float] = {}

    def plan(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
        ev = Evaluator(cluster, workload, calibration=calibration)
        return ev.to_plan(self.best_candidate(ev))

    # ---- the search ---------------------------------------------------------------------

    def best_candidate(self, ev: Evaluator) -> Candidate:
        """Structure search, refinement and tuning; a second structure pass with the tuned
        knobs when they differ from the probe's (a zero-bubble schedule, for one, makes
        longer pipelines over slower links worth it)."""
        with gc_paused():
            if not ev.model.screens:
                return self._search(ev)
            with ev.model.screened():
                best = self._search(ev)
            return ev.score_built(best.built, best.knobs, layout=best.layout, shares=best.shares)

    def _search(self, ev: Evaluator) -> Candidate:
        t0 = time.perf_counter()
        search = _ChainSearch(ev, self.config)
        best, alt, origin = self._pass(search, _PROBE, None)
        # second pass under the tuned knobs, or the best zero-bubble ones when 1F1B stayed best,
        # or ZB-H1 when no zero-bubble plan fit the layouts tuned so far (fewer, longer
        # pipelines may), from the structure the best plan grew from
        if best.knobs != _PROBE:
            second: Knobs | None = best.knobs
        elif alt is not None and alt.feasible:
            second = alt.knobs
        elif any(len(p) > 1 for p in best.layout):
            second = Knobs(micro_batch_size=1, schedule="zb-h1", sync=_PROBE.sync)
        else:
            second = None
        gpipe_searched = False
        if best.feasible and second is not None:
            again, _, again_origin = self._pass(search, second, origin)
            gpipe_searched = second.schedule == "gpipe"
            if again.rank < best.rank:
                best, origin = again, again_origin
        finals = [best]
        small = len(search.ev.cluster) <= _EXTRA_PASS_DEVICES
        if best.feasible and best.knobs.schedule != "zb-h2" and (small or all(len(p) == 1 for p in best.layout)):
            # Refined under 1F1B, a pipeline over slow links sheds devices down to few stages or one, each
            # stage only adding bubbles; under ZB-H2, nearly bubble-free, the longer pipeline can win.
            again, _, _ = self._pass(search, _ZB_PROBE, None)
            if again.rank < best.rank:
                finals.append(again)  # all get the final steps: they need not keep their order
        if best.feasible and not gpipe_searched and (small or best.knobs.schedule == "gpipe"):
            # On high-latency links 1F1B and the zero-bubble schedules wait a round trip per micro-batch
            # where GPipe streams them: longer pipelines pay under GPipe only. Small clusters search
            # from scratch; large ones from the best plan's structure, once tuning has picked GPipe.
            again, _, _ = self._pass(search, _GPIPE_PROBE, None if small else origin)
            if again.rank < min(c.rank for c in finals):
                finals.append(again)
        best = min((self._order_long_pipelines(search, self._final_refine(search, c)) for c in finals),
                   key=lambda c: c.rank)
        best = self._uneven(ev, refine_cuts(ev, self._lockstep(ev, best)))
        self.stats = {"plan_s": time.perf_counter() - t0, "cost_model_calls": ev.calls, "units": len(search.units)}
        if not best.feasible:
            raise no_fit_error(ev.model, self.name)
        return best

    def _pass(self, search: _ChainSearch, knobs: Knobs, start: Structure | None
              ) -> tuple[Candidate, Candidate | None, Structure | None]:
        """One structure search, refinement and tuning: (best, best with a zero-bubble
        schedule, the structure the best came from)."""
        top = search.run(knobs, start)
        alone = search.fastest_alone(knobs)
        if alone is not None and alone.layout not in {c.layout for c in top}:
            top = [*top, alone]
        best: Candidate | None = None
        best_zb: Candidate | None = None
        origin: Structure | None = None
        seen: set[Layout] = set()
        for cand in top:
            refined = search.refine(cand)
            if refined.layout in seen:
                continue
            seen.add(refined.layout)
            if not refined.feasible:
                tuned, zb = refined, None
            else:
                tuned, zb = tune_knobs(search.ev, refined, self.config.allow_local_sgd)
            if best is None or tuned.rank < best.rank:
                best = tuned
                origin = search.structure_of(cand)
            if zb is not None and (best_zb is None or zb.rank < best_zb.rank):
                best_zb = zb
        assert best is not None
        return best, best_zb, origin

    def _final_refine(self, search: _ChainSearch, best: Candidate) -> Candidate:
        """Device moves under the final knobs, and under each schedule that does not fit
        the best layout's memory (dropping or moving a device can make a zero-bubble
        schedule fit); knobs tuned again when the layout changed."""
        if not best.feasible:
            return best
        ev = search.ev
        starts = [best]
        for schedule in SCHEDULES:
            if schedule != best.knobs.schedule and any(len(p) > 1 for p in best.layout):
                k = Knobs(micro_batch_size=1, schedule=schedule, sync=best.knobs.sync, period=best.knobs.period)
                c = ev.balance(best.layout, k, refit=0, moves=0)
                if not c.feasible:
                    starts.append(c)
        for start in starts:
            refined = search.refine(start)
            if refined.layout == best.layout or not refined.feasible:
                continue
            tuned, _ = tune_knobs(ev, refined, self.config.allow_local_sgd)
            if tuned.rank < best.rank:
                best = tuned
        return best

    def _order_long_pipelines(self, search: _ChainSearch, best: Candidate) -> Candidate:
        """Step 7 of the module docstring: best-improvement moves inside the pipelines of
        `_ORDER_STAGES` stages, knobs tuned again if the layout changed."""
        eligible = [i for i, pipe in enumerate(best.layout) if _reorderable(pipe)]
        if not best.feasible or not eligible:
            return best
        ev = search.ev
        cur = best
        labels = ev.classes
        for _ in range(_ORDER_ROUNDS):
            step = cur
            # one idle device per class of interchangeable devices: the others give the same plans
            idle = sorted({labels[d]: d for d in sorted(set(range(len(ev.cluster))).difference(*cur.layout),
                                                        reverse=True)}.values())
            moved: set[tuple[int, ...]] = set()
            for i in eligible:
                # pipelines equal up to interchangeable devices cost the same, and so do the
                # same moves on two such pipelines: score each once
                seen = {tuple(labels[d] for d in cur.layout[i])}
                if seen <= moved:
                    continue
                moved |= seen
                for pipe in _pipeline_moves(cur.layout[i], idle, search.device_group):
                    classes = tuple(labels[d] for d in pipe)
                    if classes in seen:
                        continue
                    seen.add(classes)
                    c = ev.balance((*cur.layout[:i], pipe, *cur.layout[i + 1:]), cur.knobs, refit=1, moves=0)
                    if _better(c, step):
                        step = c
            if step is cur:
                break
            cur = step
        if cur is best:
            return best
        tuned = self._retuned(ev, cur)
        return tuned if tuned.rank < best.rank else best

    def _lockstep(self, ev: Evaluator, best: Candidate) -> Candidate:
        """Step 8 of the module docstring: lockstep moves on the pipelines of one class
        sequence; knobs tuned again if the layout changed."""
        moved = lockstep_refine(ev, best)
        if moved is best:
            return best
        tuned = self._retuned(ev, moved)
        return tuned if tuned.rank < best.rank else moved

    def _uneven(self, ev: Evaluator, best: Candidate) -> Candidate:
        """Step 10 of the module docstring, on a plan whose cuts step 9 moved: devices
        handed from one data-parallel pipeline to its twin; knobs tuned again if the
        layout changed."""
        moved = split_unevenly(ev, best)
        if moved is best:
            return best
        tuned = self._retuned(ev, moved)
        if tuned.knobs == moved.knobs:  # the same plan, its cuts the partitioner's again
            return moved
        tuned = refine_cuts(ev, tuned)
        return tuned if tuned.rank < moved.rank else moved

    def _retuned(self, ev: Evaluator, moved: Candidate) -> Candidate:
        """`moved`'s layout with its knobs tuned again (steps 7-9 after a layout change)."""
        tuned, _ = tune_knobs(ev, ev.balance(moved.layout, moved.knobs, shares=moved.shares),
                              self.config.allow_local_sgd)
        return tuned


_ORDER_STAGES = (11, 16)
"""Pipeline lengths step 7 works on (shorter ones get run moves in step 4; longer ones
would cost more than the planning-time budget allows)."""
_ORDER_ROUNDS = 8
"""Upper bound on step 7's improving rounds."""


def _reorderable(pipe: tuple[int, ...]) -> bool:
    return _ORDER_STAGES[0] <= len(pipe) <= _ORDER_STAGES[1]


def _pipeline_moves(pipe: tuple[int, ...], idle: list[int], group: np.ndarray) -> list[tuple[int, ...]]:
    """Step 7's neighbours of a pipeline, each once: its reorderings; every device dropped;
    every run of one network group's devices trimmed by 2 or more at its head or tail
    (keeping one); every idle device of a group the pipeline uses inserted next to a device
    of its group and, so placed (anywhere when it replaced its group's last device),
    replacing each device. At most `_ORDER_STAGES[1]` stages. (Groups the pipeline does
    not use are the structure search's business: units join chains there.)"""
    out = reorderings(pipe)
    S = len(pipe)
    out += [pipe[:k] + pipe[k + 1:] for k in range(S)]
    start = 0
    for end in range(1, S + 1):
        if end == S or group[pipe[end]] != group[pipe[start]]:
            for k in range(2, end - start):
                out += [pipe[:end - k] + pipe[end:], pipe[:start] + pipe[start + k:]]
            start = end

    def placed(base: tuple[int, ...], d: int) -> list[tuple[int, ...]]:
        near = [j for j in range(len(base) + 1)
                if (j > 0 and group[base[j - 1]] == group[d]) or (j < len(base) and group[base[j]] == group[d])]
        return [(*base[:j], d, *base[j:]) for j in (near or range(len(base) + 1))]

    used = set(group[list(pipe)].tolist())
    longest = _ORDER_STAGES[1]
    for d in idle:
        if group[d] not in used:
            continue
        if longest > S:
            out += placed(pipe, d)
        for k in range(S):
            out += placed(pipe[:k] + pipe[k + 1:], d)
    seen = {pipe}
    return [q for q in out if not (q in seen or seen.add(q))]


def tune_knobs(ev: Evaluator, cand: Candidate, allow_local_sgd: bool) -> tuple[Candidate, Candidate | None]:
    """Best knobs for a layout: every schedule and sync choice, micro-batch sizes upward
    while they help, batch shares re-balanced for each. Returns (best, best with a
    zero-bubble schedule or None when every pipeline has one stage)."""
    best = cand
    best_zb: Candidate | None = None
    layout = cand.layout
    syncs = sync_choices(allow_local_sgd) if len(layout) > 1 else [("allreduce", 1)]
    # one-stage pipelines run the same ops in the same order under every schedule
    schedules = SCHEDULES if any(len(p) > 1 for p in layout) else ("1f1b",)
    for schedule in schedules:
        for mode, period in syncs:
            prev = math.inf
            for m in MICRO_BATCH_SIZES:
                if m > ev.batch:
                    break
                knobs = Knobs(micro_batch_size=m, schedule=schedule, sync=mode, period=period)
                c = ev.balance(layout, knobs, shares=best.shares if best.knobs.micro_batch_size == m else None)
                if c.time < best.time:
                    best = c
                if schedule.startswith("zb") and c.feasible and (best_zb is None or c.time < best_zb.time):
                    best_zb = c
                if c.time >= prev:
                    break
                prev = c.time
    return best, best_zb


class _ChainSearch:
    """Greedy search over chain structures (module docstring, steps 2-4)."""

    def __init__(self, ev: Evaluator, config: HeuristicConfig):
        self.ev = ev
        self.config = config
        cluster = ev.cluster
        self.L = ev.model.num_layers
        self.B = ev.batch
        groups = network_groups(cluster)
        tflops = cluster.tflops
        mem = cluster.memory_bytes
        units: list[tuple[int, ...]] = []
        unit_group: list[int] = []
        for g, parts in enumerate(compute_units(cluster, groups)):
            for part in parts:
                # memory first: a pipeline's first stages keep the most micro-batches in flight
                units.append(tuple(sorted(part, key=lambda d: (-mem[d], -tflops[d], d))))
                unit_group.append(g)
        self.units = units
        self.unit_group = unit_group
        self.groups = groups
        self.device_group = np.empty(len(cluster), dtype=np.int64)
        for g, members in enumerate(groups):
            self.device_group[members] = g
        self.unit_speed = np.array([tflops[list(u)].sum() for u in units])
        bw = np.asarray(cluster.bandwidth)
        self.bws = np.minimum(bw, bw.T)
        self._chunks: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        self._scores: dict[tuple[Structure, Knobs], Candidate] = {}
        self._structure_of: dict[Layout, Structure] = {}
        self._alone_p: dict[int, int] = {}
        self.knobs = _PROBE

    # ---- structures -> layouts --------------------------------------------------------------

    def chunks(self, u: int, P: int) -> list[tuple[int, ...]]:
        """Unit u dealt into P chunks of balanced TFLOP/s (largest first to the lightest)."""
        key = (u, P)
        hit = self._chunks.get(key)
        if hit is None:
            tflops = self.ev.cluster.tflops
            devs = self.units[u]
            load = [0.0] * P
            parts: list[list[int]] = [[] for _ in range(P)]
            for d in sorted(devs, key=lambda d: -tflops[d]):
                k = min(range(P), key=lambda i: (load[i], len(parts[i])))
                parts[k].append(d)
                load[k] += tflops[d]
            order = {d: i for i, d in enumerate(devs)}
            hit = [tuple(sorted(p, key=order.__getitem__)) for p in parts]
            self._chunks[key] = hit
        return hit

    def layout(self, structure: Structure) -> Layout | None:
        pipes: list[tuple[int, ...]] = []
        for units, P in structure:
            parts = [self.chunks(u, P) for u in units]
            for i in range(P):
                pipe = tuple(d for part in parts for d in part[i])
                if not pipe or len(pipe) > self.L:
                    return None
                pipes.append(pipe)
        if not pipes or len(pipes) > self.B:
            return None
        return tuple(pipes)

    def score(self, structure: Structure) -> Candidate:
        """The structure's candidate under the current knobs (memoized)."""
        key = (structure, self.knobs)
        hit = self._scores.get(key)
        if hit is None:
            layout = self.layout(structure)
            if layout is None:
                hit = Candidate(time=math.inf, layout=(), shares=(), knobs=self.knobs, note="not buildable")
            else:
                hit = self.ev.balance(layout, self.knobs, refit=0, moves=0)
                self._structure_of.setdefault(layout, structure)
            self._scores[key] = hit
        return hit

    def fastest_alone(self, knobs: Knobs) -> Candidate | None:
        """The fastest device that holds the whole model, alone (None when none does). The
        structure search deals out whole units, so a unit whose own links are slow enters
        a plan with all its devices or not at all; one device of it, alone, can beat both."""
        cluster = self.ev.cluster
        mem = cluster.memory_bytes
        too_small = 0.0  # a device with no more memory than one that did not hold it does not either
        for d in sorted(range(len(cluster)), key=lambda d: (-cluster.tflops[d], -mem[d], d)):
            if mem[d] <= too_small:
                continue
            cand = self.ev.balance(((d,),), knobs, refit=0, moves=0)
            if cand.feasible:
                return cand
            too_small = max(too_small, float(mem[d]))
        return None

    def structure_of(self, cand: Candidate) -> Structure | None:
        """The structure a candidate's layout was built from (None after refinement changed it)."""
        return self._structure_of.get(cand.layout)

    def p_options(self, units: tuple[int, ...]) -> list[int]:
        n = sum(len(self.units[u]) for u in units)
        biggest = max(len(self.units[u]) for u in units)
        lo = max(1, math.ceil(n / self.L))
        hi = min(biggest, self.B)
        return [p for p in _P_STEPS if lo <= p <= hi] or ([lo] if lo <= hi else [])

    def best_p(self, rest: Structure, units: tuple[int, ...]) -> tuple[Candidate, Structure] | None:
        """Best pipeline count for a chain of `units` next to the chains `rest`. Counts
        that deal every unit evenly come first; the others are scanned from small to
        large, stopping three steps past the best (times are roughly unimodal in P, but
        uneven chunks make dents)."""
        options = self.p_options(units)
        sizes = [len(self.units[u]) for u in units]
        even = [p for p in options if all(n % p == 0 for n in sizes)]
        best: tuple[Candidate, Structure] | None = None
        for P in even:
            s = _canon((*rest, (units, P)))
            c = self.score(s)
            if best is None or c.rank < best[0].rank:
                best = (c, s)
        worse = 0
        for P in options:
            if P in even:
                continue
            s = _canon((*rest, (units, P)))
            c = self.score(s)
            if best is None or c.rank < best[0].rank:
                best = (c, s)
                worse = 0
            elif best[0].feasible:
                worse += 1
                if worse >= 3:
                    break
        return best

    # ---- greedy search -----------------------------------------------------------------

    def initial(self) -> list[tuple[Candidate, Structure]]:
        out = []
        U = len(self.units)
        for u in range(U):
            r = self.best_p((), (u,))
            if r:
                out.append(r)
                self._alone_p[u] = r[1][0][1]
        for g in range(len(self.groups)):
            members = tuple(u for u in range(U) if self.unit_group[u] == g)
            if len(members) > 1:
                r = self.best_p((), members)
                if r:
                    out.append(r)
        # every device its own replica (DDP-like) and every device in one chain (Megatron-like)
        ddp = _canon(tuple(((u,), len(self.units[u])) for u in range(U)))
        out.append((self.score(ddp), ddp))
        if U > 1:
            order = self.path_order(list(range(U)))
            r = self.best_p((), tuple(order))
            if r:
                out.append(r)
        return out

    def path_order(self, units: list[int]) -> list[int]:
        """Units in a path that follows fast links: start from the unit with the most
        memory (it holds the embedding and the most in-flight micro-batches) and go to
        the best-connected next unit."""
        mem = self.ev.cluster.memory_bytes
        left = list(units)
        cur = max(left, key=lambda u: mem[list(self.units[u])].sum())
        order = [cur]
        left.remove(cur)
        while left:
            nxt = max(left, key=lambda u: self.unit_link(cur, u))
            order.append(nxt)
            left.remove(nxt)
            cur = nxt
        return order

    def unit_link(self, a: int, b: int) -> float:
        return float(self.bws[np.ix_(self.units[a], self.units[b])].max()) if a != b else math.inf

    def promising(self, structure: Structure, count: int) -> list[int]:
        """Unused units most worth adding: the fastest and the best connected to the plan."""
        used = {u for units, _ in structure for u in units}
        free = [u for u in range(len(self.units)) if u not in used]
        if len(free) <= count:
            return free
        by_speed = sorted(free, key=lambda u: -self.unit_speed[u])
        used_devs = [d for u in used for d in self.units[u]]

        def conn(u):
            return float(self.bws[np.ix_(self.units[u], used_devs)].max()) * self.unit_speed[u]

        by_link = sorted(free, key=lambda u: -conn(u))
        picked: list[int] = []
        for a, b in zip(by_speed, by_link):
            for u in (a, b):
                if u not in picked:
                    picked.append(u)
            if len(picked) >= count:
                break
        return picked[:count]

    def proposals(self, structure: Structure) -> list[tuple[Structure, tuple[int, ...], int]]:
        """Neighbouring structures as (other chains, changed chain's units, pipeline count
        hint): add an unused unit as a new chain or inside a chain, merge two chains, drop
        a unit, move a unit elsewhere in its chain."""
        out: list[tuple[Structure, tuple[int, ...], int]] = []
        chains = list(structure)
        for u in self.promising(structure, self.config.units_per_round):
            out.append((structure, (u,), self._alone_p.get(u, len(self.units[u]))))
            for i, (units, P) in enumerate(chains):
                rest = tuple(chains[:i] + chains[i + 1:])
                for pos in range(len(units) + 1):
                    out.append((rest, (*units[:pos], u, *units[pos:]), P))
        for i in range(len(chains)):
            for j in range(len(chains)):
                if i != j:
                    rest = tuple(c for k, c in enumerate(chains) if k not in (i, j))
                    out.append((rest, chains[i][0] + chains[j][0], min(chains[i][1], chains[j][1])))
        for i, (units, P) in enumerate(chains):
            rest = tuple(chains[:i] + chains[i + 1:])
            for pos in range(len(units)):
                left = units[:pos] + units[pos + 1:]
                # move the unit elsewhere in its chain (the first stages hold the most
                # micro-batches; the order decides which links the activations cross);
                # long chains: only neighbouring swaps, to keep a round linear in the chain
                for new in range(len(units)):
                    if new != pos and (len(units) <= 6 or abs(new - pos) == 1):
                        out.append((rest, (*left[:new], units[pos], *left[new:]), P))
        return out

    def moves(self, structure: Structure) -> list[tuple[Candidate, Structure]]:
        """Scored neighbours: every proposal at its hinted pipeline count, then the best
        few with the pipeline count re-picked; every chain as it is and with each of its
        units dropped always gets the full pipeline-count scan (shrinking is how a plan
        sheds devices that only slow it, and a smaller chain often wants another count); a
        chain of over `_LONG_CHAIN` units sheds them in bulk instead (`bulk_drops`)."""
        chains = list(structure)
        screened: list[tuple[Candidate, Structure, tuple[Structure, tuple[int, ...]]]] = []
        for rest, units, hint in self.proposals(structure):
            options = self.p_options(units)
            if not options:
                continue
            P = min(options, key=lambda p: (abs(p - hint), p))
            s = _canon((*rest, (units, P)))
            screened.append((self.score(s), s, (rest, units)))
        for i, (units, _) in enumerate(chains):
            rest = tuple(chains[:i] + chains[i + 1:])
            if not rest and len(units) == 1:
                continue
            if len(units) == 1 and rest:
                s = _canon(rest)  # drop the chain entirely
                screened.append((self.score(s), s, (rest, ())))
        out = [(c, s) for c, s, _ in screened]
        screened.sort(key=lambda x: x[0].rank)
        picked: list[tuple[Structure, tuple[int, ...]]] = []
        for i, (units, P) in enumerate(chains):
            rest = tuple(chains[:i] + chains[i + 1:])
            picked.append((rest, units))
            if len(units) > _LONG_CHAIN:
                out += self.bulk_drops(rest, units, P)
            elif len(units) > 1:
                picked += [(rest, units[:pos] + units[pos + 1:]) for pos in range(len(units))]
        fixed = len(picked)
        for _, _, key in screened:
            if len(picked) >= fixed + self.config.repick:
                break
            if key[1] and key not in picked:
                picked.append(key)
        for rest, units in picked:
            r = self.best_p(rest, units)
            if r:
                out.append(r)
        return out

    def bulk_drops(self, rest: Structure, units: tuple[int, ...], P: int) -> list[tuple[Candidate, Structure]]:
        """A long chain's drops: each unit dropped, scored at the chain's pipeline count; the
        best few of those with the count re-picked, and the best 2, 4, 8, ... (up to half the
        chain) dropped together. Dropped one at a time with every count scanned, a chain of
        128 datacenter nodes shed one node per 40 s round."""
        singles = []
        for pos in range(len(units)):
            left = units[:pos] + units[pos + 1:]
            options = self.p_options(left)
            if options:
                s = _canon((*rest, (left, min(options, key=lambda p: (abs(p - P), p)))))
                singles.append((self.score(s), s, pos))
        singles.sort(key=lambda x: x[0].rank)
        out = [(c, s) for c, s, _ in singles]
        drops = [{pos} for _, _, pos in singles[: self.config.repick]]
        k = 2
        while k <= min(len(singles), len(units) // 2):
            drops.append({pos for _, _, pos in singles[:k]})
            k *= 2
        for drop in drops:
            r = self.best_p(rest, tuple(u for j, u in enumerate(units) if j not in drop))
            if r:
                out.append(r)
        return out

    def run(self, knobs: Knobs, start: Structure | None = None) -> list[Candidate]:
        """Greedy structure search under `knobs` from `start` (or from the best initial
        structure); the best structures found, best first, as candidates."""
        self.knobs = knobs
        # a deep model's structures are ranked on coarse partitions (`Partitioner.screened`:
        # refining each took 2/3 of planning on 1,024 devices); the ones kept, in full
        with self.ev.part.screened():
            if start is None:
                # infeasible starts rank by memory shortfall, so the greedy first grows towards a fit
                cur = min(self.initial(), key=lambda x: x[0].rank)
            else:
                cur = (self.score(start), start)
            for _ in range(self.config.max_rounds):
                options = self.moves(cur[1])
                if not options:
                    break
                nxt = min(options, key=lambda x: x[0].rank)
                if not _better(nxt[0], cur[0]):
                    break
                cur = nxt
            ranked = sorted((c for (_, k), c in self._scores.items() if k == knobs and c.layout),
                            key=lambda c: c.rank)
        if self.ev.part.coarse:
            # coarse and refined partitions rank layouts differently (either may be faster by
            # the cost model), so more than the few kept are partitioned again in full
            ranked = sorted((self.ev.balance(c.layout, knobs, refit=0, moves=0)
                             for c in ranked[: _SCREEN_KEEP * self.config.tune_top]), key=lambda c: c.rank)
        return ranked[: self.config.tune_top]

    # ---- device refinement --------------------------------------------------------------------

    def refine(self, cand: Candidate) -> Candidate:
        """Local search on the layout with the probe knobs: drop a pipeline, drop a device,
        or move a device to another position of its pipeline, taking the best move while
        it helps."""
        ev = self.ev
        cur = cand
        for _ in range(4 * len(cand.layout) + 8):
            best = cur
            for lay in self._neighbours(cur.layout, small=len(cur.layout) <= 4):
                c = ev.balance(lay, cur.knobs, refit=1, moves=0)
                if _better(c, best):
                    best = c
            if best is cur:
                break
            cur = best
        return ev.balance(cur.layout, cur.knobs, shares=cur.shares) if cur.feasible else cur

    def _neighbours(self, layout: Layout, small: bool) -> list[Layout]:
        out: list[Layout] = []
        if len(layout) > 1:
            for i in range(len(layout)):
                out.append(layout[:i] + layout[i + 1:])
        for i, pipe in enumerate(layout):
            S = len(pipe)
            if S < 2:
                continue
            for k in self._drop_candidates(pipe):
                out.append((*layout[:i], pipe[:k] + pipe[k + 1:], *layout[i + 1:]))
            if small and S <= 10:
                # every run of 1-3 devices to every other position (memory and links depend on
                # the order; moving a run keeps neighbours on a fast link together)
                seen = {pipe}
                for length in (1, 2, 3):
                    for k in range(S - length + 1):
                        run = pipe[k:k + length]
                        rest = pipe[:k] + pipe[k + length:]
                        for j in range(len(rest) + 1):
                            new = (*rest[:j], *run, *rest[j:])
                            if new not in seen:
                                seen.add(new)
                                out.append((*layout[:i], new, *layout[i + 1:]))
        return out

    def _drop_candidates(self, pipe: tuple[int, ...]) -> list[int]:
        """Positions worth trying to drop: all in short pipelines; else every device of the
        lowest TFLOP/s or memory and the ends of the slowest link."""
        if len(pipe) <= 10:
            return list(range(len(pipe)))
        tflops = self.ev.cluster.tflops[list(pipe)]
        mem = self.ev.cluster.memory_bytes[list(pipe)]
        out = set(np.flatnonzero(tflops == tflops.min()).tolist()) | set(np.flatnonzero(mem == mem.min()).tolist())
        links = [self.bws[pipe[k], pipe[k + 1]] for k in range(len(pipe) - 1)]
        k = int(np.argmin(links))
        out |= {k, k + 1}
        return sorted(out)


def _better(a: Candidate, b: Candidate) -> bool:
    """Whether a beats b by more than noise: feasible over infeasible, then 0.01 % faster
    (or, both infeasible, 0.01 % less memory shortfall)."""
    if a.feasible != b.feasible:
        return a.feasible
    if a.feasible:
        return a.time < b.time * (1 - 1e-4)
    return a.shortfall < b.shortfall * (1 - 1e-4)


def _canon(structure: Structure) -> Structure:
    """Chains in a canonical order, so equal structures share a memo entry."""
    return tuple(sorted(structure))
