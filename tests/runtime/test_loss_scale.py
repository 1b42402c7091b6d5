"""fp16's dynamic loss scale: the policy, unscaling, and one decision for all ranks."""

from __future__ import annotations

import json

import pytest
import torch
from runtime_helpers import (
    ASYMMETRIC,
    BATCH,
    EXACT_EPS,
    LR,
    plan,
    run_plan,
    run_ranks,
    spantrain_here,
    workload,
    write_inputs,
)

from spantrain.runtime.checkpoint import read_tensors
from spantrain.runtime.config import INITIAL_LOSS_SCALE, OptimConfig
from spantrain.runtime.loss_scale import LossScaler
from spantrain.runtime.models import build_stage_module
from spantrain.runtime.reference import train_reference


def _param(grad: list[float] | None) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.zeros(len(grad) if grad else 2))
    p.grad = torch.tensor(grad) if grad is not None else None
    return p


def test_an_overflow_halves_the_scale_and_clean_iterations_double_it():
    s = LossScaler(growth_interval=3)
    assert s.scale == INITIAL_LOSS_SCALE
    s.update(overflow=False)
    s.update(overflow=True)
    assert (s.scale, s.clean, s.skipped) == (INITIAL_LOSS_SCALE / 2, 0, 1)
    for _ in range(3):
        s.update(overflow=False)
    assert (s.scale, s.clean) == (INITIAL_LOSS_SCALE, 0)  # the third clean one in a row doubled it
    again = LossScaler()
    again.load_state_dict(s.state_dict())
    assert again == s


def test_overflow_that_never_clears_stops_the_run_before_the_scale_reaches_zero():
    from spantrain.errors import ExecutionError
    from spantrain.runtime.loss_scale import MAX_OVERFLOWS_IN_ROW

    s = LossScaler()
    for _ in range(MAX_OVERFLOWS_IN_ROW - 2):
        s.update(overflow=True)
    s.update(overflow=False)  # a clean one: the count starts again
    for _ in range(MAX_OVERFLOWS_IN_ROW - 1):
        s.update(overflow=True)
    with pytest.raises(ExecutionError, match=r"fp16 overflowed in 50 iterations in a row \(loss scale now .*\): "
                                             r".*train in bf16 or fp32 \(--precision\)"):
        s.update(overflow=True)  # halving on reached 0.0 after 1,091, then divided by it
    assert s.scale > 0


def test_unscaling_divides_the_gradients_and_finds_inf_and_nan():
    s = LossScaler(scale=4.0)
    params = [_param([4.0, 8.0]), _param(None), _param([2.0])]
    assert s.unscale(params).item() == 0.0
    assert params[0].grad.tolist() == [1.0, 2.0] and params[2].grad.tolist() == [0.5]
    for bad in (float("inf"), float("nan")):
        assert s.unscale([_param([1.0]), _param([bad])]).item() == 1.0
    assert s.unscale([]).item() == 0.0
    loss = s.scaled(lambda out, target: (out - target).sum())
    s.scale = 8.0  # read when the loss is computed, not when it was wrapped
    assert loss(torch.tensor([3.0]), torch.tensor([1.0])).item() == 16.0


_RANK = """
import sys, torch, torch.distributed as dist
from spantrain.runtime.loss_scale import LossScaler
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
p = torch.nn.Parameter(torch.zeros(2))
p.grad = torch.tensor([float("inf") if rank == 1 else 1.0, 2.0])  # only rank 1 overflowed
s = LossScaler(scale=2.0)
print(s.unscale_and_agree([p], dist.all_reduce), s.scale, s.skipped)
dist.destroy_process_group()
"""


def test_one_rank_overflowing_skips_the_update_on_every_rank(tmp_path):
    outs = run_ranks(_RANK, tmp_path / "store")
    assert [o.strip() for o in outs] == ["(2.0, True) 1.0 1"] * 2  # ran at 2, skipped, halved: both ranks


@pytest.mark.slow
def test_an_fp16_run_trains_as_fp32_does_and_overflows_are_skipped_everywhere(tmp_path):
    steps = 3
    res = run_plan(tmp_path, "fp16", plan("1f1b", "allreduce", ASYMMETRIC), steps, "--precision", "fp16")
    assert res["precision"] == "fp16" and res["skipped_steps"] == 0 and res["loss_scale"] == INITIAL_LOSS_SCALE
    optim = OptimConfig(lr=LR, eps=EXACT_EPS)  # updates proportional to gradients: every gradient error shows
    fp32 = train_reference(workload(), steps=steps, batch=BATCH, seed=0, optim=optim)
    assert res["losses"] == pytest.approx(fp32.losses, rel=1e-2) and res["losses"] != fp32.losses
    init = {k: p.detach() for ps in build_stage_module(workload(), 0, workload().num_layers, seed=0)
            .layer_parameters().values() for k, p in ps}
    params = read_tensors(res["checkpoint"])
    diff = torch.cat([(params[k] - v).flatten() for k, v in fp32.params.items()])
    size = torch.cat([(v - init[k]).flatten() for k, v in fp32.params.items()])
    assert float(diff.norm() / size.norm()) < 0.01  # fp16 rounding only: the scale divides out exactly

    # a scale far too large overflows: every rank skips, the scale halves each time, nothing moves
    res = run_plan(tmp_path, "huge", plan("1f1b", "allreduce", ASYMMETRIC), steps, "--precision", "fp16",
                   "--loss-scale", str(2.0**40))
    records = [json.loads(x) for x in (tmp_path / "huge" / "metrics.jsonl").read_text().splitlines()]
    steps_seen = [(r["loss_scale"], r["overflow"]) for r in records if "loss" in r]
    assert steps_seen == [(2.0**40, True), (2.0**39, True), (2.0**38, True)]
    assert res["skipped_steps"] == 3 and res["loss_scale"] == 2.0**37
    assert res["losses"] == pytest.approx([fp32.losses[0]] * 3, rel=1e-2)  # the same weights every iteration
    params = read_tensors(res["checkpoint"])
    assert all(torch.equal(params[k], init[k]) for k in init)
    assert all(float(v) == 0 for k, v in params.items() if k.endswith(".step"))  # AdamW never stepped

    # resumed, the run continues from the checkpoint's scale, not the flag's, says so, and counts its own skips
    cluster, model = write_inputs(tmp_path)
    code, out, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan",
                                    str(tmp_path / "huge.plan.json"), "--steps", str(steps + 1), "--precision", "fp16",
                                    "--loss-scale", str(2.0**40), "--checkpoint-dir", str(tmp_path / "huge.ckpt"),
                                    "--run-dir", str(tmp_path / "huge"), "--resume", "--json")
    assert code == 0, err
    assert "resuming with the checkpoint's loss scale 1.37439e+11 (not --loss-scale 1.09951e+12)" in err
    records = [json.loads(x) for x in (tmp_path / "huge" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss_scale"] for r in records if "loss" in r][-1] == 2.0**37
    assert json.loads(out)["skipped_steps"] == 1  # this launch's one iteration (2^37 still overflows)


def test_local_sgd_averages_replicas_whose_every_update_so_far_overflowed(tmp_path):
    # AdamW has no state before its first step: averaging it (at a sync point, and before the final
    # checkpoint of a run stopping between sync points) failed with KeyError 'exp_avg' on every rank
    res = run_plan(tmp_path, "lsgd", plan("1f1b", "local-sgd", ASYMMETRIC, period=2), 3, "--precision", "fp16",
                   "--loss-scale", str(2.0**40))
    assert res["skipped_steps"] == 3 and res["final_step"] == 3
    init = {k: p.detach() for ps in build_stage_module(workload(), 0, workload().num_layers, seed=0)
            .layer_parameters().values() for k, p in ps}
    params = read_tensors(res["checkpoint"])
    # replicas of unchanged weights average to them (weighted by batch share: up to a rounding)
    assert all(torch.allclose(params[k], init[k], rtol=0, atol=1e-7) for k in init)
    assert all(not v.any() for k, v in params.items() if k.endswith((".exp_avg", ".step")))  # AdamW never stepped


@pytest.mark.parametrize(("flags", "message"), [
    (["--loss-scale", "1024"], "--loss-scale applies to fp16 training, and this run trains in fp32"),
    (["--precision", "fp16", "--loss-scale", "0.5"], "--loss-scale must be a finite number in [1, 2^40], got 0.5"),
    (["--precision", "fp16", "--loss-scale", "inf"], "--loss-scale must be a finite number"),
])
def test_a_bad_loss_scale_is_refused_in_one_line(tmp_path, flags, message):
    cluster, model = write_inputs(tmp_path)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    code, _, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan", str(plan_path),
                                  "--steps", "1", "--run-dir", str(tmp_path / "run"), *flags)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
