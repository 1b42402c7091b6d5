"""The Gymnasium environment: improve a running plan by moves, scored by the cost model.

An episode draws a cluster (a generator profile, 4-32 devices, a seed), a workload and
a starting plan: a planner's plan (the heuristic's in training, see `StartProvider`),
or, in an *adaptation* episode, the plan that was running before the network changed
(one region pair's or region's bandwidth drops or rises, latency moves with it). Each
step applies one move (`spantrain.env.moves`: move or swap a device, idle it, give it
its own pipeline, change the schedule, sync mode or micro-batch size, or stop); the
layer partitions and batch shares follow from the layout by dynamic programming and
rebalancing (`Evaluator.balance`).

Reward: ``scale * log(effective throughput after / before)`` where effective throughput
over the remaining `horizon` iterations is ``H * batch / (H * iteration_s + migration_s)``
and migration_s is the time to move weights and optimizer state (16 bytes per
parameter) to devices that hold layers they did not hold in the running plan (zero
outside adaptation episodes). The per-step rewards telescope to the log-ratio of the
final plan over the start. A move whose plan does not fit memory is rejected (the plan
stays) with a small penalty. Invalid actions (masked for a policy, but possible for a
random sampler) are rejected the same way, so every episode ends on a valid, feasible
plan.

All randomness comes from ``self.np_random``; clusters come from the deterministic
generator given a drawn seed. Registered as ``spantrain/PlanImprove-v0``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from spantrain.cluster import MAX_DEVICES, Cluster
from spantrain.env.evaluator import Candidate, Evaluator, Knobs, Layout
from spantrain.env.moves import action_mask, apply_move, roles
from spantrain.env.spaces import EDGE_FEATURES, GLOBAL_FEATURES, KNOBS, NODE_FEATURES, ActionLayout
from spantrain.errors import SpantrainError, SpecError, WorkloadError, join_problems
from spantrain.plan import SCHEDULES
from spantrain.profiler.topology import PROFILES, generate
from spantrain.workload import PRESETS, Workload

__all__ = ["EnvConfig", "Scenario", "StartProvider", "PlanEnv", "ENV_ID", "simple_start", "network_change",
           "scenario_pool", "scenario_workload", "held_layers", "as_running"]

ENV_ID = "spantrain/PlanImprove-v0"

StartProvider = Callable[[tuple, Evaluator], Candidate]
"""(scenario key, evaluator) -> the starting candidate; raise SpantrainError to skip the scenario."""

_BOUND = 10.0  # features are log-scaled to about [-3, 3]; clipped here so the spaces are exact
_TIERS = ("cloud", "edge", "end")


@dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """What episodes the environment draws."""

    max_devices: int = 32
    """Device slots in observations and actions (padding size)."""
    min_devices: int = 4
    """Fewest devices of a drawn cluster."""
    profiles: tuple[str, ...] = PROFILES
    """Generator profiles to draw from."""
    models: tuple[str, ...] = ("gpt2-medium", "gpt2-xl", "llama2-7b")
    """Workload presets to draw from."""
    batch_scales: tuple[int, ...] = (1, 4)
    """Multipliers on the preset's global batch (more samples make more structures worth it)."""
    seed_range: tuple[int, int] = (0, 100_000)
    """Cluster seeds are drawn from [lo, hi); keep evaluation seeds outside it."""
    pool_size: int = 0
    """When > 0, episodes draw from a fixed pool of this many scenarios (`scenario_pool`),
    so that expensive starting plans can be computed once and cached."""
    pool_seed: int = 0
    """Seed of the pool's scenarios (independent of the episode seed)."""
    max_steps: int = 12
    """Moves per episode before truncation."""
    adapt_prob: float = 0.25
    """Probability that an episode is an adaptation to a network change."""
    horizon: int = 500
    """Iterations left in the run, over which a migration's cost is amortized."""
    reward_scale: float = 10.0
    """Multiplier on the log-ratio reward (keeps returns near unit scale)."""
    invalid_penalty: float = 0.05
    """Reward of a rejected move (invalid or does not fit memory)."""
    start_kicks: int = 0
    """Up to this many random valid moves (drawn uniformly from 0..start_kicks) applied to
    the starting plan at reset, before any network change: states off the planner's
    optimum, from which a policy learns repairs (0: start as planned)."""

    def __post_init__(self) -> None:
        # every problem at once, each naming its field: a string, None or nan here was a TypeError,
        # or was taken (models="gpt2-medium" as 11 one-letter models, reward_scale=nan as nan rewards)
        problems: list[str] = []

        def whole(name: str, lo: int) -> bool:
            value = getattr(self, name)
            if not _whole(value) or value < lo:
                problems.append(f"EnvConfig.{name} must be an integer >= {lo}, got {value!r}")
                return False
            return True

        def names(name: str, known) -> None:
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, tuple | list) or not value:
                problems.append(f"EnvConfig.{name} must be a non-empty tuple of names, got {value!r}")
                return
            for x in value:
                if not isinstance(x, str) or x not in known:
                    problems.append(f"EnvConfig.{name}: unknown name {x!r} (choose from {', '.join(known)})")

        sizes_ok = whole("max_devices", 2) & whole("min_devices", 2)
        if sizes_ok and self.max_devices > MAX_DEVICES:
            # the spaces alone hold max_devices^2 edge features: 10,000 slots asked for 4.8 GB before any episode
            problems.append(f"EnvConfig.max_devices must be at most {MAX_DEVICES} (the largest cluster), "
                            f"got {self.max_devices}")
        elif sizes_ok and self.min_devices > self.max_devices:
            # EnvConfig(max_devices=2) alone was refused as "min_devices must be in [2, max_devices], got 4"
            problems.append(f"EnvConfig.min_devices ({self.min_devices}) is above EnvConfig.max_devices "
                            f"({self.max_devices}): lower min_devices too")
        names("profiles", PROFILES)
        names("models", PRESETS)
        whole("max_steps", 1)
        whole("horizon", 1)
        whole("start_kicks", 0)
        whole("pool_size", 0)
        whole("pool_seed", 0)
        if not _real(self.adapt_prob) or not 0 <= self.adapt_prob <= 1:
            problems.append(f"EnvConfig.adapt_prob must be in [0, 1], got {self.adapt_prob!r}")
        if not _real(self.reward_scale) or self.reward_scale <= 0:
            problems.append(f"EnvConfig.reward_scale must be a finite number > 0, got {self.reward_scale!r}")
        if not _real(self.invalid_penalty) or self.invalid_penalty < 0:
            problems.append(f"EnvConfig.invalid_penalty must be a finite number >= 0, got {self.invalid_penalty!r}")
        scales = self.batch_scales
        if isinstance(scales, str) or not isinstance(scales, tuple | list) or not scales \
                or not all(_whole(b) and b >= 1 for b in scales):
            problems.append(f"EnvConfig.batch_scales must be positive integers, got {scales!r}")
        lo_hi = self.seed_range
        if not (isinstance(lo_hi, tuple | list) and len(lo_hi) == 2 and all(_whole(x) and x >= 0 for x in lo_hi)
                and lo_hi[0] < lo_hi[1]):
            problems.append(f"EnvConfig.seed_range must be a non-empty [lo, hi) of integers >= 0, got {lo_hi!r}")
        if problems:
            raise SpantrainError(join_problems(problems))
        # lists are taken as given but kept as tuples: a list made an EnvConfig unhashable, and unequal
        # to the same config written with tuples
        for name in ("profiles", "models", "batch_scales", "seed_range"):
            object.__setattr__(self, name, tuple(getattr(self, name)))


class _NotACandidate(SpantrainError):
    """A start provider's result is no plan: its author's mistake, not a scenario to skip."""


def _checked_key(key: Any) -> tuple:
    """A scenario_fn's key, or SpantrainError saying what one is (a bad one was a TypeError
    or ValueError from unpacking it)."""
    if not isinstance(key, tuple) or len(key) != 5:
        raise SpantrainError(f"scenario_fn returned {key!r:.80}: it must return a scenario key "
                             "(profile, devices, seed, model, batch_scale), e.g. ('cee', 8, 0, 'gpt2-medium', 1)")
    return key


def _whole(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(kw_only=True)
class Scenario:
    """One episode's problem."""

    key: tuple
    """(profile, devices, seed, model, batch scale): identifies the cluster and workload."""
    cluster: Cluster
    """The cluster as it is now (after the network change in adaptation episodes)."""
    workload: Workload
    evaluator: Evaluator
    start: Candidate
    """The plan the episode starts from, evaluated on `cluster`."""
    running: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Adaptation: device -> layer range it holds in the running plan (empty otherwise)."""
    change: str = ""
    """Adaptation: what changed in the network, for humans."""


def scenario_workload(model: str, batch_scale: int = 1) -> Workload:
    """A preset with its global batch multiplied by `batch_scale`."""
    w = Workload.from_preset(model)
    return w.with_global_batch(w.global_batch * batch_scale) if batch_scale != 1 else w


def _draw(config: EnvConfig, rng: np.random.Generator) -> tuple:
    c = config
    return (c.profiles[int(rng.integers(len(c.profiles)))], int(rng.integers(c.min_devices, c.max_devices + 1)),
            int(rng.integers(*c.seed_range)), c.models[int(rng.integers(len(c.models)))],
            c.batch_scales[int(rng.integers(len(c.batch_scales)))])


def scenario_pool(config: EnvConfig) -> list[tuple]:
    """The fixed scenario keys of a pooled configuration (deterministic in `pool_seed`)."""
    rng = np.random.default_rng([config.pool_seed, 7919])
    return [_draw(config, rng) for _ in range(config.pool_size)]


def simple_start(key: tuple, ev: Evaluator) -> Candidate:
    """A planner-free start: the better of data parallelism over every device and one
    pipeline through all of them (device order); used when no provider is given."""
    n = len(ev.cluster)
    order = tuple(int(i) for i in np.argsort(-ev.cluster.tflops, kind="stable"))
    knobs = Knobs(micro_batch_size=1, schedule="1f1b", sync="hierarchical")
    cands = [ev.balance((order,), knobs)]
    if n <= ev.batch:
        cands.append(ev.balance(tuple((i,) for i in range(n)), knobs))
    best = min(cands, key=lambda c: c.rank)
    if not best.feasible:
        raise SpantrainError(f"scenario {key}: no simple plan fits")
    return best


def held_layers(cand: Candidate, num_layers: int) -> dict[int, tuple[int, int]]:
    """Device -> the layer range it holds in a candidate's plan."""
    out = {}
    for devs, starts, _m, _M in cand.built:
        ends = [*starts[1:], num_layers]
        out.update({d: (a, z) for d, a, z in zip(devs, starts, ends)})
    return out


def as_running(ev: Evaluator, running: Candidate) -> Candidate:
    """`running` as it runs, its own layer cuts and micro-batches, scored on `ev`'s
    cluster (the same devices, links changed). Re-partitioning it there would be a
    different plan: its cuts were chosen for the old links, and on the new ones the
    partitioner's pick can be slower than the cuts that run (datacenter-15 gpt2-xl with a
    slowed node link: 0.151 s against 0.137 s)."""
    assert running.built is not None, "a running plan is a built one"
    return ev.score_built(running.built, running.knobs, layout=running.layout, shares=running.shares)


def network_change(cluster: Cluster, rng: np.random.Generator) -> tuple[Cluster, str]:
    """The cluster after one region pair's (or one region's) links change."""
    regions = cluster.regions
    a = regions[int(rng.integers(len(regions)))]
    b = regions[int(rng.integers(len(regions)))]
    degrade = rng.random() < 0.7
    factor = math.exp(rng.uniform(math.log(0.05), math.log(0.5))) if degrade else math.exp(
        rng.uniform(math.log(2.0), math.log(10.0)))
    lat_factor = rng.uniform(1.0, 3.0) if degrade else rng.uniform(0.5, 1.0)
    r = np.array([d.region for d in cluster.devices])
    pick = ((r[:, None] == a) & (r[None, :] == b)) | ((r[:, None] == b) & (r[None, :] == a))
    np.fill_diagonal(pick, False)
    bw = np.where(pick, cluster.bandwidth * factor, cluster.bandwidth)
    lat = np.where(pick, cluster.latency * lat_factor, cluster.latency)
    where = f"inside {a}" if a == b else f"between {a} and {b}"
    return cluster.with_arrays(bandwidth=bw, latency=lat), f"bandwidth x{factor:.2g} {where}"


class PlanEnv(gym.Env):
    """Improve a plan by moves (module docstring)."""

    # render_fps: Gymnasium's checker warns without one (text frames have no playback rate)
    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, config: EnvConfig | None = None, start: StartProvider | None = None,
                 scenario_fn: Callable[[np.random.Generator], tuple] | None = None, render_mode: str | None = None,
                 **fields: Any):
        """`fields`: EnvConfig fields that override `config`'s, so that
        ``gym.make(ENV_ID, max_devices=8)`` works as Gymnasium users expect."""
        known = {f.name for f in dataclasses.fields(EnvConfig)}
        if isinstance(config, Mapping):  # gym.make(ENV_ID, config={"max_devices": 8}) was an AttributeError
            unknown = sorted(set(config) - known)
            if unknown:
                raise SpantrainError(f"config: unknown EnvConfig field{'s' if len(unknown) > 1 else ''} "
                                     f"{', '.join(map(repr, unknown))}")
            config = EnvConfig(**config)
        elif config is not None and not isinstance(config, EnvConfig):
            raise SpantrainError(f"config must be an EnvConfig (or a dict of its fields), got {config!r:.80}")
        if unknown := sorted(set(fields) - known):  # was a TypeError from deep inside gym.make
            raise SpantrainError(f"PlanEnv: unknown argument{'s' if len(unknown) > 1 else ''} "
                                 f"{', '.join(map(repr, unknown))}: pass config, start, scenario_fn, render_mode "
                                 f"or EnvConfig fields ({', '.join(sorted(known))})")
        config = config or EnvConfig()
        self.config = dataclasses.replace(config, **fields) if fields else config
        for name, fn in (("start", start), ("scenario_fn", scenario_fn)):
            if fn is not None and not callable(fn):  # failed at the first reset() as "'str' is not callable"
                raise SpantrainError(f"{name} must be a function (see PlanEnv's StartProvider and scenario_fn), "
                                     f"got {fn!r:.60}")
        self.start_provider = start or simple_start
        self.scenario_fn = scenario_fn
        self.render_mode = render_mode
        n = self.config.max_devices
        self.actions = ActionLayout(n)
        self.action_space = gym.spaces.Discrete(self.actions.size)
        self.observation_space = gym.spaces.Dict({
            "nodes": gym.spaces.Box(-_BOUND, _BOUND, (n, NODE_FEATURES), np.float32),
            "edges": gym.spaces.Box(-_BOUND, _BOUND, (n, n, EDGE_FEATURES), np.float32),
            "mask": gym.spaces.Box(0.0, 1.0, (n,), np.float32),
            "globals": gym.spaces.Box(-_BOUND, _BOUND, (GLOBAL_FEATURES,), np.float32),
        })
        self.scenario: Scenario | None = None
        self._pool = scenario_pool(self.config) if self.config.pool_size else []

    # ---- episode setup -------------------------------------------------------------------

    def _draw_key(self) -> tuple:
        if self.scenario_fn is not None:
            return _checked_key(self.scenario_fn(self.np_random))
        if self.config.pool_size:
            return self._pool[int(self.np_random.integers(len(self._pool)))]
        return _draw(self.config, self.np_random)

    def _build(self, key: tuple, adapt: bool) -> Scenario:
        profile, n, seed, model, batch_scale = key
        base = generate(n, seed=seed, profile=profile)
        workload = scenario_workload(model, batch_scale)
        base_ev = Evaluator(base, workload)
        start = self.start_provider(key, base_ev)
        if not isinstance(start, Candidate):  # was an AttributeError ('NoneType' has no attribute 'built')
            raise _NotACandidate(f"the start provider returned a {type(start).__name__} for scenario {key}, not a "
                                 "Candidate (an Evaluator.balance result, as simple_start returns)")
        start = self._kicked(start, base_ev, workload)
        if not adapt:
            return Scenario(key=key, cluster=base, workload=workload, evaluator=base_ev, start=start)
        changed, what = network_change(base, self.np_random)
        ev = Evaluator(changed, workload)
        now = as_running(ev, start)
        return Scenario(key=key, cluster=changed, workload=workload, evaluator=ev, start=now,
                        running=held_layers(start, workload.num_layers), change=what)

    def _kicked(self, start: Candidate, ev: Evaluator, workload: Workload) -> Candidate:
        """`start` after up to `start_kicks` random valid moves that keep it feasible."""
        kicks = int(self.np_random.integers(self.config.start_kicks + 1)) if self.config.start_kicks else 0
        n = len(ev.cluster)
        stop = self.actions.stop
        for _ in range(kicks):
            mask = action_mask(start.layout, start.knobs, n, self.config.max_devices, workload.num_layers,
                               workload.global_batch)
            mask[stop] = False
            kind, i, j = self.actions.decode(int(self.np_random.choice(np.flatnonzero(mask))))
            cand = ev.balance(*apply_move(start.layout, start.knobs, kind, i, j))
            if cand.feasible:
                start = cand
        return start

    def load(self, scenario: Scenario) -> None:
        """Start an episode on a given scenario (deployment and evaluation use this)."""
        if not isinstance(scenario, Scenario):  # was an AttributeError ('Cluster' has no attribute 'cluster')
            raise SpantrainError(f"a scenario must be a spantrain.env.plan_env.Scenario (cluster, workload, "
                                 f"evaluator, start), got a {type(scenario).__name__}")
        if len(scenario.cluster) > self.config.max_devices:
            raise SpantrainError(f"cluster has {len(scenario.cluster)} devices, the environment "
                                 f"{self.config.max_devices} slots: make it with EnvConfig.max_devices >= "
                                 f"{len(scenario.cluster)} (the policy serves any padding)")
        self.scenario = scenario
        self.current = scenario.start
        self.best = scenario.start
        self.t = 0
        ev = scenario.evaluator
        self._param_prefix = np.concatenate([[0.0], np.cumsum([x.params for x in ev.workload.layers])])
        self._static_edges = _static_edge_features(scenario.cluster, self.config.max_devices)
        self._node_static = _static_node_features(scenario.cluster, self.config.max_devices)
        self._start_eff = self._effective(self.current)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        options = options or {}
        # a misspelt key ({"senario": ...}) silently drew a random episode instead
        unknown = sorted(map(repr, set(options) - {"scenario"})) if isinstance(options, Mapping) else None
        if unknown is None or unknown:
            got = f"{options!r:.60}" if unknown is None else ", ".join(unknown)
            raise SpantrainError(f"reset options must be a dict with at most the key 'scenario' (a Scenario to "
                                 f"start from), got {got}")
        if "scenario" in options:
            scenario = options["scenario"]
            if isinstance(scenario, Scenario) and not scenario.start.feasible:
                # refused before loading it: its observation was an AttributeError (a plan with no estimate)
                why = f" ({scenario.start.note})" if scenario.start.note else ""
                raise SpantrainError(f"scenario {scenario.key}: its start plan does not fit memory{why}: start from "
                                     "a plan that fits (simple_start says when none does)")
            self.load(scenario)
            return self._obs(), self._info()
        last = ""
        for _ in range(50):
            key = self._draw_key()
            adapt = bool(self.np_random.random() < self.config.adapt_prob)
            try:
                scenario = self._build(key, adapt)
            except _NotACandidate:
                raise
            except (SpecError, WorkloadError) as e:  # a scenario_fn's key no cluster or model exists for
                raise SpantrainError(f"scenario {key}: {e}") from None
            except SpantrainError as e:
                last = str(e)
                continue  # e.g. the model fits nowhere on this cluster: draw another
            if scenario.start.feasible:
                self.load(scenario)
                return self._obs(), self._info()
            last = f"scenario {key}: its starting plan does not fit memory"
        c = self.config
        # the last reason: a start provider that refuses every scenario was blamed on the config alone
        tried = f"could not draw a scenario with a feasible starting plan in 50 tries (the last: {last})"
        if self.scenario_fn is not None:  # the config's sizes and models were not what was drawn
            raise SpantrainError(f"{tried}: check the scenario_fn and start provider")
        raise SpantrainError(f"{tried}: the models ({', '.join(c.models)}) fit none of the clusters of "
                             f"EnvConfig.min_devices ({c.min_devices}) to EnvConfig.max_devices ({c.max_devices}) "
                             "devices drawn; allow larger clusters (EnvConfig.max_devices) or smaller models "
                             "(EnvConfig.models)")

    # ---- dynamics -------------------------------------------------------------------------

    def _started(self, what: str) -> None:
        if self.scenario is None:  # was an AssertionError (step) or an AttributeError (action_masks)
            raise SpantrainError(f"PlanEnv.{what} before the first episode: call reset() first")

    def _action(self, action: Any) -> int:
        """`action` as an index of the action space; SpantrainError naming it otherwise (an
        out-of-range one was a ValueError, 1.5 was taken as 1, an array of one a TypeError)."""
        a = action.item() if isinstance(action, np.ndarray | np.generic) and action.shape == () else action
        if not _whole(a) or not 0 <= a < self.actions.size:
            batched = isinstance(action, np.ndarray) and action.shape
            got = f"an array of shape {action.shape}" if batched else f"{a!r:.40}"
            raise SpantrainError(f"action must be one integer in [0, {self.actions.size}) (an index of the "
                                 f"Discrete action space), got {got}")
        return int(a)

    def valid_action_mask(self, cand: Candidate | None = None) -> np.ndarray:
        """Valid moves of `cand` (the current plan when None) in this episode's scenario."""
        self._started("action_masks()")
        s = self.scenario
        cand = self.current if cand is None else cand
        return action_mask(cand.layout, cand.knobs, len(s.cluster), self.config.max_devices, s.workload.num_layers,
                           s.workload.global_batch)

    def action_masks(self) -> np.ndarray:
        """For sb3-contrib's MaskablePPO."""
        return self.valid_action_mask()

    def step(self, action):
        self._started("step()")
        action = self._action(action)
        self.t += 1
        kind, i, _ = self.actions.decode(action)
        truncated = self.t >= self.config.max_steps
        if kind == "knob" and KNOBS[i] == "stop":
            return self._obs(), 0.0, True, False, self._info(stopped=True)
        if not self.valid_action_mask()[action]:
            return self._obs(), -self.config.invalid_penalty, False, truncated, self._info(rejected="invalid")
        cand = self.preview(action)
        if not cand.feasible:
            return self._obs(), -self.config.invalid_penalty, False, truncated, self._info(rejected="memory")
        before = self._effective(self.current)
        after = self._effective(cand)
        self.current = cand
        if after > self._effective(self.best):
            self.best = cand
        reward = self.config.reward_scale * math.log(after / before)
        return self._obs(), float(reward), False, truncated, self._info()

    def preview(self, action: int) -> Candidate:
        """The plan a valid move (not stop) would lead to, without taking it; infeasible
        when it does not fit memory."""
        return self.scenario.evaluator.balance(*self.moved(self.current, action))

    def moved(self, cand: Candidate, action: int) -> tuple[Layout, Knobs]:
        """Layout and knobs after a valid move (not stop) on `cand`, before balancing."""
        return apply_move(cand.layout, cand.knobs, *self.actions.decode(int(action)))

    def _effective(self, cand: Candidate) -> float:
        """Samples per second over the horizon, migration included."""
        H = self.config.horizon
        return H * self.scenario.workload.global_batch / (H * cand.time + self.migration_s(cand))

    def migration_s(self, cand: Candidate) -> float:
        """Seconds to bring every device the layers it newly holds (parallel across devices;
        a device fetches its layers one stretch after another, each from the best-connected
        device that holds it in the running plan)."""
        s = self.scenario
        if not s.running or cand.built is None:
            return 0.0
        params = self._param_prefix
        bw = s.cluster.bandwidth
        state_bytes = s.evaluator.model.calibration.state_bytes_per_param  # what a device holds per parameter
        holders = list(s.running.items())
        worst = 0.0
        L = s.workload.num_layers
        for devs, starts, _m, _M in cand.built:
            ends = [*starts[1:], L]
            for d, a, z in zip(devs, starts, ends):
                old = s.running.get(d)
                lacking = [(a, z)] if not old else [(a, min(z, old[0])), (max(a, old[1]), z)]
                t = 0.0
                for lo, hi in lacking:
                    if hi <= lo:
                        continue
                    # each stretch of layers comes from the best-connected device that holds that
                    # stretch: a fast holder of a neighbouring layer does not make the layers
                    # only a slow link reaches cheap to fetch
                    cuts = sorted({lo, hi, *(x for _, r in holders for x in r if lo < x < hi)})
                    for u, v in itertools.pairwise(cuts):
                        need = params[v] - params[u]
                        if need <= 0:
                            continue
                        src_bw = max((bw[h, d] for h, (ha, hz) in holders if h != d and ha <= u and hz >= v),
                                     default=0.0)
                        t += need * state_bytes / src_bw if src_bw > 0 else math.inf
                worst = max(worst, t)
        return worst

    # ---- observation -----------------------------------------------------------------------

    def _obs(self) -> dict[str, np.ndarray]:
        s = self.scenario
        n = self.config.max_devices
        cand = self.current
        layout = cand.layout
        r = roles(layout, n)
        est = cand.estimate
        model = s.evaluator.model
        ids = s.cluster.ids
        L = s.workload.num_layers
        nodes = self._node_static.copy()
        iteration = max(cand.time, 1e-12)
        periods = est.pipeline_period_s
        shares = np.array(cand.shares, dtype=np.float64)
        for p, (devs, starts, m, M) in enumerate(cand.built):
            ends = [*starts[1:], L]
            busy = []
            for d, a, z in zip(devs, starts, ends):
                f, b, w = model.compute_time(d, a, z, m)
                busy.append(M * (f + b + w))
            bottleneck = int(np.argmax(busy))
            S = len(devs)
            for k, (d, a, z) in enumerate(zip(devs, starts, ends)):
                row = nodes[d]
                row[2] = 1.0
                row[3] = k / (S - 1) if S > 1 else 0.0
                row[4] = S / 8.0
                row[5] = (z - a) / L
                row[6] = busy[k] / iteration
                row[7] = est.peak_memory_gb.get(ids[d], 0.0) * 1e9 / model.memory_capacity(d)
                row[8] = 1.0 if k == bottleneck else 0.0
                row[9] = periods[p] / iteration
                row[10] = shares[p] / s.workload.global_batch
                if s.running:
                    old = s.running.get(d)
                    kept = max(0, min(z, old[1]) - max(a, old[0])) if old else 0
                    row[15] = (z - a - kept) / L
        edges = self._static_edges.copy()
        for devs in layout:
            for k in range(len(devs) - 1):
                edges[devs[k], devs[k + 1], 2] = 1.0
                edges[devs[k + 1], devs[k], 3] = 1.0
            idx = np.array(devs)
            edges[np.ix_(idx, idx, [4])] = 1.0
        for d in range(n):
            edges[d, d, 4] = 0.0
        g = np.zeros(GLOBAL_FEATURES, dtype=np.float32)
        w = s.workload
        g[0] = math.log10(max(w.total_params, 1)) / 10
        g[1] = math.log10(max(w.train_flops, 1)) / 13
        g[2] = L / 64
        g[3] = math.log2(w.global_batch) / 8
        g[4 + SCHEDULES.index(cand.knobs.schedule)] = 1.0
        g[8 + (0 if cand.knobs.sync == "allreduce" else 1)] = 1.0
        g[10] = math.log2(cand.knobs.micro_batch_size) / 6
        g[11] = 1.0 - self.t / self.config.max_steps
        eff = self._effective(cand)
        # an infeasible plan (a running one the cluster no longer fits) has no throughput to compare
        g[12] = math.log(eff / self._start_eff) if eff > 0 and self._start_eff > 0 else 0.0
        g[13] = len(layout) / 8
        g[14] = float(r.active.sum()) / len(s.cluster)
        g[15] = 1.0 if s.running else 0.0
        mask = np.zeros(n, dtype=np.float32)
        mask[: len(s.cluster)] = 1.0
        return {"nodes": np.clip(nodes, -_BOUND, _BOUND).astype(np.float32),
                "edges": np.clip(edges, -_BOUND, _BOUND), "mask": mask, "globals": np.clip(g, -_BOUND, _BOUND)}

    def _info(self, **extra: Any) -> dict[str, Any]:
        s = self.scenario
        c = self.current
        return {"iteration_s": c.time, "samples_per_s": s.workload.global_batch / c.time,
                "start_iteration_s": s.start.time, "best_iteration_s": self.best.time,
                "improvement": s.start.time / c.time, "adaptation": bool(s.running), "scenario": s.key, **extra}

    def render(self) -> str | None:
        if self.render_mode not in (None, "ansi"):
            # refused here, not in __init__: SB3's make_vec_env asks every env for 'rgb_array' and
            # falls back only on a TypeError; render() returned None
            raise SpantrainError(f"render_mode {self.render_mode!r:.40} is not supported: the environment renders "
                                 "its plan as text, make it with render_mode='ansi'")
        if self.render_mode != "ansi" or self.scenario is None:
            return None
        s = self.scenario
        ids = s.cluster.ids
        lines = [f"{s.key} {s.change}".strip(), f"step {self.t}: {self.current.time:.4g} s/iteration "
                 f"(start {s.start.time:.4g} s), {self.current.knobs}"]
        for p, devs in enumerate(self.current.layout):
            lines.append(f"  pipeline {p} ({self.current.shares[p]} samples): " + " -> ".join(ids[d] for d in devs))
        return "\n".join(lines)


def _static_node_features(cluster: Cluster, n: int) -> np.ndarray:
    out = np.zeros((n, NODE_FEATURES), dtype=np.float64)
    k = len(cluster)
    tf = cluster.tflops
    mem = cluster.memory_bytes / 1e9
    out[:k, 0] = np.log10(tf / 50.0)
    out[:k, 1] = np.log10(mem / 24.0)
    for i, d in enumerate(cluster.devices):
        if d.tier in _TIERS:
            out[i, 11 + _TIERS.index(d.tier)] = 1.0
    bw = cluster.bandwidth.copy()
    np.fill_diagonal(bw, np.nan)
    if k > 1:
        out[:k, 14] = (np.log10(np.nanmean(bw, axis=1)) - 9.0) / 2.0
    return out


def _static_edge_features(cluster: Cluster, n: int) -> np.ndarray:
    k = len(cluster)
    out = np.zeros((n, n, EDGE_FEATURES), dtype=np.float32)
    bw = cluster.bandwidth.copy()
    np.fill_diagonal(bw, 1.0)
    out[:k, :k, 0] = (np.log10(bw) - 9.0) / 2.0
    out[:k, :k, 1] = np.log10(cluster.latency * 1e3 + 1e-3) / 2.0
    r = cluster.region_index
    out[:k, :k, 5] = (r[:, None] == r[None, :]).astype(np.float32)
    idx = np.arange(k)
    out[idx, idx, :] = 0.0
    return out



# Registered where the class lives: importing gymnasium in `spantrain.env` itself would
# slow every cost-model user. `gym.make("spantrain.env.plan_env:spantrain/PlanImprove-v0")`
# imports this module and makes the environment in one call.
if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="spantrain.env.plan_env:PlanEnv")
