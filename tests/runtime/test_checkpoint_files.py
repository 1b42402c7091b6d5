"""Checkpoint directories: atomic, keyed by layer, and refused for another model (one process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from runtime_helpers import MODEL, workload

from spantrain.errors import ExecutionError, RunFailed
from spantrain.runtime.checkpoint import Checkpointer, check_meta, latest_checkpoint, model_meta, read_tensors
from spantrain.runtime.metrics import summarize, warmup_steps
from spantrain.runtime.preflight import resume_state
from spantrain.workload import Workload, load_workload


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _save(ck: Checkpointer, step: int, value: float):
    tensors = {"layers.0.w": torch.full((3,), value), "optim.layers.0.w.exp_avg": torch.zeros(3)}
    return ck.save(step, tensors, {"step": step, "samples_seen": 10 * step, "seed": 0, "rng_state": ""},
                   model_meta(workload()))


def test_save_load_prune_and_latest(tmp_path, one_process_group):
    root = tmp_path / "ck"
    ck = Checkpointer(root, rank=0, barrier=dist.barrier, keep=2)
    for step in (1, 2, 3):
        _save(ck, step, float(step))
    (root / ".tmp-step-00000004").mkdir()  # a save that crashed half-way
    assert sorted(p.name for p in root.iterdir()) == [".tmp-step-00000004", "latest", "step-00000002",
                                                        "step-00000003"]
    assert latest_checkpoint(root) == root / "step-00000003"
    assert torch.equal(read_tensors(root / "step-00000003")["layers.0.w"], torch.full((3,), 3.0))
    target = {"layers.0.w": torch.zeros(3)}
    Checkpointer.load(root / "step-00000002", target)
    assert torch.equal(target["layers.0.w"], torch.full((3,), 2.0))
    # saving the same step again replaces it whole
    _save(ck, 3, 7.0)
    assert torch.equal(read_tensors(root / "step-00000003")["layers.0.w"], torch.full((3,), 7.0))
    with pytest.raises(ExecutionError, match="cannot load checkpoint"):
        Checkpointer.load(root / "step-00000003", {"layers.9.missing": torch.zeros(1)})


def test_a_damaged_newest_checkpoint_is_passed_over_aloud_and_never_kept_for_a_good_one(tmp_path, one_process_group,
                                                                                        capsys):
    root = tmp_path / "ck"
    ck = Checkpointer(root, rank=0, barrier=dist.barrier, keep=2)
    for step in (10, 12):
        _save(ck, step, float(step))
    (root / "step-00000012" / "train_state.json").unlink()  # damaged from outside
    # the resume falls back to step 10: it did so without a word
    state = resume_state(str(root), workload(), 20)
    assert state["step"] == 10 and capsys.readouterr().err.strip() == (
        f"spantrain run: note: resuming from step-00000010, the newest complete checkpoint: step-00000012 in {root} "
        "has no train_state.json (damaged), so it is passed over")
    # the resumed run saves step 11: the damaged 12 counted as one of the two kept, and 10 was deleted
    _save(ck, 11, 11.0)
    assert {p.name for p in root.glob("step-*")} == {"step-00000010", "step-00000011", "step-00000012"}
    assert latest_checkpoint(root) == root / "step-00000011"


def test_a_full_disk_is_named_not_torchs_stream_position(tmp_path, one_process_group, monkeypatch):
    import shutil
    from collections import namedtuple

    import torch.distributed.checkpoint as dcp

    def full(state, storage_writer):  # what torch raised on a 2 MB tmpfs, with part of a shard written
        Path(storage_writer.path).mkdir(parents=True)
        (Path(storage_writer.path) / "__0_0.distcp").write_bytes(b"part")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

    def usage_now(path):  # full while the parts are there (all ranks' parts: more than this rank's alone)
        return usage(2**21, 2**21, 0) if list(tmp_path.glob(".tmp-*/*")) else usage(2**21, 0, 2**21)

    monkeypatch.setattr(dcp, "save", full)
    usage = namedtuple("usage", "total used free")
    ck = Checkpointer(tmp_path, rank=0, barrier=lambda: None)
    monkeypatch.setattr(shutil, "disk_usage", usage_now)
    # the run failed (exit 1, worth a --resume once there is room), not its input (exit 2)
    with pytest.raises(RunFailed, match=r"no space left on the device \(0\.0 MB free, this rank's part alone is "
                                             r"0\.0 MB\): free some space, or pass a --checkpoint-dir on another disk"):
        _save(ck, 3, 1.0)
    assert not list(tmp_path.glob(".tmp-*"))  # the part written is gone: it only took space
    (tmp_path / "step-00000001").mkdir()  # older checkpoints: what can go
    (tmp_path / "step-00000002").mkdir()
    with pytest.raises(ExecutionError, match=r"free some space \(older checkpoints here: step-00000001; --resume "
                                             r"needs only the newest\), or pass"):
        _save(ck, 3, 1.0)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**30, 0, 2**30))  # room: another failure
    with pytest.raises(ExecutionError, match="unexpected pos 704 vs 598"):
        _save(ck, 3, 1.0)


def test_a_save_removes_what_crashed_saves_of_other_steps_left(tmp_path, one_process_group):
    # killed while writing step 4 and resumed from step 2: that run may never save step 4 again
    root = tmp_path / "ck"
    ck = Checkpointer(root, rank=0, barrier=dist.barrier, keep=2)
    _save(ck, 2, 2.0)
    (root / ".tmp-step-00000004").mkdir()
    (root / ".tmp-step-00000004" / "__0_0.distcp").write_bytes(b"x" * 100)
    (root / ".old-step-00000002").mkdir()  # killed while replacing a step saved twice
    _save(ck, 3, 3.0)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-00000002", "step-00000003"]


def test_latest_survives_a_missing_pointer(tmp_path):
    for step in (4, 12):
        d = tmp_path / f"step-{step:08d}"
        d.mkdir()
        (d / "train_state.json").write_text("{}")
    (tmp_path / "step-00000020").mkdir()  # no train_state.json: incomplete
    assert latest_checkpoint(tmp_path) == tmp_path / "step-00000012"
    assert latest_checkpoint(tmp_path / "nothing") is None


def test_meta_refuses_another_model(tmp_path):
    d = tmp_path / "step-00000003"
    d.mkdir()
    (d / "meta.json").write_text(json.dumps(model_meta(workload())))
    (d / "train_state.json").write_text(json.dumps({"step": 3, "samples_seen": 30, "seed": 1, "rng_state": ""}))
    assert check_meta(d, workload())["step"] == 3
    other = Workload.from_spec({**MODEL, "architecture": {**MODEL["architecture"], "d_model": 48}}, "other")
    # the workload's name is a --model value only for a preset
    with pytest.raises(ExecutionError, match="different architecture than 'rt-small': resume with the workload file "
                                             "it was trained with, or pass another --checkpoint-dir"):
        check_meta(d, other)
    (d / "meta.json").write_text(json.dumps(model_meta(load_workload("gpt2-small"))))
    with pytest.raises(ExecutionError, match="resume with --model gpt2-small, or"):
        check_meta(d, workload())
    (d / "meta.json").write_text(json.dumps(model_meta(workload())))
    assert resume_state(str(tmp_path), workload(), 5)["path"] == str(d)
    with pytest.raises(ExecutionError, match="leaves nothing to train"):
        resume_state(str(tmp_path), workload(), 3)
    with pytest.raises(ExecutionError, match="needs --checkpoint-dir"):
        resume_state(None, workload(), 5)


@pytest.mark.parametrize("state, problem", [
    ('{"step": 4, "samp', "is unreadable (Unterminated string"),  # cut short
    ("[]", "is unreadable (a JSON list, not an object)"),
    ("{}", "has no valid 'step'"),
    ('{"step": 4, "samples_seen": 40, "seed": 0}', "has no valid 'rng_state'"),
    # the workers failed on it with numpy's "expected non-negative integer"
    ('{"step": 4, "samples_seen": -40, "seed": 0, "rng_state": ""}', "has no valid 'samples_seen'"),
    ('{"step": 4, "samples_seen": 40, "seed": 0, "rng_state": "", "loss_scale": {"scale": "big"}}',
     "has no valid 'loss_scale'"),  # an fp16 run's
    # every worker failed on it with int()'s bare TypeError
    ('{"step": 4, "samples_seen": 40, "seed": 0, "rng_state": "", "loss_scale": {"scale": 8, "growth_interval": 2000, '
     '"clean": 0, "skipped": 1, "in_row": null}}', "has no valid 'loss_scale'"),
])
def test_a_damaged_checkpoint_is_named_with_what_to_do(tmp_path, state, problem):
    """Not a traceback, and not "continue with --resume" from the checkpoint that just failed."""
    good = {"step": 2, "samples_seen": 20, "seed": 0, "rng_state": ""}
    for step, text in ((2, json.dumps(good)), (4, state)):
        d = tmp_path / f"step-{step:08d}"
        d.mkdir()
        (d / "meta.json").write_text(json.dumps(model_meta(workload())))
        (d / "train_state.json").write_text(text)
    with pytest.raises(ExecutionError) as e:
        resume_state(str(tmp_path), workload(), 10)
    assert str(e.value).startswith(f"checkpoint file {tmp_path / 'step-00000004' / 'train_state.json'} {problem}")
    assert str(e.value).endswith(f"; delete {tmp_path / 'step-00000004'} to --resume from step-00000002, "
                                 "the checkpoint before it")
    (tmp_path / "step-00000002" / "meta.json").write_text("")
    with pytest.raises(ExecutionError, match=f"; delete {tmp_path} to start over$"):
        check_meta(tmp_path / "step-00000002", workload())
    # it said "has format None, this version reads 1", as if another version had written it
    (tmp_path / "step-00000004" / "meta.json").write_text("{}")
    with pytest.raises(ExecutionError) as e:
        check_meta(tmp_path / "step-00000004", workload())
    assert str(e.value) == (f"checkpoint file {tmp_path / 'step-00000004' / 'meta.json'} is damaged (its format is "
                            f"None); delete {tmp_path / 'step-00000004'} to --resume from step-00000002, the "
                            "checkpoint before it")


def test_summary_uses_medians_after_warmup():
    recs = [{"step": i + 1, "loss": 5.0 - i, "step_s": s, "samples_per_s": 10 / s}
            for i, s in enumerate([9.0, 3.0, 1.0, 2.0, 1.0])]
    out = summarize(recs)
    assert warmup_steps(5) == 2 and out["step_s"] == 1.0 and out["samples_per_s"] == 10.0
    assert out["loss_first"] == 5.0 and out["loss_last"] == 1.0 and out["steps"] == 5
    assert summarize(recs[:1])["step_s"] == 9.0
    # an even count: the rate is the batch over the median step, as the report prints them side by side
    even = [{"step": i + 1, "loss": 1.0, "step_s": s, "samples": 32, "samples_per_s": 32 / s}
            for i, s in enumerate([9.0, 3.0, 0.62, 0.64])]
    assert summarize(even)["step_s"] == 0.63 and summarize(even)["samples_per_s"] == 32 / 0.63


def test_a_worker_whose_checkpoint_cannot_be_written_failed_rather_than_refused(tmp_path, monkeypatch):
    # exit 2 (bad input) said "continue with --resume": the launcher's report now exits 1
    import types

    from spantrain.runtime import worker
    from spantrain.runtime.entry import EXIT_ERROR, EXIT_REFUSED, error_file

    cfg = types.SimpleNamespace(run_dir=str(tmp_path))
    for raised, code in ((RunFailed("cannot write checkpoint x: no space left"), EXIT_ERROR),
                         (ExecutionError("cannot load checkpoint x"), EXIT_REFUSED)):
        def fail(*args, raised=raised, **kwargs):
            raise raised

        monkeypatch.setattr(worker, "run_worker", fail)
        assert worker.guarded(cfg, rank=0, world_size=1, init_method=None, local=True) == (code, None)
        assert error_file(tmp_path, 0).read_text() == f"{raised}\n"


def test_a_shard_cut_short_is_said_so():
    # "cannot load checkpoint ...: EOFError:  (raised on rank 0)": the detail was empty
    from spantrain.runtime.checkpoint import _dcp_reason

    class Wrapped(Exception):
        failures = {1: (EOFError(), None), 0: (EOFError(), None)}

    assert _dcp_reason(Wrapped()) == ("EOFError: a file of the checkpoint ends too early (cut short or empty) (raised "
                                      "on rank 0)")
