"""Layer-cut moves (`spantrain.policies.cuts`): the heuristic's step 9 and `plan --from`'s recut."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from spantrain.env.evaluator import Evaluator, Knobs
from spantrain.policies.adapt import adapt_plan
from spantrain.policies.cuts import refine_cuts
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.profiler.topology import generate
from spantrain.workload import Workload

XL = Workload.from_preset("gpt2-xl")


@pytest.fixture(scope="module")
def eight_stages():
    """geo-12 seed 4, gpt2-xl, one pipeline through devices 0-7 with the partitioner's cuts."""
    cluster = generate(12, seed=4, profile="geo")
    ev = Evaluator(cluster, XL)
    return cluster, ev, ev.balance((tuple(range(8)),), Knobs(micro_batch_size=1, schedule="1f1b", sync="allreduce"))


def test_moving_cuts_beats_the_partitioners_proxy_and_keeps_everything_else(eight_stages):
    _, ev, dp = eight_stages
    moved = refine_cuts(ev, dp)
    # the partitioner's cuts (0, 1, 2, 4, 13, 30, 48, 49) take 4.41 s; moved, 3.67 s
    assert moved.time < 0.85 * dp.time and moved.feasible
    (devs, starts, m, M), = moved.built
    assert (devs, m, M) == (dp.built[0][0], *dp.built[0][2:])
    assert starts != dp.built[0][1] and starts[0] == 0 and all(a < b for a, b in pairwise(starts))
    assert starts[-1] < ev.model.num_layers
    assert (moved.layout, moved.shares, moved.knobs) == (dp.layout, dp.shares, dp.knobs)
    assert refine_cuts(ev, moved) is moved  # a local optimum: no move of one cut helps


def test_the_cost_decides_and_an_unhelpful_move_returns_the_candidate_itself(eight_stages):
    _, ev, dp = eight_stages
    frozen = dp.built[0][1]
    assert refine_cuts(ev, dp, cost=lambda c: c.time + 1e9 * (c.built[0][1] != frozen)) is dp


def test_the_heuristic_moves_its_cuts_replicas_alike():
    # datacenter-64 seed 1826018 (an evaluation cluster), llama2-7b: eight 7-stage pipelines
    # of the same device classes; moving their cuts together makes the plan 1.0 % faster
    cluster = generate(64, seed=1826018, profile="datacenter")
    w = Workload.from_preset("llama2-7b")
    ev = Evaluator(cluster, w)
    best = HeuristicPlanner().best_candidate(ev)
    dp = ev.evaluate(best.layout, best.shares, best.knobs)  # the same plan, the partitioner's cuts
    assert best.time < 0.995 * dp.time
    assert len(best.built) == 8 and len({starts for _, starts, _, _ in best.built}) == 1
    assert best.built[0][1] != dp.built[0][1]


def test_plan_from_offers_the_running_devices_with_moved_cuts(eight_stages):
    cluster, ev, dp = eight_stages
    bw = np.asarray(cluster.bandwidth).copy()
    bw[2, 3] *= 0.01  # the link between the pipeline's 3rd and 4th device slows 100x
    bw[3, 2] *= 0.01
    changed = cluster.with_arrays(bandwidth=bw)
    running = ev.to_plan(dp)
    # 3 steps left: a fresh plan's 13 s of migration does not pay, moving cuts does (1.4 s)
    short = adapt_plan(changed, XL, running, remaining_steps=3, planner="heuristic")
    assert short.chosen == "recut"
    keep, recut, fresh = (short.option(n) for n in ("keep", "recut", "heuristic"))
    assert recut.iteration_s < keep.iteration_s and 0 < recut.migration_s < fresh.migration_s
    assert recut.total_s < min(keep.total_s, fresh.total_s)
    assert short.plan.devices == running.devices
    assert [s.layers for p in short.plan.pipelines for s in p.stages] != \
        [s.layers for p in running.pipelines for s in p.stages]
    # one step left: moving state does not pay at all
    assert adapt_plan(changed, XL, running, remaining_steps=1, planner="heuristic").chosen == "keep"


def test_the_policys_plan_gets_its_cuts_moved_too(eight_stages, monkeypatch):
    from spantrain.policies.ppo import PPOPlanner

    _, ev, dp = eight_stages
    start = ev.balance(((0,),), dp.knobs)
    # the policy's moves reach the 8-stage layout; its cuts come from the partitioner
    monkeypatch.setattr(PPOPlanner, "improve", lambda self, scenario, horizon=None: dp)
    monkeypatch.setattr(PPOPlanner, "_load", lambda self: None)
    learned = PPOPlanner().best_candidate(ev, start=start)
    assert learned.layout == dp.layout and learned.time < 0.85 * dp.time
    # a start the policy cannot improve is returned as it is
    monkeypatch.setattr(PPOPlanner, "improve", lambda self, scenario, horizon=None: scenario.start)
    assert PPOPlanner().best_candidate(ev, start=dp) is dp
