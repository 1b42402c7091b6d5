"""Imitation of the one-step lookahead expert: its moves, and a policy learning them."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from spantrain.env.evaluator import Evaluator
from spantrain.env.plan_env import EnvConfig, PlanEnv, Scenario, simple_start
from spantrain.policies.imitation import (
    MIN_GAIN,
    _train,
    anneal,
    beam_search,
    clone,
    collect,
    expert_action,
    expert_rollout,
)
from spantrain.profiler.topology import generate
from spantrain.workload import Workload


def _scenario(n: int = 8, seed: int = 3, profile: str = "cee") -> Scenario:
    ev = Evaluator(generate(n, seed=seed, profile=profile), Workload.from_preset("gpt2-medium"))
    return Scenario(key=("t",), cluster=ev.cluster, workload=ev.workload, evaluator=ev,
                    start=simple_start(("t",), ev))


def test_expert_climbs_from_a_poor_plan_and_stops_where_no_move_pays():
    env = PlanEnv(EnvConfig(max_devices=8, min_devices=2, max_steps=30))
    env.load(_scenario())
    stop = env.actions.stop
    effective = [env._effective(env.current)]
    for _ in range(30):
        a = expert_action(env)
        if a == stop:
            break
        assert env.valid_action_mask()[a]
        _, reward, term, trunc, info = env.step(a)
        assert "rejected" not in info and reward > 0
        effective.append(env._effective(env.current))
        if term or trunc:
            break
    # a planner-free start on a cee cluster leaves a lot to gain, each step at least MIN_GAIN
    assert len(effective) > 2 and effective[-1] > 2 * effective[0]
    assert all(b >= a * (1 + MIN_GAIN) for a, b in itertools.pairwise(effective))
    again = PlanEnv(EnvConfig(max_devices=8, min_devices=2, max_steps=30))
    again.load(_scenario())
    assert expert_rollout(again).time == env.best.time  # the same climb, as a helper
    if a == stop:  # no valid move gains MIN_GAIN any more
        base = env._effective(env.current) * (1 + MIN_GAIN)
        for b in np.flatnonzero(env.valid_action_mask()):
            if b != stop:
                cand = env.preview(int(b))
                assert not cand.feasible or env._effective(cand) <= base


def _maskable_model(env: PlanEnv):
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.vec_env import DummyVecEnv

    from spantrain.policies.extractor import MaskableGraphPolicy

    return MaskablePPO(MaskableGraphPolicy, DummyVecEnv([lambda: env]), n_steps=16, batch_size=16, seed=0,
                       device="cpu", policy_kwargs={"features_extractor_kwargs": {"hidden": 32, "layers": 2}})


@pytest.mark.slow
def test_policy_learns_the_expert_moves_it_was_shown():
    torch.manual_seed(0)
    env = PlanEnv(EnvConfig(max_devices=6, min_devices=4, models=("gpt2-medium",), pool_size=6, start_kicks=3,
                            adapt_prob=0.5))
    env.reset(seed=1)
    data = collect(env, 8)
    stop = env.actions.stop
    assert len(data) >= 8 and any(a != stop for a in data.actions)  # kicked starts need repairs
    assert len(data.returns) == len(data) and all(len(v) == len(data) for v in data.obs.values())
    model = _maskable_model(env)
    rng = np.random.default_rng(0)
    _, accuracy = _train(model.policy, data, 100, 16, rng)
    assert accuracy >= 0.8


@pytest.mark.slow
def test_dagger_rounds_grow_the_label_set():
    env = PlanEnv(EnvConfig(max_devices=6, min_devices=4, models=("gpt2-medium",), pool_size=4, start_kicks=2))
    env.reset(seed=2)
    stats = clone(_maskable_model(env).policy, env, episodes=3, rounds=2, epochs=2)
    assert len(stats) == 2 and stats[1].samples > stats[0].samples >= 3
    assert all(0.0 <= s.accuracy <= 1.0 and 0.0 <= s.stop_share <= 1.0 for s in stats)


def test_beam_search_reaches_at_least_the_lookahead_experts_plan():
    env = PlanEnv(EnvConfig(max_devices=8, min_devices=2, max_steps=6))
    env.load(_scenario())
    start = env.current
    assert beam_search(env, width=3, depth=0) is start
    wide = beam_search(env, width=3)
    assert env.current is start  # a search, not a walk: the episode is untouched
    assert wide.feasible and beam_search(env, width=3).time == wide.time  # deterministic
    # width 1 follows the expert's climb and keeps going past where it stops
    narrow = beam_search(env, width=1)
    assert env._effective(narrow) >= env._effective(expert_rollout(env)) > 2 * env._effective(start)
    assert env._effective(wide) >= env._effective(narrow) * (1 - 1e-9)
    with pytest.raises(ValueError, match="width"):
        beam_search(env, width=0)


def test_anneal_climbs_from_a_poor_plan_deterministically_and_never_returns_worse():
    env = PlanEnv(EnvConfig(max_devices=8, min_devices=2))
    env.load(_scenario())
    start = env.current
    found = anneal(env, 300, chains=2, seed=1)
    assert env.current is start  # a search, not a walk
    assert found.feasible and found.time < start.time / 2  # a planner-free start leaves a lot to gain
    assert anneal(env, 300, chains=2, seed=1).time == found.time  # seeded
    # hot walks accept worse plans, but the best one visited is returned: never worse than the start
    hot = anneal(env, 50, chains=1, t_start=5.0, t_end=5.0, seed=2)
    assert hot.time <= start.time
    with pytest.raises(ValueError, match="steps and chains"):
        anneal(env, 0)
