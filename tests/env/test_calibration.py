"""Calibration profiles: the file format, and the cost model's runtime-faithful mode
(`sync_overlap: false`, FLOP-based overheads, local-SGD bytes), against the reference and
against hand-computed iterations."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from costmodel_helpers import flat_cluster, random_plan, regional_cluster, toy_workload
from hypothesis import given, settings
from hypothesis import strategies as st

from spantrain.env import reference
from spantrain.env.calibration import Calibration
from spantrain.env.costmodel import CostModel
from spantrain.errors import SpecError
from spantrain.plan import Pipeline, Plan, Stage, Sync

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = Calibration(sync_overlap=False, op_overhead_flops=3e9, iteration_overhead_flops=5e9, op_overhead_s=1e-4,
                      message_overhead_s=2e-4, local_sgd_bytes_per_param=16.0, memory_bytes_per_flop=0.1,
                      split_input_grad_factor=1.6, split_weight_grad_factor=1.35)


def test_the_emulated_cpu_profile_loads():
    cal = Calibration.from_file(ROOT / "examples" / "calibration" / "emulated-cpu.yaml")
    assert cal.sync_overlap is False and cal.local_sgd_bytes_per_param == 16.0 and cal.op_overhead_flops > 0


def test_calibration_files_report_every_problem(tmp_path):
    path = tmp_path / "cal.yaml"
    path.write_text("calibration: {op_overhead_s: -1, message_overhead_s: 1.0e+308, sync_overlap: 3, bogus: 1, "
                    "memory_bytes_per_flop: 0}\nnote: anything\n")
    with pytest.raises(SpecError) as e:
        Calibration.from_file(path)
    msg = str(e.value)
    assert "op_overhead_s must be a number from 0 to 1e+30, got -1" in msg
    assert "sync_overlap must be true or false" in msg
    # past 1e30 the kernels' sums overflowed and `simulate` died in "pipeline order deadlocks"
    assert "message_overhead_s must be a number from 0 to 1e+30, got 1e+308" in msg
    assert "unknown constant 'bogus'" in msg
    assert "memory_bytes_per_flop must be from 1e-30 to 1e+30 (a rate the model divides by), got 0" in msg
    with pytest.raises(SpecError, match="file not found"):
        Calibration.from_file(tmp_path / "missing.yaml")
    assert Calibration.from_dict({"grad_bytes_per_param": None}) == Calibration()


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_runtime_mode_agrees_with_reference(seed):
    c, w = regional_cluster(), toy_workload(8, boundary=3e6)
    plan = random_plan(random.Random(seed), c, 8)
    assert CostModel(c, w, RUNTIME).estimate(plan) == reference.estimate(c, w, plan, RUNTIME)


def _dp_plan(sync: str, period: int = 1) -> Plan:
    pipes = tuple(Pipeline(stages=(Stage(devices=(d,), layers=(0, 4)),), micro_batch_size=2, num_micro_batches=3)
                  for d in ("d-0", "d-1"))
    return Plan(pipelines=pipes, schedule="gpipe", sync=Sync(mode=sync, period=period))


def test_runtime_mode_is_schedule_then_sync_then_optimizer():
    c, w = flat_cluster(2, tflops=1.0, gbps=1.0, latency_ms=2.0), toy_workload(4, params=1_000_000)
    cal = Calibration(sync_overlap=False, op_overhead_flops=1e9, iteration_overhead_flops=2e9)
    cm = CostModel(c, w, cal)
    est = cm.estimate(_dp_plan("allreduce"))
    f, b, wg = cm.compute_time("d-0", 0, 4, 2)
    assert cm.op_overhead("d-0") == pytest.approx(1e-3)  # 1e9 FLOPs at 1 TFLOP/s
    schedule = 3 * f + 3 * (b + wg - cm.op_overhead("d-0"))  # gpipe on one stage: 3 F, 3 fused backwards
    ring = 2 * (8e6 / 2 / 0.125e9 + 2e-3)  # 4M parameters' bf16 gradients, ring of two at 1 Gbit/s, 2 ms
    opt = cm.optimizer_time("d-0", 0, 4)
    assert est.iteration_s == pytest.approx(schedule + ring + opt + 2e-3)
    assert est.exposed_comm_s == pytest.approx(ring)


def test_runtime_mode_local_sgd_syncs_its_state_once_a_period():
    c, w = flat_cluster(2, tflops=1.0, gbps=1.0, latency_ms=2.0), toy_workload(4, params=1_000_000)
    cm = CostModel(c, w, Calibration(sync_overlap=False, local_sgd_bytes_per_param=16.0))
    every = cm.estimate(_dp_plan("local-sgd", 1))
    assert every.iteration_s == pytest.approx(cm.estimate(_dp_plan("allreduce")).iteration_s)  # period 1 = allreduce
    plain = every.iteration_s - every.exposed_comm_s
    four = cm.estimate(_dp_plan("local-sgd", 4))
    state_sync = 2 * (16 * 4e6 / 2 / 0.125e9 + 2e-3)  # 16 bytes per parameter (4M) at each sync point
    assert four.iteration_s == pytest.approx(plain + state_sync / 4)


def test_runtime_mode_ends_iterations_at_the_makespan():
    # The runtime meets all ranks after every iteration: no steady-state overlap of iterations
    # (ZB-H2's period), each stage's optimizer step follows its own last op.
    c, w = flat_cluster(3, latency_ms=5.0), toy_workload(6, boundary=3e6)
    stages = tuple(Stage(devices=(f"d-{i}",), layers=(2 * i, 2 * i + 2)) for i in range(3))
    plan = Plan(pipelines=(Pipeline(stages=stages, micro_batch_size=2, num_micro_batches=8),), schedule="zb-h2")
    est = CostModel(c, w, Calibration(sync_overlap=False)).estimate(plan)
    assert est.iteration_s == pytest.approx(est.pipeline_s[0] + est.optimizer_s)  # equal devices, equal steps
    assert est.pipeline_s[0] >= est.pipeline_period_s[0]


def test_flop_overheads_scale_with_the_device():
    c, w = regional_cluster(), toy_workload(8)
    cm = CostModel(c, w, Calibration(op_overhead_flops=4e9))
    assert cm.op_overhead("a-0") == pytest.approx(4e9 / 40e12)
    assert cm.op_overhead("c-0") == pytest.approx(4e9 / 6e12)
    base = CostModel(c, w).compute_time("c-0", 0, 8, 2)
    assert cm.compute_time("c-0", 0, 8, 2) == pytest.approx(tuple(x + 4e9 / 6e12 for x in base))


def test_split_backward_factors_cost_only_zero_bubble_ops():
    c, w = regional_cluster(), toy_workload(8)
    plain, split = CostModel(c, w), CostModel(c, w, Calibration(split_input_grad_factor=1.5,
                                                                split_weight_grad_factor=1.25))
    f0, b0, w0 = plain.compute_time("b-0", 2, 6, 3)
    f1, b1, w1 = split.compute_time("b-0", 2, 6, 3)
    assert (f1, b1, w1) == pytest.approx((f0, 1.5 * b0, 1.25 * w0))
    assert split.backward_time("b-0", 2, 6, 3) == pytest.approx(plain.backward_time("b-0", 2, 6, 3))
    stages = tuple(Stage(devices=(d,), layers=(4 * i, 4 * i + 4)) for i, d in enumerate(("a-0", "a-1")))
    for schedule, slower in (("1f1b", False), ("zb-h1", True)):
        plan = Plan(pipelines=(Pipeline(stages=stages, micro_batch_size=2, num_micro_batches=6),), schedule=schedule)
        a, b = plain.estimate(plan).iteration_s, split.estimate(plan).iteration_s
        assert (b > a) if slower else (b == a)


def test_unknown_constants_are_listed_once_with_the_known_ones(tmp_path):
    path = tmp_path / "suite.yaml"
    path.write_text("model: tiny-gpt\nsteps: 12\nwarmup: 3\n")  # a suite file passed by mistake
    with pytest.raises(SpecError) as e:
        Calibration.from_file(path)
    # the whole list of known constants came once per unknown key: nine times for a suite file
    assert str(e.value).count("known:") == 1 and "unknown constants 'model', 'steps', 'warmup' (known: " in str(e.value)


def test_a_constant_beside_the_calibration_section_is_refused(tmp_path):
    # the shipped profile keeps its constants under `calibration:`; a line appended at the top
    # level was taken for a note and ignored, so the profile silently lacked it
    path = tmp_path / "cal.yaml"
    path.write_text("calibration:\n  sync_overlap: false\nop_overhead_s: 0.001\nnote: anything\n")
    with pytest.raises(SpecError, match=r"'op_overhead_s' is outside the calibration: section, where constants are "
                                        r"ignored: move it into the section"):
        Calibration.from_file(path)
    path.write_text("calibration:\n  sync_overlap: false\n  op_overhead_s: 0.001\nnote: anything\n")
    assert Calibration.from_file(path) == Calibration(sync_overlap=False, op_overhead_s=0.001)


@pytest.mark.parametrize(("field", "value"), [("op_overhead_s", float("nan")), ("op_overhead_s", "1"),
                                              ("reserved_bytes", -1.0), ("memory_bytes_per_flop", 0.0),
                                              ("sync_overlap", 1)])
def test_a_calibration_built_in_code_checks_its_constants(field, value):
    # taken as given, where a calibration file's are checked: nan or "1" failed or predicted nan inside
    from spantrain.env.calibration import Calibration
    from spantrain.errors import SpecError
    with pytest.raises(SpecError, match=rf"^Calibration: {field} must be"):
        Calibration(**{field: value})
