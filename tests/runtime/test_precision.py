"""bf16 mixed precision: fp32 weights and AdamW, bf16 compute and activations on the wire."""

from __future__ import annotations

import json

import pytest
import torch
from runtime_helpers import (
    ASYMMETRIC,
    BATCH,
    EXACT_EPS,
    LR,
    MODEL,
    plan,
    run_plan,
    spantrain_here,
    workload,
    write_inputs,
)

from spantrain.runtime.checkpoint import read_tensors
from spantrain.runtime.config import OptimConfig
from spantrain.runtime.models import build_stage_module, loss_fn
from spantrain.runtime.reference import train_reference


def _ids(w, n: int = 3) -> torch.Tensor:
    return torch.randint(0, w.arch.vocab_size, (n, w.seq_len), generator=torch.Generator().manual_seed(0))


def test_a_bf16_stage_computes_in_bf16_and_hands_on_bf16_but_keeps_fp32_weights_and_loss():
    w = workload()
    first = build_stage_module(w, 0, 3, seed=1, precision="bf16")
    last = build_stage_module(w, 3, w.num_layers, seed=1, precision="bf16")
    seen = []
    for mod in (first, last):
        for m in mod.modules():
            if isinstance(m, torch.nn.Linear):
                m.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    x = _ids(w)
    mid = first(x)
    logits = last(mid)
    assert mid.dtype == torch.bfloat16 and logits.dtype == torch.float32  # the wire; the loss's input
    assert seen and set(seen) == {torch.bfloat16}  # every matmul ran in bf16
    loss = loss_fn(logits, x)
    loss.backward()
    params = [p for mod in (first, last) for p in mod.parameters()]
    assert all(p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32 for p in params)
    # the same weights in fp32 compute nearly the same function
    full = build_stage_module(w, 0, w.num_layers, seed=1)(x)
    assert (logits - full).abs().max() < 0.05 * full.abs().max()
    assert not torch.equal(logits, full)


def test_an_fp32_stage_takes_a_bf16_neighbours_activations():
    """A GPU without bf16 trains fp32 beside bf16 stages: its input is upcast."""
    w = workload()
    mid = build_stage_module(w, 0, 3, seed=1, precision="bf16")(_ids(w))
    out = build_stage_module(w, 3, w.num_layers, seed=1)(mid)
    assert out.dtype == torch.float32


def test_unknown_precision_is_named():
    from spantrain.errors import WorkloadError

    with pytest.raises(WorkloadError, match="trains in fp32, bf16 or fp16, not 'fp8'"):
        build_stage_module(workload(), 0, 2, precision="fp8")


@pytest.mark.slow
def test_a_bf16_run_of_an_asymmetric_plan_trains_as_single_process_training_does(tmp_path):
    steps = 3
    res = run_plan(tmp_path, "bf16", plan("1f1b", "allreduce", ASYMMETRIC), steps, "--precision", "bf16")
    assert res["precision"] == "bf16"
    start = json.loads((tmp_path / "bf16" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["precision"] == "bf16"
    optim = OptimConfig(lr=LR, eps=EXACT_EPS)  # updates proportional to gradients: every gradient error shows
    fp32 = train_reference(workload(), steps=steps, batch=BATCH, seed=0, optim=optim)
    bf16 = train_reference(workload(), steps=steps, batch=BATCH, seed=0, optim=optim, precision="bf16")
    assert res["losses"] == pytest.approx(fp32.losses, rel=1e-2) and res["losses"] != fp32.losses
    params = read_tensors(res["checkpoint"])
    assert all(params[k].dtype == torch.float32 for k in fp32.params)  # fp32 master weights in the checkpoint
    init = {k: p.detach() for ps in build_stage_module(workload(), 0, workload().num_layers, seed=0)
            .layer_parameters().values() for k, p in ps}

    def update_error(trained: dict) -> float:
        """How far the steps' total update is from fp32 training's, relative to its size."""
        diff = torch.cat([((trained[k] - init[k]) - (v - init[k])).flatten() for k, v in fp32.params.items()])
        size = torch.cat([(v - init[k]).flatten() for k, v in fp32.params.items()])
        return float(diff.norm() / size.norm())

    # bf16 rounding only (0.13 % when written; fp32 runs match to float noise, test_exactness)
    assert update_error(params) < 0.01, (update_error(params), update_error(bf16.params))
    assert update_error(bf16.params) < 0.01


@pytest.mark.parametrize(("model_precision", "flag", "trains", "note"), [
    ("fp32", None, "fp32", False), ("bf16", None, "bf16", False), ("fp16", None, "bf16", True),
    ("bf16", "fp32", "fp32", False), ("fp16", "fp16", "fp16", False)])
def test_the_model_precision_sets_the_default(tmp_path, monkeypatch, model_precision, flag, trains, note):
    from spantrain.runtime import launcher

    seen = {}

    def capture(cfg, **kwargs):
        seen["precision"] = cfg.precision
        raise KeyboardInterrupt  # enough: the run's configuration is made

    monkeypatch.setattr(launcher, "launch_local", capture)
    cluster, _ = write_inputs(tmp_path)
    model = tmp_path / "model.json"
    model.write_text(json.dumps({**MODEL, "precision": model_precision}))
    code, _, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan",
                                  str(_write(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC))), "--steps", "1",
                                  "--run-dir", str(tmp_path / "run"), *(["--precision", flag] if flag else []))
    assert code == 130 and seen["precision"] == trains, err
    assert ("training the model's fp16 in bf16 mixed precision" in err) == note, err
    assert ("fp16 on CPUs computes many times slower" in err) == (trains == "fp16"), err  # no GPU here


def _write(tmp_path, plan_dict):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_dict))
    return path


def test_the_summary_line_names_mixed_precision(capsys):
    from spantrain.cli.run import _report

    result = {"start_step": 0, "final_step": 4, "target_steps": 4, "stopped_early": False, "loss_first": 5.5,
              "loss_last": 5.0, "samples_per_s": 10.0, "step_s": 1.0, "metrics": "m.jsonl"}
    _report({**result, "precision": "bf16"}, as_json=False)
    _report({**result, "precision": "fp32"}, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("trained iterations 0..4 of 4 in bf16 mixed precision: loss 5.5000 -> 5.0000")
    assert lines[2].startswith("trained iterations 0..4 of 4: loss 5.5000")


def test_the_summary_line_says_when_no_warm_up_was_left_out(capsys):
    # one iteration read "0.867 s/iteration, median after warm-up"
    from spantrain.cli.run import _report

    result = {"start_step": 0, "final_step": 1, "target_steps": 1, "stopped_early": False, "loss_first": 5.5,
              "loss_last": 5.5, "samples_per_s": 10.0, "step_s": 1.0, "metrics": "m.jsonl", "precision": "fp32"}
    _report({**result, "warmup_steps": 0}, as_json=False)
    _report({**result, "warmup_steps": 2}, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert "(1.000 s/iteration, warm-up included: too few iterations)" in lines[0], lines
    assert "(1.000 s/iteration, median after warm-up)" in lines[2], lines
