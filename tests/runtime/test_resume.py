"""Checkpoints are keyed by layer: a run resumed onto a different plan continues exactly."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import ASYMMETRIC, plan, run_plan, spantrain_here, write_inputs

from spantrain.runtime.checkpoint import latest_checkpoint, read_tensors
from spantrain.runtime.launcher import RUN_LOCK

pytestmark = pytest.mark.slow

# Three stages on three devices in another order, one pipeline, 2 micro-batches of 5: the
# cut, the ranks and the split of the batch all differ from ASYMMETRIC, and 1F1B with fewer
# micro-batches than stages runs as GPipe.
OTHER = plan("1f1b", "allreduce", [(5, 2, [("b-1", 0, 1), ("a-0", 1, 4), ("b-0", 4, 6)])])


def test_resume_onto_another_plan_continues_the_loss_sequence(tmp_path):
    # Default AdamW epsilon: the loss sequence must match as training really runs.
    full = run_plan(tmp_path, "full", plan("zb-h1", "allreduce", ASYMMETRIC), 4, eps=1e-8)
    first = run_plan(tmp_path, "first", plan("zb-h1", "allreduce", ASYMMETRIC), 2, eps=1e-8)
    assert first["checkpoint"].endswith("step-00000002")
    # the run directory and each checkpoint hold the plan as it ran (for plan --from, and to resume on)
    for written in (tmp_path / "first" / "plan.json", tmp_path / "first.ckpt" / "step-00000002" / "plan.json"):
        ran = json.loads(written.read_text())
        assert {k: ran[k] for k in ("schedule", "sync", "pipelines")} == plan("zb-h1", "allreduce", ASYMMETRIC)

    cluster, model = write_inputs(tmp_path)
    (tmp_path / "other.json").write_text(json.dumps(OTHER))
    code, out, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan",
                                    str(tmp_path / "other.json"), "--steps", "4", "--lr", "0.01", "--adam-eps", "1e-8",
                                    "--run-dir", str(tmp_path / "second"), "--checkpoint-dir",
                                    str(tmp_path / "first.ckpt"), "--resume", "--json")
    assert code == 0, err
    assert ("note: resuming on another plan than the run of checkpoint step-00000002 continued on: pass --plan "
            f"{tmp_path / 'first.ckpt' / 'step-00000002' / 'plan.json'} to continue on that one") in err
    second = json.loads(out)
    assert second["start_step"] == 2 and second["final_step"] == 4 and second["world_size"] == 3
    assert second["resumed_from"].endswith("step-00000002")
    assert first["losses"] + second["losses"] == pytest.approx(full["losses"], rel=1e-5)
    # the checkpoints of both plans hold the same layers under the same keys
    assert set(read_tensors(second["checkpoint"])) == set(read_tensors(full["checkpoint"]))


def test_checkpoints_are_complete_or_absent(tmp_path):
    res = run_plan(tmp_path, "ck", plan("gpipe", "allreduce", ASYMMETRIC), 5, "--checkpoint-every", "2",
                   "--keep-checkpoints", "2")
    root = tmp_path / "ck.ckpt"
    # every 2 iterations plus the end, the newest two kept, nothing half-written left behind
    # (the lock the run held on the directory stays: the kernel released it)
    assert sorted(p.name for p in root.iterdir() if p.name != RUN_LOCK) == ["latest", "step-00000004",
                                                                             "step-00000005"]
    assert latest_checkpoint(root).name == "step-00000005" == res["checkpoint"].rsplit("/", 1)[-1]
    state = json.loads((root / "step-00000005" / "train_state.json").read_text())
    assert state["step"] == 5 and state["samples_seen"] == 50 and state["rng_state"]
    keys = read_tensors(root / "step-00000005")
    assert "layers.0.tok.weight" in keys and "optim.layers.5.proj.weight.exp_avg_sq" in keys
    assert not any(k.startswith("rank") for k in keys)
