"""The Gymnasium environment: checkers, seeding, masks that never allow an invalid plan."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env
from stable_baselines3.common.env_util import make_vec_env

from spantrain.cluster import Cluster
from spantrain.env.evaluator import Evaluator, Knobs
from spantrain.env.moves import apply_move
from spantrain.env.plan_env import (
    ENV_ID,
    EnvConfig,
    PlanEnv,
    Scenario,
    as_running,
    held_layers,
    network_change,
    simple_start,
)
from spantrain.env.spaces import KNOBS, ActionLayout
from spantrain.errors import SpantrainError
from spantrain.plan import Plan
from spantrain.profiler.topology import generate
from spantrain.workload import Workload

SMALL = EnvConfig(max_devices=8, min_devices=3, models=("gpt2-medium",), max_steps=6, adapt_prob=0.5)


def test_passes_gymnasium_and_sb3_checkers():
    gym_check_env(PlanEnv(SMALL), skip_render_check=True)
    sb3_check_env(PlanEnv(SMALL), warn=False)


def test_registered_versioned_id():
    env = gym.make(f"spantrain.env.plan_env:{ENV_ID}", config=SMALL)
    obs, _ = env.reset(seed=1)
    assert env.spec.id == ENV_ID and env.observation_space.contains(obs)


def _rollout(env: PlanEnv, seed: int, steps: int = 20):
    obs, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    trace = [info["scenario"], obs["nodes"].sum()]
    for _ in range(steps):
        action = int(rng.choice(np.nonzero(env.action_masks())[0]))
        obs, reward, term, trunc, info = env.step(action)
        trace += [action, round(reward, 12), obs["edges"].sum()]
        if term or trunc:
            obs, info = env.reset()
            trace.append(info["scenario"])
    return trace


def test_same_seed_same_episodes():
    assert _rollout(PlanEnv(SMALL), 5) == _rollout(PlanEnv(SMALL), 5)
    assert _rollout(PlanEnv(SMALL), 5) != _rollout(PlanEnv(SMALL), 6)


@pytest.mark.parametrize("seed", range(4))
def test_random_masked_policy_always_holds_a_valid_feasible_plan(seed):
    env = PlanEnv(SMALL)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    for _ in range(60):
        mask = env.action_masks()
        assert mask.any()
        action = int(rng.choice(np.nonzero(mask)[0]))
        _, _, term, trunc, _ = env.step(action)
        s = env.scenario
        plan = s.evaluator.to_plan(env.current)
        assert plan.problems(s.cluster, s.workload) == []
        assert env.current.feasible and plan.batch == s.workload.global_batch
        if term or trunc:
            env.reset()


def test_every_unmasked_move_yields_a_valid_layout():
    env = PlanEnv(SMALL)
    env.reset(seed=11)
    s = env.scenario
    n = len(s.cluster)
    mask = env.action_masks()
    for action in np.nonzero(mask)[0]:
        kind, i, j = env.actions.decode(int(action))
        if kind == "knob" and KNOBS[i] == "stop":
            continue
        layout, knobs = apply_move(env.current.layout, env.current.knobs, kind, i, j)
        used = [d for p in layout for d in p]
        assert used and len(used) == len(set(used)) and all(0 <= d < n for d in used)
        assert len(layout) <= s.workload.global_batch
        assert all(len(p) <= s.workload.num_layers for p in layout)
        assert (layout, knobs) != (env.current.layout, env.current.knobs), (kind, i, j)
    # padding slots are never offered
    acts = ActionLayout(SMALL.max_devices)
    for d in range(n, SMALL.max_devices):
        assert not mask[acts.encode("idle", d)] and not mask[acts.encode("solo", d)]


def test_invalid_action_is_rejected_without_changing_the_plan():
    env = PlanEnv(SMALL)
    env.reset(seed=2)
    before = env.current
    invalid = int(np.nonzero(~env.action_masks())[0][0])
    _, reward, term, _, info = env.step(invalid)
    assert env.current is before and reward < 0 and not term and info["rejected"] == "invalid"


def test_rewards_telescope_to_the_log_ratio():
    env = PlanEnv(EnvConfig(max_devices=8, min_devices=4, models=("gpt2-medium",), max_steps=30, adapt_prob=0.0))
    env.reset(seed=4)
    rng = np.random.default_rng(0)
    total = 0.0
    for _ in range(25):
        _, r, term, trunc, info = env.step(int(rng.choice(np.nonzero(env.action_masks())[0])))
        total += r if "rejected" not in info else 0.0
        if term or trunc:
            break
    expected = env.config.reward_scale * np.log(env.scenario.start.time / env.current.time)
    assert total == pytest.approx(expected, rel=1e-9, abs=1e-9)


def test_adaptation_counts_migration_and_network_change_is_real():
    cluster = generate(8, seed=3, profile="cee")
    changed, what = network_change(cluster, np.random.default_rng(0))
    assert not np.array_equal(changed.bandwidth, cluster.bandwidth) and "bandwidth" in what
    w = Workload.from_preset("gpt2-medium")
    ev = Evaluator(cluster, w)
    start = simple_start(("x",), ev)
    running = held_layers(start, w.num_layers)
    env = PlanEnv(EnvConfig(max_devices=8, min_devices=4))
    env.reset(seed=0, options={"scenario": Scenario(key=("x",), cluster=cluster, workload=w, evaluator=ev,
                                                    start=start, running=running)})
    assert env.migration_s(start) == 0.0
    # moving every device's layers costs time
    flipped = ev.balance(tuple(tuple(reversed(p)) for p in start.layout), start.knobs)
    if flipped.layout != start.layout:
        assert env.migration_s(flipped) > 0


def test_migration_fetches_each_layer_from_a_device_that_holds_it(demo_spec):
    """A running pipeline cloud-0 [0, 4) -> edge-0 [4, 8) of tiny-gpt, then the cloud-edge
    link all but dies (12.5 kB/s). A stage on cloud-3 taking [3, 8) must fetch [4, 8) from
    edge-0 over that link: that cloud-0, on a fast link, holds layer 3 does not make the rest
    cheap (it did: 1 ms, where a stage taking [4, 8) alone cost 800 s, and `run --adapt` chose it)."""
    from spantrain.policies.adapt import candidate_from_plan

    cluster = Cluster.from_spec(demo_spec)
    bw = cluster.bandwidth.copy()
    edge, clouds = cluster.index("edge-0"), [cluster.index(f"cloud-{i}") for i in range(4)]
    bw[edge, clouds] = bw[clouds, edge] = 12.5e3
    cluster = cluster.with_arrays(bandwidth=bw)
    w = Workload.from_preset("tiny-gpt")
    ev = Evaluator(cluster, w)

    def cand(*stages):
        return candidate_from_plan(ev, Plan.from_dict({
            "schedule": "1f1b", "sync": {"mode": "allreduce", "period": 1},
            "pipelines": [{"micro_batch_size": 4, "num_micro_batches": 8,
                           "stages": [{"devices": [d], "layers": list(r)} for d, r in stages]}]}))

    running = cand(("cloud-0", (0, 4)), ("edge-0", (4, 8)))
    env = PlanEnv(EnvConfig(max_devices=8, min_devices=2))
    env.load(Scenario(key=("x",), cluster=cluster, workload=w, evaluator=ev, start=running,
                      running=held_layers(running, w.num_layers)))
    tail_bytes = 16 * sum(layer.params for layer in w.layers[4:])
    only_tail = env.migration_s(cand(("cloud-0", (0, 4)), ("cloud-3", (4, 8))))
    assert only_tail == pytest.approx(tail_bytes / 12.5e3)
    with_layer_3 = env.migration_s(cand(("cloud-0", (0, 1)), ("cloud-1", (1, 3)), ("cloud-3", (3, 8))))
    assert with_layer_3 >= only_tail


def test_adaptation_episodes_start_from_the_running_plan_as_it_runs():
    """Not re-partitioned for the changed links: the cuts that run, at no migration, scored
    as `plan --from` scores keeping the plan."""
    from spantrain.policies.adapt import candidate_from_plan

    env = PlanEnv(EnvConfig(max_devices=16, min_devices=8, adapt_prob=1.0))
    for seed in range(8):
        env.reset(seed=seed)
        s = env.scenario
        assert s.running is not None
        assert held_layers(s.start, s.workload.num_layers) == s.running
        assert env.migration_s(s.start) == 0.0
        kept = candidate_from_plan(s.evaluator, s.evaluator.to_plan(s.start))
        assert s.start.time == pytest.approx(kept.time, rel=1e-12)


def test_as_running_keeps_the_cuts_the_partitioner_would_change():
    # geo-12 seed 4, gpt2-xl, one pipeline through 8 devices; then the link between its 3rd and
    # 4th device slows 100x. Re-partitioned for the new links it would be slower (5.24 s) than
    # the cuts that run (4.55 s): the plan that runs is the one to score.
    cluster = generate(12, seed=4, profile="geo")
    w = Workload.from_preset("gpt2-xl")
    running = Evaluator(cluster, w).balance(((0, 1, 2, 3, 4, 5, 6, 7),),
                                            Knobs(micro_batch_size=1, schedule="1f1b", sync="allreduce"))
    bw = np.asarray(cluster.bandwidth).copy()
    bw[2, 3] *= 0.01
    bw[3, 2] *= 0.01
    slower = Evaluator(cluster.with_arrays(bandwidth=bw), w)
    now = as_running(slower, running)
    assert now.built == running.built and now.layout == running.layout and now.shares == running.shares
    assert now.time > running.time  # scored on the slowed link
    repartitioned = slower.evaluate(running.layout, running.shares, running.knobs)
    assert repartitioned.built != running.built and repartitioned.time > 1.1 * now.time


def test_kicked_starts_are_feasible_seeded_and_off_the_planned_start():
    """start_kicks: random valid moves on the starting plan, from the env's generator only."""
    plain = dict(max_devices=8, min_devices=6, models=("gpt2-medium",), adapt_prob=0.0)
    kicked = EnvConfig(**plain, start_kicks=4)
    starts = []
    for seed in range(6):
        a, b, c = PlanEnv(kicked), PlanEnv(kicked), PlanEnv(EnvConfig(**plain))
        a.reset(seed=seed), b.reset(seed=seed), c.reset(seed=seed)
        assert a.scenario.start.feasible and a.scenario.start.layout == b.scenario.start.layout
        assert a.scenario.start.knobs == b.scenario.start.knobs
        starts.append((a.scenario.start.layout, a.scenario.start.knobs, c.scenario.start.layout,
                       c.scenario.start.knobs))
    # the same scenarios, but some episodes start from a moved plan
    assert any((lay, k) != (lay0, k0) for lay, k, lay0, k0 in starts)
    with pytest.raises(SpantrainError, match="start_kicks"):
        EnvConfig(start_kicks=-1)


@pytest.mark.parametrize(("field", "value"), [
    ("models", ("nope",)),          # was "fit none of the clusters" after 50 draws
    ("models", "gpt2-medium"),      # was 11 one-letter models
    ("reward_scale", float("nan")),  # was nan rewards
    ("invalid_penalty", None),
    ("max_steps", float("nan")),    # was an episode that never truncates
    ("horizon", "500"),             # was a TypeError
    ("min_devices", None),
    ("profiles", None),
    ("batch_scales", 4),
    ("seed_range", 5),
    ("pool_seed", "x"),
])
def test_env_config_names_a_bad_field(field, value):
    from spantrain.env.plan_env import EnvConfig
    from spantrain.errors import SpantrainError
    with pytest.raises(SpantrainError, match=rf"EnvConfig\.{field}"):
        EnvConfig(**{field: value})


def test_env_config_names_every_bad_field_at_once():
    from spantrain.env.plan_env import EnvConfig
    from spantrain.errors import SpantrainError
    with pytest.raises(SpantrainError, match=r"horizon.*reward_scale"):
        EnvConfig(reward_scale=-1.0, horizon=0)


def test_env_takes_its_config_as_a_dict_and_names_a_wrong_one():
    # gym.make(ENV_ID, config={"max_devices": 8}) was an AttributeError ('dict' has no max_devices)
    env = gym.make(ENV_ID, config={"max_devices": 8, "models": ("gpt2-medium",)})
    assert env.unwrapped.config == EnvConfig(max_devices=8, models=("gpt2-medium",))
    with pytest.raises(SpantrainError, match="unknown EnvConfig field 'max_device'"):
        gym.make(ENV_ID, config={"max_device": 8})
    with pytest.raises(SpantrainError, match="config must be an EnvConfig"):
        gym.make(ENV_ID, config="small")


def test_env_takes_config_fields_as_keyword_arguments():
    # gym.make(ENV_ID, max_devices=8) was a TypeError from inside gym.make
    env = gym.make(ENV_ID, max_devices=8, models=("gpt2-medium",))
    assert env.unwrapped.config == EnvConfig(max_devices=8, models=("gpt2-medium",))
    # fields given beside a config override its own
    env = gym.make(ENV_ID, config=SMALL, max_steps=3)
    assert env.unwrapped.config == EnvConfig(max_devices=8, min_devices=3, models=("gpt2-medium",), max_steps=3,
                                             adapt_prob=0.5)
    with pytest.raises(SpantrainError, match=r"unknown argument 'max_device'.*max_devices"):
        gym.make(ENV_ID, max_device=8)
    with pytest.raises(SpantrainError, match=r"EnvConfig\.max_steps"):
        gym.make(ENV_ID, config=SMALL, max_steps=0)


def test_renders_text_and_refuses_other_render_modes():
    env = gym.make(ENV_ID, config=SMALL, render_mode="ansi")
    env.reset(seed=0)
    assert "s/iteration" in env.render()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gym_check_env(gym.make(ENV_ID, config=SMALL, render_mode="ansi").unwrapped)  # the render check too
    assert not [w for w in caught if "fps" in str(w.message)]
    for mode in ("human", "rgb_array"):  # render() returned None
        env = PlanEnv(SMALL, render_mode=mode)  # made: SB3's make_vec_env asks every env for rgb_array
        env.reset(seed=0)
        with pytest.raises(SpantrainError, match=f"render_mode '{mode}' is not supported.*'ansi'"):
            env.render()
    vec = make_vec_env(ENV_ID, n_envs=1, env_kwargs={"config": SMALL})
    assert vec.reset()["nodes"].shape[0] == 1


def test_step_and_masks_say_what_is_wrong_in_one_line():
    env = PlanEnv(SMALL)
    # an AssertionError (step) and an AttributeError (action_masks) before
    with pytest.raises(SpantrainError, match=r"step\(\) before the first episode: call reset\(\) first"):
        env.step(0)
    with pytest.raises(SpantrainError, match=r"action_masks\(\) before the first episode: call reset\(\) first"):
        env.action_masks()
    env.reset(seed=0)
    n = env.action_space.n
    # a ValueError, 1.5 taken as 1, a TypeError for predict()'s batched (1,) array
    for bad, shown in [(-1, "-1"), (n, str(n)), (1.5, "1.5"), (None, "None"), ("stop", "'stop'"),
                       (np.array([env.actions.stop]), r"an array of shape \(1,\)")]:
        with pytest.raises(SpantrainError, match=rf"action must be one integer in \[0, {n}\).*got {shown}$"):
            env.step(bad)
    assert env.t == 0  # a refused action is no move
    _, _, term, _, info = env.step(np.array(env.actions.stop))  # what predict() returns for one observation
    assert term and info["stopped"]


def test_reset_options_and_scenarios_say_what_is_wrong(demo_spec):
    cluster = Cluster.from_spec(demo_spec)
    workload = Workload.from_preset("tiny-gpt")
    ev = Evaluator(cluster, workload)
    scenario = Scenario(key=("demo",), cluster=cluster, workload=workload, evaluator=ev, start=simple_start((), ev))
    env = PlanEnv(SMALL)
    _, info = env.reset(seed=0, options={"scenario": scenario})
    assert info["scenario"] == ("demo",)
    # a misspelt key silently drew a random episode; a cluster was an AttributeError
    with pytest.raises(SpantrainError, match=r"at most the key 'scenario'.*got 'senario'$"):
        env.reset(options={"senario": scenario})
    with pytest.raises(SpantrainError, match=r"reset options must be a dict.*got \['scenario'\]"):
        env.reset(options=["scenario"])
    with pytest.raises(SpantrainError, match=r"must be a spantrain.env.plan_env.Scenario.*got a Cluster"):
        env.reset(options={"scenario": cluster})
    small = PlanEnv(EnvConfig(max_devices=len(cluster) - 1, min_devices=2))
    with pytest.raises(SpantrainError, match=rf"EnvConfig.max_devices >= {len(cluster)}"):
        small.reset(options={"scenario": scenario})


@pytest.mark.parametrize(("key", "reason"), [
    (("nope", 4, 1, "gpt2-medium", 1), r"scenario \('nope'.*unknown topology profile 'nope'"),
    (("cee", 4, 1, "gpt-5", 1), "unknown model 'gpt-5'"),
    (("cee", 4, -1, "gpt2-medium", 1), "seed must be an integer >= 0"),
    (("cee", 4, 1, "gpt2-medium"), r"scenario_fn returned \('cee'.*\(profile, devices, seed, model, batch_scale\)"),
    (None, "scenario_fn returned None"),
])
def test_a_bad_scenario_fn_key_is_named_not_retried(key, reason):
    # these were blamed on EnvConfig's models and sizes after 50 draws, or a TypeError from unpacking
    with pytest.raises(SpantrainError, match=reason):
        PlanEnv(SMALL, scenario_fn=lambda rng: key).reset(seed=0)


def test_a_bad_start_provider_is_named():
    with pytest.raises(SpantrainError, match=r"start must be a function.*got 'heuristic'"):
        PlanEnv(SMALL, start="heuristic")
    with pytest.raises(SpantrainError, match="scenario_fn must be a function"):
        PlanEnv(SMALL, scenario_fn=("cee", 4, 1, "gpt2-medium", 1))
    # an AttributeError ('NoneType' object has no attribute 'built')
    with pytest.raises(SpantrainError, match=r"start provider returned a NoneType.*not a Candidate"):
        PlanEnv(SMALL, start=lambda key, ev: None).reset(seed=0)

    def refuses(key, ev):
        raise SpantrainError("no start for you")

    # the config's models and sizes alone were blamed for what the provider refused
    with pytest.raises(SpantrainError, match=r"50 tries \(the last: no start for you\): the models"):
        PlanEnv(SMALL, start=refuses).reset(seed=0)
    with pytest.raises(SpantrainError, match=r"50 tries \(the last: no start for you\): check the scenario_fn"):
        PlanEnv(SMALL, start=refuses, scenario_fn=lambda rng: ("cee", 4, 1, "gpt2-medium", 1)).reset(seed=0)


def test_env_config_sizes_name_the_fix():
    # EnvConfig(max_devices=2) alone was "min_devices must be in [2, max_devices], got 4"
    with pytest.raises(SpantrainError, match=r"min_devices \(4\) is above EnvConfig.max_devices \(2\): lower "
                                             "min_devices too"):
        EnvConfig(max_devices=2)
    assert EnvConfig(max_devices=2, min_devices=2).max_devices == 2
    # unbounded, the observation space alone asked for gigabytes (or terabytes) before any episode
    with pytest.raises(SpantrainError, match="max_devices must be at most 4096"):
        EnvConfig(max_devices=1_000_000)


def test_env_config_given_lists_equals_and_hashes_as_with_tuples():
    listed = EnvConfig(models=["gpt2-medium"], profiles=["cee"], batch_scales=[1], seed_range=[0, 10])
    tupled = EnvConfig(models=("gpt2-medium",), profiles=("cee",), batch_scales=(1,), seed_range=(0, 10))
    assert listed == tupled and hash(listed) == hash(tupled)  # were unequal, and hash() a TypeError


def test_a_scenario_whose_start_does_not_fit_is_named(demo_spec):
    # was an AttributeError ('NoneType' object has no attribute 'pipeline_period_s')
    cluster = Cluster.from_spec(demo_spec)
    workload = Workload.from_preset("llama2-7b")
    ev = Evaluator(cluster, workload)
    start = ev.balance((tuple(range(len(cluster))),), Knobs(micro_batch_size=1, schedule="1f1b", sync="hierarchical"))
    assert not start.feasible
    env = PlanEnv(SMALL)
    with pytest.raises(SpantrainError, match=r"scenario \('big',\): its start plan does not fit memory.*start from a "
                                             "plan that fits"):
        env.reset(options={"scenario": Scenario(key=("big",), cluster=cluster, workload=workload, evaluator=ev,
                                                start=start)})
    with pytest.raises(SpantrainError, match="call reset"):  # no half-loaded episode to step in
        env.step(0)
