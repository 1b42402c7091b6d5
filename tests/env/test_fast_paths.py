"""The cost model's fast entry points: `estimate_fast`, the kernel's output layout and memo
records, the unpacked `evaluate_plan`, and where the compiled code lives."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from costmodel_helpers import random_plan, regional_cluster, single_pipeline, toy_workload
from hypothesis import given, settings
from hypothesis import strategies as st

from spantrain.env import collectives, costmodel, kernel, schedules
from spantrain.env.costmodel import CostModel
from spantrain.errors import PlanError
from spantrain.plan import Pipeline, Plan, Stage
from spantrain.profiler.topology import generate


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.booleans())
def test_estimate_fast_equals_estimate(seed, memo):
    c, w = regional_cluster(), toy_workload(8, boundary=3e6)
    cm = CostModel(c, w, memo=memo)
    plan = random_plan(random.Random(seed), c, 8)
    est = cm.estimate(plan)
    want = (est.iteration_s, est.samples_per_s, est.feasible)
    assert cm.estimate_fast(plan) == want
    arrays = cm.flatten(plan)
    assert cm.estimate_fast(arrays) == want
    assert cm.estimate_arrays(arrays) == est
    stage_out, pipe_out, scalars = cm.evaluate(arrays)
    assert dict(zip(kernel.SCALARS, scalars.tolist(), strict=True)) == {
        "iteration_s": est.iteration_s, "pipeline_max_s": max(est.pipeline_period_s), "sync_alone_s": est.sync_s,
        "exposed_comm_s": est.exposed_comm_s, "optimizer_s": est.optimizer_s, "samples_per_s": est.samples_per_s,
        "feasible": 1.0 if est.feasible else 0.0}
    assert pipe_out[:, 1].tolist() == list(est.bubble_fraction)
    assert (stage_out[:, kernel.STAGE_COLUMNS.index("memory_bytes")] / 1e9).tolist() == list(
        est.peak_memory_gb.values())


def test_estimate_fast_validates_plans():
    c, w = regional_cluster(), toy_workload(8)
    bad = Plan(pipelines=(Pipeline(stages=(Stage(devices=("a-0",), layers=(0, 5)),), micro_batch_size=1,
                                   num_micro_batches=2),))
    with pytest.raises(PlanError):
        CostModel(c, w).estimate_fast(bad)


def test_infeasible_plan_through_fast_path():
    c, w = regional_cluster(), toy_workload(8, params=400_000_000)
    cm = CostModel(c, w)
    plan = single_pipeline(["c-0", "c-1"], [0, 4, 8], 2, 4, "zb-h1")
    est = cm.estimate(plan)
    assert not est.feasible and est.reasons
    assert cm.estimate_fast(plan) == (est.iteration_s, 0.0, False)


def test_memo_records_replay_the_same_outputs():
    """Pipelines taken from the memo (all, or all but one as in a local search) give the
    kernel's outputs bit for bit."""
    c, w = regional_cluster(), toy_workload(8, boundary=3e6)
    rng = random.Random(11)
    cold, warm = CostModel(c, w, memo=False), CostModel(c, w)
    for _ in range(30):
        plan = random_plan(rng, c, 8)
        x = warm.flatten(plan)
        ref = cold.evaluate(x)
        for _ in range(2):  # simulated, then every pipeline from the memo
            for got, want in zip(warm.evaluate(x), ref, strict=True):
                np.testing.assert_array_equal(got, want)
        warm.clear_memo(x.keys[:1])  # one pipeline simulated again, the others remembered
        for got, want in zip(warm.evaluate(x), ref, strict=True):
            np.testing.assert_array_equal(got, want)


def test_memo_shares_simulations_between_interchangeable_devices():
    """Memo keys name device classes: a pipeline over other devices of the same classes
    reuses the simulation, exactly; a device with other links does not."""
    c, w = regional_cluster(), toy_workload(8, boundary=3e6)
    warm = CostModel(c, w)
    assert warm.classes[c.ids.index("a-1")] == warm.classes[c.ids.index("a-2")]
    assert warm.classes[c.ids.index("a-0")] != warm.classes[c.ids.index("a-1")]  # a-0 has an overridden link

    def plan(*devs):
        return Plan(pipelines=(Pipeline(stages=tuple(Stage(devices=(d,), layers=(4 * i, 4 * i + 4))
                                                     for i, d in enumerate(devs)),
                                        micro_batch_size=2, num_micro_batches=4),), schedule="zb-h2")

    first, same, other = plan("a-1", "c-0"), plan("a-2", "c-1"), plan("a-0", "c-0")
    assert warm.flatten(same).keys == warm.flatten(first).keys != warm.flatten(other).keys
    cold = CostModel(c, w, memo=False)
    for p in (first, same, other, first):
        assert warm.estimate(p) == cold.estimate(p)
    # plans over many interchangeable devices, sharing one memo, match the cold path bit for bit
    big = generate(16, seed=4, profile="datacenter")  # two servers of eight equal GPUs
    warm, cold = CostModel(big, w), CostModel(big, w, memo=False)
    rng = random.Random(3)
    for _ in range(60):
        p = random_plan(rng, big, 8)
        for got, want in zip(warm.evaluate(warm.flatten(p)), cold.evaluate(cold.flatten(p)), strict=True):
            np.testing.assert_array_equal(got, want)


def test_evaluate_plan_keeps_the_unpacked_signature():
    c, w = regional_cluster(), toy_workload(8, boundary=3e6)
    cm = CostModel(c, w, memo=False)
    plan = random_plan(random.Random(5), c, 8)
    x = cm.flatten(plan)
    ref = cm.evaluate(x)
    args = (cm.forward_prefix, cm.input_grad_prefix, cm.weight_grad_prefix, cm.boundary_bytes, cm.params_prefix,
            cm.activation_prefix, cm.activation_bytes, cm.flops, cm.bandwidth, cm.latency, cm.region, x.pipe_ptr,
            x.stage_dev, x.stage_a, x.stage_b, x.micro_batch_size, x.num_micro_batches, x.schedule, x.sync,
            x.period, cm.calib)
    P = len(x.pipe_ptr) - 1
    stage_out, pipe_out, _ = ref
    known = np.arange(P) % 2 == 0  # every other pipeline given, as a memo would
    got = kernel.evaluate_plan(*args, known, stage_out[:, [3, 4, 7]], pipe_out, capacity=cm.capacity_bytes)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a, b)
    assert kernel.out_size(P, len(x.stage_dev)) == 7 + 6 * P + 12 * len(x.stage_dev)


def test_sync_groups_wrapper():
    lo, hi, holder = kernel.sync_groups(np.array([0, 2, 3]), np.array([0, 3, 0]), np.array([3, 8, 8]),
                                        np.array([0, 1, 2]), 8)
    assert lo.tolist() == [0, 3] and hi.tolist() == [3, 8]
    assert holder.tolist() == [[0, 2], [1, 2]]


def test_every_compiled_function_lives_in_the_kernel_module():
    """numba's cache checks only the defining file of a function: a compiled callee kept in
    another module could be served stale after an edit. So all of it is in `kernel`."""
    from numba.core.registry import CPUDispatcher

    for mod in (schedules, collectives, costmodel):
        for name, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher):
                assert obj.py_func.__module__ == kernel.__name__, f"{mod.__name__}.{name}"


def _long(plan: Plan, rng: random.Random) -> Plan:
    """`plan` with thousands of micro-batches a pipeline (micro-batch 1: at most 65,536 in all)."""
    pipes = tuple(dataclasses.replace(p, micro_batch_size=1, num_micro_batches=rng.randint(kernel.SCREEN_FROM, 9000))
                  for p in plan.pipelines)
    return dataclasses.replace(plan, pipelines=pipes)


def test_screening_extrapolates_long_pipelines_closely_and_keeps_its_records_apart():
    c, w = regional_cluster(), dataclasses.replace(toy_workload(8, boundary=3e6), global_batch=65536)
    rng = random.Random(0)
    cm = CostModel(c, w)
    differs = same = 0
    for _ in range(12):
        plan = _long(random_plan(rng, c, 8), rng)
        assert all(kernel._simulated(p.num_micro_batches, len(p.stages), True) < p.num_micro_batches
                   for p in plan.pipelines)  # screening applies: these are extrapolated
        exact = cm.estimate(plan)
        with cm.screened():
            assert cm.mode
            screened = cm.estimate(plan)
        assert not cm.screening
        assert screened.iteration_s == pytest.approx(exact.iteration_s, rel=1e-3)
        assert screened.pipeline_period_s == pytest.approx(exact.pipeline_period_s, rel=1e-3)
        # memory never under-counted (the order that wins may differ; gpipe holds all M)
        assert all(screened.peak_memory_gb[d] >= gb for d, gb in exact.peak_memory_gb.items())
        same += screened.peak_memory_gb == exact.peak_memory_gb
        assert screened.feasible == exact.feasible
        differs += screened.iteration_s != exact.iteration_s
        assert cm.estimate(plan) == exact  # the exact memo records were not overwritten by screened ones
        assert CostModel(c, w).estimate(plan) == exact
    assert differs  # so the memo check above bites
    assert same >= 10


def test_screening_changes_nothing_below_its_threshold():
    small = CostModel(regional_cluster(), toy_workload(8))
    with small.screened():
        assert not small.screens and not small.mode  # the batch allows no pipeline to screen
    c, w = regional_cluster(), dataclasses.replace(toy_workload(8, boundary=3e6), global_batch=65536)
    rng = random.Random(1)
    cm = CostModel(c, w)
    for _ in range(8):
        plan = random_plan(rng, c, 8)
        pipes = tuple(dataclasses.replace(p, num_micro_batches=kernel.SCREEN_FROM - 1) for p in plan.pipelines[:1])
        plan = dataclasses.replace(plan, pipelines=pipes)
        exact = CostModel(c, w).estimate(plan)
        with cm.screened():
            assert cm.estimate(plan) == exact
