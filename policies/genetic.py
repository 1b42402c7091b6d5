"""`ga`: a DT-FM-style genetic search over device-to-stage assignment.

DT-FM (Yuan et al., 2022) places a pipeline-parallel x data-parallel grid on a
heterogeneous network with an evolutionary search over which devices form which stage
group. Here the genome is

- a permutation of all devices, and grid degrees PP x DP with PP x DP <= devices: the
  first PP x DP devices of the permutation fill the grid, stage i's data-parallel group
  being positions [i DP, (i+1) DP) and pipeline j taking position i DP + j of every
  stage; the rest stay idle;
- the knobs: micro-batch size (1, 2, 4, 8), schedule, sync mode (local SGD only with
  `allow_local_sgd`).

Fitness is the cost model's iteration time of the decoded plan with the same layer
partition (dynamic programming per pipeline) and batch shares as the other planners
(`Evaluator.balance`), so only the search differs. Tournament selection (3), order
crossover on the permutation, mutations (swap two devices, move a device into or out
of the grid, change a degree, change a knob), two elites, until `budget_s` seconds
have passed. Deterministic for a seed and a number of generations; the budget decides
how many generations run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.env.evaluator import MICRO_BATCH_SIZES, Candidate, Evaluator, Knobs, sync_choices
from spantrain.errors import PlannerError
from spantrain.plan import SCHEDULES, Plan
from spantrain.policies.feasibility import fits_nowhere, no_fit_error
from spantrain.policies.train_config import MAX_SEED
from spantrain.workload import Workload

__all__ = ["GeneticConfig", "GeneticPlanner", "MAX_BUDGET_S"]

MAX_BUDGET_S = 86400.0
"""The longest search: a day (a larger figure is a typo, and the search would run it out)."""


@dataclass(frozen=True, kw_only=True)
class GeneticConfig:
    """Options of the genetic planner."""

    budget_s: float = 10.0
    """Seconds of search (wall clock)."""
    seed: int = 0
    """Seed of the random generator."""
    population: int = 32
    """Individuals per generation."""
    allow_local_sgd: bool = False
    """Let the search pick local-SGD sync (changes training semantics; off by default)."""
    max_generations: int | None = None
    """Stop after this many generations even with budget left (None: only the budget)."""

    def __post_init__(self) -> None:
        # every problem at once, as the other configs; a seed of -1 was numpy's ValueError mid-plan
        problems = []
        if isinstance(self.budget_s, bool) or not isinstance(self.budget_s, (int, float)) or \
                not (0 < self.budget_s <= MAX_BUDGET_S):
            problems.append(f"budget_s must be a number of seconds in (0, {MAX_BUDGET_S:g}], got {self.budget_s!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed <= MAX_SEED:
            problems.append(f"seed must be an integer from 0 to {MAX_SEED}, got {self.seed!r}")
        if isinstance(self.population, bool) or not isinstance(self.population, int) or self.population < 4:
            problems.append(f"population must be an integer >= 4, got {self.population!r}")
        if not isinstance(self.allow_local_sgd, bool):
            problems.append(f"allow_local_sgd must be true or false, got {self.allow_local_sgd!r}")
        g = self.max_generations
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or g < 1):
            problems.append(f"max_generations must be a positive integer or None, got {g!r}")
        if problems:
            raise PlannerError("ga: " + "; ".join(problems))


@dataclass(frozen=True)
class _Genome:
    perm: tuple[int, ...]
    pp: int
    dp: int
    m: int
    schedule: str
    sync: tuple[str, int]


class GeneticPlanner:
    """Genetic search over PP x DP grids (module docstring)."""

    name = "ga"

    def __init__(self, config: GeneticConfig | None = None, **options):
        self.config = config or GeneticConfig(**options)
        self.stats: dict[str, float] = {}

    def plan(self, cluster: Cluster, workload: Workload, calibration: Calibration | None = None) -> Plan:
        ev = Evaluator(cluster, workload, calibration=calibration)
        return ev.to_plan(self.best_candidate(ev))

    def best_candidate(self, ev: Evaluator) -> Candidate:
        cfg = self.config
        t0 = time.perf_counter()
        rng = np.random.default_rng(cfg.seed)
        n = len(ev.cluster)
        if fits_nowhere(ev.model):  # say so now, not after the whole budget
            raise no_fit_error(ev.model, self.name)
        self._n = n
        self._L = ev.model.num_layers
        self._B = ev.batch
        self._syncs = sync_choices(cfg.allow_local_sgd)
        self._fitness: dict[_Genome, Candidate] = {}
        self._ev = ev
        pop = self._initial(rng)
        scored = [(self._score(g), g) for g in pop]
        gens = 0
        while time.perf_counter() - t0 < cfg.budget_s:
            if cfg.max_generations is not None and gens >= cfg.max_generations:
                break
            gens += 1
            scored.sort(key=lambda x: x[0].rank)
            nxt = [g for _, g in scored[:2]]
            while len(nxt) < cfg.population:
                a = self._tournament(scored, rng)
                b = self._tournament(scored, rng)
                child = self._crossover(a, b, rng) if rng.random() < 0.7 else a
                child = self._mutate(child, rng)
                nxt.append(child)
            scored = []
            for g in nxt:
                scored.append((self._score(g), g))
                if time.perf_counter() - t0 >= cfg.budget_s:
                    break
        best = min((c for c, _ in scored), key=lambda c: c.rank)
        best = min(best, *self._fitness.values(), key=lambda c: c.rank)
        if best.feasible:
            best = min(best, ev.balance(best.layout, best.knobs, shares=best.shares), key=lambda c: c.rank)
        self.stats = {"generations": gens, "evaluated": len(self._fitness), "plan_s": time.perf_counter() - t0}
        if not best.feasible:
            raise no_fit_error(ev.model, self.name)
        return best

    # ---- genome ------------------------------------------------------------------------

    def _degrees(self, rng: np.random.Generator, count: int) -> tuple[int, int]:
        """Random PP x DP with PP <= layers, DP <= batch and PP x DP <= count."""
        pp = int(rng.integers(1, min(self._L, count) + 1))
        dp = int(rng.integers(1, min(self._B, count // pp) + 1))
        return pp, dp

    def _initial(self, rng: np.random.Generator) -> list[_Genome]:
        n = self._n
        tflops = self._ev.cluster.tflops
        fastest = tuple(int(i) for i in np.argsort(-tflops, kind="stable"))
        out: list[_Genome] = []
        # seeds: spec order and fastest-first as one pipeline, and as a full grid
        for perm in (tuple(range(n)), fastest):
            for pp in sorted({min(n, self._L), 1, max(1, min(self._L, n // max(1, min(self._B, n))))}):
                dp = max(1, min(self._B, n // pp))
                out.append(_Genome(perm, pp, dp, 1, "1f1b", self._syncs[0]))
        while len(out) < self.config.population:
            perm = tuple(int(i) for i in rng.permutation(n))
            pp, dp = self._degrees(rng, n)
            out.append(_Genome(perm, pp, dp, int(rng.choice(MICRO_BATCH_SIZES)), str(rng.choice(SCHEDULES)),
                               self._syncs[int(rng.integers(len(self._syncs)))]))
        return out

    def _layout(self, g: _Genome) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(g.perm[i * g.dp + j] for i in range(g.pp)) for j in range(g.dp))

    def _score(self, g: _Genome) -> Candidate:
        hit = self._fitness.get(g)
        if hit is None:
            knobs = Knobs(micro_batch_size=g.m, schedule=g.schedule, sync=g.sync[0], period=g.sync[1])
            hit = self._ev.balance(self._layout(g), knobs, refit=1, moves=0)
            self._fitness[g] = hit
        return hit

    def _tournament(self, scored, rng: np.random.Generator) -> _Genome:
        picks = rng.choice(len(scored), size=min(3, len(scored)), replace=False)
        return min((scored[int(k)] for k in picks), key=lambda x: x[0].rank)[1]

    def _crossover(self, a: _Genome, b: _Genome, rng: np.random.Generator) -> _Genome:
        """Order crossover: a slice of a's permutation, the rest in b's order."""
        n = self._n
        i, j = sorted(int(x) for x in rng.choice(n + 1, size=2, replace=False))
        middle = a.perm[i:j]
        taken = set(middle)
        rest = [d for d in b.perm if d not in taken]
        perm = tuple(rest[:i]) + middle + tuple(rest[i:])
        pick = a if rng.random() < 0.5 else b
        return _Genome(perm, pick.pp, pick.dp, (a if rng.random() < 0.5 else b).m,
                       (a if rng.random() < 0.5 else b).schedule, (a if rng.random() < 0.5 else b).sync)

    def _mutate(self, g: _Genome, rng: np.random.Generator) -> _Genome:
        perm = list(g.perm)
        pp, dp, m, schedule, sync = g.pp, g.dp, g.m, g.schedule, g.sync
        n = self._n
        for _ in range(1 + int(rng.integers(2))):
            r = rng.random()
            if r < 0.45 and n > 1:
                i, j = (int(x) for x in rng.choice(n, size=2, replace=False))
                perm[i], perm[j] = perm[j], perm[i]
            elif r < 0.65:
                used = pp * dp
                if used < n:  # bring an idle device into the grid (or send one out)
                    i = int(rng.integers(used))
                    j = int(rng.integers(used, n))
                    perm[i], perm[j] = perm[j], perm[i]
            elif r < 0.8:
                if rng.random() < 0.5:
                    pp = int(np.clip(pp + rng.choice((-1, 1)), 1, min(self._L, n)))
                    dp = max(1, min(dp, n // pp, self._B))
                else:
                    dp = int(np.clip(dp + rng.choice((-1, 1)), 1, min(self._B, n)))
                    pp = max(1, min(pp, n // dp, self._L))
            elif r < 0.88:
                m = int(rng.choice(MICRO_BATCH_SIZES))
            elif r < 0.96:
                schedule = str(rng.choice(SCHEDULES))
            else:
                sync = self._syncs[int(rng.integers(len(self._syncs)))]
        return _Genome(tuple(perm), pp, dp, m, schedule, sync)
