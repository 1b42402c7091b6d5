"""Zero-bubble op orders: valid, within their memory limits, and checked before they run."""

from __future__ import annotations

import pytest

from spantrain.errors import ExecutionError
from spantrain.runtime.zb_order import builtin_orders, check_orders, stage_orders, to_actions


def _peak_in_flight(ops):
    """Most micro-batches between their F and their W on one stage."""
    live = peak = 0
    for op, _ in ops:
        live += {"F": 1, "W": -1, "B": 0, "BW": -1}[op]
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize("schedule", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("stages, micro", [(1, 1), (1, 4), (2, 1), (2, 5), (3, 2), (4, 8), (5, 12)])
def test_builtin_orders_are_valid_and_bounded(schedule, stages, micro):
    orders = builtin_orders(schedule, stages, micro)
    assert check_orders(orders, stages, micro, "test") == orders
    for s, ops in enumerate(orders):
        depth = stages - s
        limit = depth if schedule == "zb-h1" else 2 * depth - 1
        assert _peak_in_flight(ops) <= max(1, min(limit, micro))
        assert all(op != "BW" for op, _ in ops)  # the point of zero bubble: B and W apart


def test_zb_h2_warms_up_deeper_than_zb_h1():
    def warmup(orders):
        return next(i for i, (op, _) in enumerate(orders[0]) if op != "F")
    assert warmup(builtin_orders("zb-h2", 4, 8)) > warmup(builtin_orders("zb-h1", 4, 8)) == 4


def test_unequal_stage_times_still_give_valid_orders():
    orders = builtin_orders("zb-h1", 3, 6, f=[1, 3, 1], b=[1, 3, 1], w=[0.5, 2, 0.5])
    check_orders(orders, 3, 6, "test")


@pytest.mark.parametrize("bad, message", [
    ([[("F", 0), ("B", 0), ("W", 0)]], "one list per stage"),
    ([[("F", 0), ("W", 0), ("B", 0)], [("F", 0), ("BW", 0)]], "W0 comes after"),
    ([[("F", 0), ("B", 0)], [("F", 0), ("BW", 0)]], "micro-batch 0 runs"),
    ([[("F", 0), ("X", 0)], [("F", 0), ("BW", 0)]], "is not"),
    ([[("F", 1), ("BW", 1)], [("F", 0), ("BW", 0)]], "is not"),
])
def test_malformed_orders_are_refused(bad, message):
    with pytest.raises(ExecutionError, match=message):
        check_orders(bad, 2, 1, "test")


def test_stage_orders_prefers_the_cost_models_generator():
    orders, source = stage_orders("zb-h1", 3, 4, [1, 1, 1], [1, 1, 1], [1, 1, 1])
    check_orders(orders, 3, 4, source)
    try:
        import spantrain.env.schedules  # noqa: F401
    except ImportError:
        assert source == "built-in"
    else:
        assert source == "spantrain.env.schedules"


def test_actions_are_keyed_by_group_rank():
    from torch.distributed.pipelining.schedules import _ComputationType

    actions = to_actions([[("F", 0), ("B", 0), ("W", 0)], [("F", 0), ("BW", 0)]], {0: 1, 1: 0})
    assert [a.stage_index for a in actions[1]] == [0, 0, 0] and [a.stage_index for a in actions[0]] == [1, 1]
    assert [a.computation_type for a in actions[1]] == [_ComputationType.FORWARD, _ComputationType.BACKWARD_INPUT,
                                                        _ComputationType.BACKWARD_WEIGHT]
    assert actions[0][1].computation_type == _ComputationType.FULL_BACKWARD


def test_the_runtime_runs_the_order_costed_with_the_runs_calibration():
    # the calibrated prediction costs split backward ops and per-op overheads, which reorder a
    # zero-bubble schedule: the order computed with the built-in constants was not the one predicted
    from pathlib import Path

    from spantrain.cluster import Cluster
    from spantrain.env.calibration import EMULATED_CPU, Calibration
    from spantrain.env.costmodel import CostModel
    from spantrain.policies.heuristic import HeuristicPlanner
    from spantrain.runtime.config import RunConfig
    from spantrain.runtime.worker import _orders
    from spantrain.runtime.zb_order import run_orders
    from spantrain.workload import Workload

    cal = Calibration.from_file(EMULATED_CPU)
    cluster = Cluster.from_file(Path(__file__).resolve().parents[2] / "examples" / "calibration" / "three-site.yaml")
    workload = Workload.from_preset("gpt2-small")
    plan = HeuristicPlanner().plan(cluster, workload, cal)
    assert plan.schedule.startswith("zb-")
    orders, _ = run_orders(cluster, workload, plan, cal)
    costed = CostModel(cluster, workload, cal).stage_orders(plan)
    assert orders == [[[list(op) for op in stage] for stage in o] for o in costed]
    assert orders != run_orders(cluster, workload, plan)[0]  # the built-in constants' order differs here
    # a worker computing the order itself (torchrun, no launcher) takes the run's calibration too
    cfg = RunConfig(cluster_spec=cluster.to_spec(), model="gpt2-small", global_batch=None, plan=plan.to_dict(),
                    steps=1, run_dir="r", metrics_path="m", calibration=cal.to_dict())
    own, _ = _orders(cfg, cluster, workload, plan, 0)
    assert [[list(op) for op in stage] for stage in own] == orders[0]
