"""`Evaluator.water_fill` past a few units finds its shares by rank, not unit by unit: the same
shares, slowest time and exhaustive plans as the unit-by-unit fill (one cost-model run per unit
made the exhaustive planner take minutes at a global batch of 65,536)."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import spantrain.env.evaluator as evaluator_module
from spantrain.env.evaluator import MICRO_BATCH_SIZES, Evaluator, Knobs
from spantrain.plan import SCHEDULES
from spantrain.policies.exhaustive import ExhaustivePlanner
from spantrain.profiler.topology import generate
from spantrain.workload import Workload

UNIT_BY_UNIT = 10**12
"""`_FILL_STEPS` past every batch: the unit-by-unit fill alone, as before the fill by rank."""


def _both(monkeypatch, fill):
    """`fill()` unit by unit, then by rank at every size (not only past `_FILL_STEPS`)."""
    monkeypatch.setattr(evaluator_module, "_FILL_STEPS", UNIT_BY_UNIT)
    reference = fill()
    monkeypatch.setattr(evaluator_module, "_FILL_STEPS", 0)
    return reference, fill()


def _same_fill(reference, ranked):
    (ref_shares, ref_worst), (shares, worst) = reference, ranked
    assert worst == ref_worst or (math.isinf(worst) and math.isinf(ref_worst))
    assert shares == ref_shares  # stopped early, where it stopped


# non-decreasing times with many ties, as step functions of the share
steps = st.lists(st.integers(0, 3), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(rises=st.lists(steps, min_size=1, max_size=4), batch=st.integers(1, 160), m=st.sampled_from(MICRO_BATCH_SIZES),
       start=st.lists(st.integers(0, 5), min_size=4, max_size=4), fits=st.lists(st.integers(1, 200), min_size=4,
                                                                                 max_size=4),
       stop=st.sampled_from([math.inf, 3, 6, 10, 20]))
def test_ranked_fill_takes_the_units_in_the_greedy_order_ties_included(rises, batch, m, start, fits, stop):
    ev = Evaluator(generate(4, seed=0, profile="cee"), Workload.from_preset("gpt2-small", global_batch=batch))
    layout = tuple((k,) for k in range(len(rises)))

    def time(devs, b, knobs):  # the k-th pipeline's time at share b; inf past what fits
        k = devs[0]
        if b > fits[k]:
            return math.inf
        units = b // knobs.micro_batch_size
        return float(start[k] + sum(rises[k][:units]) + max(0, units - len(rises[k])))

    ev.pipeline_time = time
    knobs = Knobs(micro_batch_size=m)
    saved = evaluator_module._FILL_STEPS
    try:
        evaluator_module._FILL_STEPS = UNIT_BY_UNIT
        reference = ev.water_fill(layout, knobs, stop_at=stop)
        evaluator_module._FILL_STEPS = 0
        _same_fill(reference, ev.water_fill(layout, knobs, stop_at=stop))
    finally:
        evaluator_module._FILL_STEPS = saved


@pytest.mark.parametrize("m", [1, 2])
def test_ranked_fill_leaves_falling_times_to_the_greedy(monkeypatch, m):
    # times that fall as the share grows (here at every other unit): a merge by rank is not the greedy
    ev = Evaluator(generate(4, seed=0, profile="cee"), Workload.from_preset("gpt2-small", global_batch=400))
    ev.pipeline_time = lambda devs, b, knobs: (devs[0] + 1) * b + (3.0 if (b // knobs.micro_batch_size) % 2 else 0.0)
    for layout in [((0,), (1,)), ((1,), (0,), (2,))]:
        _same_fill(*_both(monkeypatch, lambda layout=layout: ev.water_fill(layout, Knobs(micro_batch_size=m))))
    # a unit of one sample under micro-batch 4 (401 samples): the micro-batch changes with the share
    ev = Evaluator(generate(4, seed=0, profile="cee"), Workload.from_preset("gpt2-medium", global_batch=401))
    _same_fill(*_both(monkeypatch, lambda: ev.water_fill(((0,), (1,)), Knobs(micro_batch_size=4))))


@pytest.mark.parametrize("profile, n, seed, model, batch", [("cee", 4, 0, "gpt2-medium", 1000),
                                                             ("geo", 5, 1, "gpt2-xl", 600),
                                                             ("datacenter", 6, 0, "gpt2-medium", 384)])
def test_ranked_fill_matches_on_real_pipelines(monkeypatch, profile, n, seed, model, batch):
    cluster = generate(n, seed=seed, profile=profile)
    ev = Evaluator(cluster, Workload.from_preset(model, global_batch=batch))
    layouts = [((0,),), ((0,), (1,)), ((0, 1), (2,)), ((1,), (2, 0), (3,)), ((0, 1, 2), (3,))]
    for layout in layouts:
        for m in MICRO_BATCH_SIZES:
            for schedule in SCHEDULES:
                knobs = Knobs(micro_batch_size=m, schedule=schedule)
                reference, ranked = _both(monkeypatch, lambda layout=layout, knobs=knobs: ev.water_fill(layout, knobs))
                _same_fill(reference, ranked)
                if math.isfinite(reference[1]):  # stopping at the slowest time found, or just past it
                    for bar in (reference[1], reference[1] * (1 + 1e-9)):
                        _same_fill(*_both(monkeypatch, lambda layout=layout, knobs=knobs, bar=bar:
                                          ev.water_fill(layout, knobs, stop_at=bar)))


@pytest.mark.parametrize("profile, n, seed, model, batch", [("cee", 4, 0, "gpt2-medium", 2048),
                                                             ("geo", 4, 1, "gpt2-xl", 2048),
                                                             ("cee", 5, 2, "gpt2-xl", 1000),
                                                             ("datacenter", 4, 1, "gpt2-medium", 1536)])
def test_exhaustive_plans_the_same_with_the_ranked_fill(monkeypatch, profile, n, seed, model, batch):
    # the reference optimum the heuristic is held against: the same plan, figure for figure
    cluster = generate(n, seed=seed, profile=profile)
    workload = Workload.from_preset(model, global_batch=batch)
    reference, ranked = _both(monkeypatch, lambda: ExhaustivePlanner().plan(cluster, workload).to_dict())
    assert json.dumps(ranked, sort_keys=True) == json.dumps(reference, sort_keys=True)


def test_exhaustive_at_a_large_batch_runs_few_cost_model_calls():
    # one run per unit of every pipeline's share: 234,650 calls at 16,384 samples on cee-4 (21 s of
    # CPU), minutes at 65,536
    planner = ExhaustivePlanner()
    planner.plan(generate(4, seed=0, profile="cee"), Workload.from_preset("gpt2-medium", global_batch=16384))
    assert planner.stats["cost_model_calls"] < 20_000, planner.stats
