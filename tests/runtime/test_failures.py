"""Refusals before any process starts, a dying worker, and --resume after it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import ASYMMETRIC, CLUSTER, plan, run_plan, spantrain, spantrain_here, write_inputs

from spantrain.runtime.launcher import workers_file


def _one_error_line(code: int, out: str, err: str, expected: int = 2) -> str:
    """The error line; besides it stderr may only hold notes (e.g. that workers share cores).
    `expected`: 2 for bad input or a refusal, 1 for a run that failed on its own."""
    assert code == expected, err
    assert out == ""
    lines = [x for x in err.strip().splitlines() if not x.startswith("spantrain run: note: ")]
    assert len(lines) == 1 and lines[0].startswith("spantrain run: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _run_args(tmp_path, plan_dict, *extra):
    cluster, model = write_inputs(tmp_path)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_dict))
    return ["run", "--cluster", str(cluster), "--model", str(model), "--plan", str(path), *extra]


def test_invalid_plan_is_refused_before_any_process_starts(tmp_path):
    bad = plan("1f1b", "allreduce", [(1, 4, [("a-0", 0, 2), ("nope", 3, 6)])])
    # a real process: exit code and stderr exactly as a shell sees them
    proc = spantrain(*_run_args(tmp_path, bad, "--steps", "2", "--run-dir", str(tmp_path / "run")), timeout=60)
    line = _one_error_line(proc.returncode, proc.stdout, proc.stderr)
    assert "unknown device 'nope'" in line and "layers [2, 3) are not covered" in line
    assert f"plan {tmp_path / 'plan.json'}: " in line  # the user may have several plan files
    # an unknown device said nothing of what to do (a plan for another cluster, or one a device left)
    assert line.endswith("(made for another cluster, or devices left this one: make a plan for this one with "
                         f"spantrain plan -o, or move this plan onto it with spantrain plan --from "
                         f"{tmp_path / 'plan.json'} -o NEW)"), line
    assert not (tmp_path / "run").exists()  # nothing was launched


@pytest.mark.parametrize("extra, expected", [
    (["--steps", "0"], "--steps must be a positive integer"),
    (["--steps", "2", "--resume", "--checkpoint-dir", "EMPTY"],
     "no complete checkpoint in EMPTY: pass the directory that holds the run's checkpoints, or leave out --resume"),
    (["--steps", "2", "--data", "MISSING"], "file not found"),
    (["--steps", "2", "--data", "/dev/zero"], "--data /dev/zero is not a regular file: pass a text file"),
])
def test_bad_run_arguments_are_one_line(tmp_path, extra, expected):
    extra = [str(tmp_path / "empty") if x == "EMPTY" else str(tmp_path / "missing.txt") if x == "MISSING" else x
             for x in extra]
    expected = expected.replace("EMPTY", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    result = spantrain_here(*_run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), *extra,
                                       "--run-dir", str(tmp_path / "run")))
    assert expected in _one_error_line(*result)
    assert not (tmp_path / "run").exists()


def test_resuming_in_a_checkpoint_dir_another_run_holds_names_that_run(tmp_path):
    from spantrain.runtime.launcher import run_dir_lock

    ckpt = tmp_path / "ckpt"
    with run_dir_lock(ckpt, "--checkpoint-dir"):  # a run that has written no checkpoint yet
        result = spantrain_here(*_run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "2",
                                           "--resume", "--checkpoint-dir", str(ckpt), "--run-dir",
                                           str(tmp_path / "run")))
    assert (f"--checkpoint-dir {ckpt} is in use by another spantrain run (pid {os.getpid()}): wait for it to "
            "finish") in _one_error_line(*result)
    # --metrics in a live run's directory: read "... or pass another --metrics M: its directory"
    live = tmp_path / "live"
    with run_dir_lock(live):
        result = spantrain_here(*_run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "2",
                                           "--metrics", str(live / "metrics.jsonl"),
                                           "--run-dir", str(tmp_path / "run")))
    assert _one_error_line(*result) == (f"spantrain run: error: --metrics {live / 'metrics.jsonl'} is in the "
                                        f"directory of another spantrain run (pid {os.getpid()}), which is running: "
                                        "wait for it to finish, or pass another --metrics")


@pytest.mark.parametrize("extra, expected", [
    (["--seed", "-1"], "--seed must be an integer from 0 to 4294967295, got -1"),
    (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    (["--weight-decay", "nan"], "--weight-decay must be a finite number >= 0, got nan"),
    (["--adam-eps", "inf"], "--adam-eps must be a finite number > 0, got inf"),
    # AdamW would flip the weights' sign; the run diverged, and its note blamed --lr
    (["--weight-decay", "1e308"], "--weight-decay times --lr must be below 1 (AdamW shrinks the weights by that "
                                  "fraction each step), got 1e+308 x 0.001: lower --weight-decay"),
    # 100,000 gave "worker rank 0 ... exited with code 1", a failed run (exit 1), not bad input
    (["--threads", "100000"], "--threads must be from 1 to 256, got 100000"),
    (["--timeout", "inf"], "--timeout must be a finite number of seconds in [1, 604800], got inf"),
    # gloo aborted the workers below a second ("killed by SIGABRT")
    (["--timeout", "0.001"], "--timeout must be a finite number of seconds in [1, 604800], got 0.001"),
    (["--checkpoint-dir", "FILE"], "--checkpoint-dir FILE is a file, not a directory"),
    (["--run-dir", "FILE"], "--run-dir FILE is a file, not a directory"),
    (["--data", "DIR"], "--data DIR is a directory"),
    (["--rank-map", "NOMAP"], "--rank-map NOMAP: file not found"),  # was the path alone
    # the launcher read it back to its end: all memory, then the kernel's OOM kill
    (["--metrics", "/dev/zero"], "--metrics /dev/zero is not a regular file (a device or a pipe): pass a file path"),
    # found now, not when the first checkpoint is written (here: the end of the run)
    (["--checkpoint-dir", "NESTED"], "--checkpoint-dir NESTED cannot be written (Not a directory): pass a directory"),
    # a new run there would overwrite that run's checkpoints
    (["--checkpoint-dir", "CKPT"], "--checkpoint-dir CKPT already holds the checkpoints of a run (latest: "
                                   "step-00000004): add --resume to continue it, or pass another directory"),
    # rank 0 failed on it with "FileExistsError: [Errno 17] File exists" once the workers had started
    (["--metrics", "NESTED"], "--metrics NESTED: its directory FILE cannot be written (Not a directory): pass a file "
                              "path in a directory this run can write"),
    # the "checkpoint: DIR/step-N" a run prints, passed back: found nothing to resume, or got written into
    (["--checkpoint-dir", "ONE", "--resume"], "--checkpoint-dir ONE is one checkpoint, not a checkpoint directory: "
                                              "pass the directory that holds it, CKPT (--resume continues"),
    (["--checkpoint-dir", "ONE"], "--checkpoint-dir ONE is one checkpoint, not a checkpoint directory"),
    # it trained every iteration, then failed at the end: IsADirectoryError: '.latest.tmp' -> 'latest'
    (["--checkpoint-dir", "PTRD"], "--checkpoint-dir PTRD holds PTRD/latest, which is not the "
                                         "pointer file a run writes there (a directory?): remove it"),
    # was a bare "RUN: Is a directory" from a worker
    (["--metrics", "RUN"], "--metrics RUN is the --run-dir directory: pass a file path"),
    # was "--metrics PLAN holds another run's metrics ... continue that run with --resume"
    (["--metrics", "PLAN"], "--metrics PLAN is the file --plan reads: pass another file for the metrics"),
    # the plan trains 10 samples per iteration: a different --global-batch is refused, not ignored
    (["--global-batch", "8"], "--global-batch 8 but plan PLAN trains 10 samples per iteration (pass --global-batch "
                              "10, or leave it out)"),
])
def test_bad_values_and_paths_are_refused_before_any_process_starts(tmp_path, extra, expected):
    places = {"FILE": tmp_path / "a-file", "DIR": tmp_path / "a-dir", "PLAN": tmp_path / "plan.json",
              "NESTED": tmp_path / "a-file" / "ckpt", "CKPT": tmp_path / "ckpt",
              "ONE": tmp_path / "ckpt" / "step-00000004", "NOMAP": tmp_path / "none.json", "RUN": tmp_path / "run",
              "PTRD": tmp_path / "pd"}
    (places["PTRD"] / "latest").mkdir(parents=True)
    places["FILE"].write_text("x")
    places["DIR"].mkdir()
    (places["CKPT"] / "step-00000004").mkdir(parents=True)
    (places["CKPT"] / "step-00000004" / "train_state.json").write_text('{"step": 4}')
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "2",
                     "--run-dir", str(tmp_path / "run"), *[str(places.get(x, x)) for x in extra])
    line = _one_error_line(*spantrain_here(*args))
    for name, path in places.items():
        expected = expected.replace(name, str(path))
    assert line.startswith(f"spantrain run: error: {expected}"), line
    assert not (tmp_path / "run").exists()  # nothing was launched


def test_a_checkpoint_with_a_damaged_rng_state_is_named_with_what_to_do(tmp_path):
    """Not torch's "Expected a CPUGeneratorImplState of size ..." with "continue with --resume" from it."""
    one = plan("gpipe", "allreduce", [(5, 2, [("a-0", 0, 6)])])
    run_plan(tmp_path, "first", one, 1)
    state_file = tmp_path / "first.ckpt" / "step-00000001" / "train_state.json"
    state_file.write_text(json.dumps({**json.loads(state_file.read_text()), "rng_state": "AAAA"}))
    line = _one_error_line(*spantrain_here(*_run_args(tmp_path, one, "--steps", "2", "--resume", "--checkpoint-dir",
                                                      str(tmp_path / "first.ckpt"), "--run-dir",
                                                      str(tmp_path / "second"))))
    assert f"checkpoint file {state_file} has no valid 'rng_state'" in line
    assert f"delete {tmp_path / 'first.ckpt'} to start over" in line and "continue with --resume" not in line


def test_unknown_planner_is_a_clean_error(tmp_path):
    cluster, model = write_inputs(tmp_path)
    result = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--planner", "no-such-planner",
                            "--steps", "2")
    assert "unknown planner 'no-such-planner'" in _one_error_line(*result)


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_killed_worker_stops_the_run_and_resume_continues(tmp_path):
    ckpt, run_dir = tmp_path / "ckpt", tmp_path / "run"
    args = _run_args(tmp_path, plan("1f1b", "hierarchical", ASYMMETRIC), "--steps", "100000",
                     "--checkpoint-dir", str(ckpt), "--checkpoint-every", "3", "--run-dir", str(run_dir), "--track")
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: (ckpt / "latest").exists(), 120, "the first checkpoint")
        workers = json.loads(workers_file(run_dir).read_text())["workers"]
        victim = workers[1]["pid"]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=60)
        stopped_after = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    line = _one_error_line(proc.returncode, out, err, expected=1)  # not bad input: a script may retry it
    assert line.startswith("spantrain run: error: worker rank 1 (device b-0) was killed by SIGKILL"), err
    assert "--resume" in line
    assert stopped_after < 15, f"the run took {stopped_after:.1f} s to stop"
    assert not any(_alive(w["pid"]) for w in workers), "a worker outlived the run"
    # rank 0 ended its W&B run, marked failed (the worker's os._exit skips wandb's exit handler)
    (log,) = (run_dir / "wandb" / "wandb").glob("offline-run-*/logs/debug.log")
    assert "got exitcode: 1" in log.read_text()

    last = json.loads((ckpt / (ckpt / "latest").read_text().strip() / "train_state.json").read_text())["step"]
    code, out, err = spantrain_here(*_run_args(tmp_path, plan("1f1b", "hierarchical", ASYMMETRIC), "--steps",
                                               str(last + 2), "--checkpoint-dir", str(ckpt), "--resume", "--json",
                                               "--run-dir", str(tmp_path / "again")))
    assert code == 0, err
    result = json.loads(out)
    assert result["start_step"] == last and result["final_step"] == last + 2
    assert result["resumed_from"].endswith(f"step-{last:08d}")


@pytest.mark.slow
def test_a_worker_error_is_reported_in_one_line(tmp_path):
    ckpt = tmp_path / "ckpt"
    code, _, err = spantrain_here(*_run_args(tmp_path, plan("gpipe", "allreduce", ASYMMETRIC), "--steps", "2",
                                             "--checkpoint-dir", str(ckpt), "--checkpoint-every", "1",
                                             "--run-dir", str(tmp_path / "one")))
    assert code == 0, err
    for shard in (ckpt / "step-00000002").glob("*.distcp"):
        shard.unlink()  # the checkpoint's data is gone; its metadata still looks complete
    result = spantrain_here(*_run_args(tmp_path, plan("gpipe", "allreduce", ASYMMETRIC), "--steps", "3", "--resume",
                                       "--checkpoint-dir", str(ckpt), "--run-dir", str(tmp_path / "two")))
    line = _one_error_line(*result)
    assert "worker rank" in line and "cannot load checkpoint" in line, result
    # what to do instead of resuming from the same checkpoint again
    assert f"delete {ckpt / 'step-00000002'} to --resume from step-00000001, the checkpoint before it" in line
    assert "continue with --resume" not in line


def test_a_failed_run_leaves_no_half_written_checkpoint(tmp_path):
    """A crash during a save left `.tmp-step-N` (a model's size) until the next save, which a run
    never resumed never makes; the launcher removes it once no worker is left writing."""
    ckpt, run_dir = tmp_path / "ckpt", tmp_path / "run"
    (ckpt / ".tmp-step-00000007").mkdir(parents=True)  # what a kill during the save of step 7 left
    (ckpt / ".tmp-step-00000007" / "__0_0.distcp").write_bytes(b"x" * 1000)
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "100000", "--checkpoint-dir",
                     str(ckpt), "--run-dir", str(run_dir))
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: '"loss"' in (run_dir / "metrics.jsonl").read_text()
                  if (run_dir / "metrics.jsonl").exists() else False, 120, "the first iteration")
        os.kill(json.loads(workers_file(run_dir).read_text())["workers"][1]["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    _one_error_line(proc.returncode, out, err, expected=1)
    assert not list(ckpt.glob(".tmp-step-*"))


@pytest.mark.slow
def test_frozen_worker_is_named_and_the_run_ends_within_the_timeout(tmp_path):
    """A worker that stops answering (SIGSTOP: alive, silent) must not hang the run."""
    run_dir = tmp_path / "run"
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "100000", "--timeout", "5",
                     "--run-dir", str(run_dir))
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(lambda: '"loss"' in (run_dir / "metrics.jsonl").read_text()
                  if (run_dir / "metrics.jsonl").exists() else False, 120, "the first iteration")
        workers = json.loads(workers_file(run_dir).read_text())["workers"]
        os.kill(workers[1]["pid"], signal.SIGSTOP)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=90)
        stopped_after = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    line = _one_error_line(proc.returncode, out, err, expected=1)
    assert "worker rank 1 (device b-0) stopped responding" in line
    assert stopped_after < 5 + 25, f"the run took {stopped_after:.1f} s to stop"
    assert not any(_alive(w["pid"]) for w in workers)


@pytest.mark.slow
def test_workers_of_a_killed_launcher_exit_while_it_is_not_yet_reaped(tmp_path):
    """A script that runs `spantrain run` and reads its output reaps it only when the output ends;
    the fork server holds that output until the workers exit, so they must see the killed
    launcher's zombie as gone."""
    run_dir, ckpt, tmp = tmp_path / "run", tmp_path / "ckpt", tmp_path / "tmp"
    tmp.mkdir()
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "100000", "--run-dir", str(run_dir),
                     "--checkpoint-dir", str(ckpt))
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp)})
    try:
        _wait_for(lambda: '"loss"' in (run_dir / "metrics.jsonl").read_text()
                  if (run_dir / "metrics.jsonl").exists() else False, 120, "the first iteration")
        workers = json.loads(workers_file(run_dir).read_text())["workers"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    _wait_for(lambda: not any(_alive(w["pid"]) for w in workers), 10, "the workers to exit")
    # they stopped as on the launcher's SIGTERM: together, with a checkpoint of the last iteration
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (end,) = [r for r in records if r.get("event") == "end"]
    assert end["stopped_early"] and end["final_step"] == max(r["step"] for r in records if "loss" in r)
    assert (ckpt / "latest").read_text().strip() == f"step-{end['final_step']:08d}"
    # the launcher's multiprocessing directory (the fork server's socket): its exit handler never ran
    _wait_for(lambda: not list(tmp.glob("pymp-*")), 10, "the fork server to remove the launcher's pymp-* directory")


@pytest.mark.slow
def test_a_tracked_worker_killed_outright_leaves_no_temporary_directory(tmp_path):
    # rank 0 killed with -9 left W&B's tmp*wandb-media and tmp*wandb-artifacts in /tmp
    run_dir, tmp = tmp_path / "run", tmp_path / "tmp"
    tmp.mkdir()
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "100000", "--run-dir", str(run_dir),
                     "--track")
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(tmp), "WANDB_MODE": "offline"})
    try:
        _wait_for(lambda: '"loss"' in (run_dir / "metrics.jsonl").read_text()
                  if (run_dir / "metrics.jsonl").exists() else False, 120, "the first iteration")
        workers = json.loads(workers_file(run_dir).read_text())["workers"]
        assert list(tmp.glob("spantrain-workers-*/*wandb*")), list(tmp.rglob("*"))  # where W&B put them
        os.kill(workers[0]["pid"], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1 and "worker rank 0" in err and "killed by SIGKILL" in err, err
    # (torch's own empty inductor cache directory, made when the fork server imports torch, is no leftover of a run)
    assert [p for p in tmp.iterdir() if p.name != "torchinductor_root"] == [], list(tmp.rglob("*"))


@pytest.mark.parametrize("emulated", [False, True])
def test_ctrl_c_as_a_launch_begins_leaves_no_temporary_directory(tmp_path, monkeypatch, emulated):
    # Ctrl-C right after an --adapt switch's "continuing from iteration N on the new plan" left an
    # empty /tmp/spantrain-workers-* behind: the launch had made it, and had not reached its `finally`
    import tempfile

    from spantrain.runtime import launcher
    from spantrain.runtime.config import RunConfig

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    _, model = write_inputs(tmp_path)
    cfg = RunConfig(cluster_spec=CLUSTER, model=str(model), global_batch=None,
                    plan=plan("1f1b", "allreduce", ASYMMETRIC), steps=3, run_dir=str(tmp_path / "run"),
                    metrics_path=str(tmp_path / "run" / "metrics.jsonl"))

    def ctrl_c(*args, **kwargs):
        assert list(tmp.glob("spantrain-workers-*"))  # made by now
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_Progress", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        if emulated:
            launcher.launch_emulated(cfg, mode="local")
        else:
            launcher.launch_local(cfg)
    # (multiprocessing's own pymp-* directory goes when this process exits)
    assert list(tmp.glob("spantrain-workers-*")) == []


def test_a_signal_to_one_worker_stops_the_run_with_a_checkpoint_and_says_which(tmp_path):
    # it ended "trained iterations 0..4 of 30 (stopped early)" with exit 0: a script took it as done
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "100000", "--run-dir", str(run_dir),
                     "--checkpoint-dir", str(ckpt), "--json")
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _wait_for(lambda: '"loss"' in (run_dir / "metrics.jsonl").read_text()
                  if (run_dir / "metrics.jsonl").exists() else False, 120, "the first iteration")
        workers = json.loads(workers_file(run_dir).read_text())["workers"]
        os.kill(workers[1]["pid"], signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    result = json.loads(out)
    assert proc.returncode == 130 and result["stopped_early"], err
    assert result["stopped_by"] == [{"rank": 1, "device": workers[1]["device"], "signal": "SIGTERM"}]
    assert err.strip().splitlines()[-1] == (
        f"spantrain run: interrupted: worker rank 1 (device {workers[1]['device']}) got SIGTERM, and the run stopped "
        f"with it after iteration {result['final_step']}; last checkpoint: {result['checkpoint']} (continue with "
        "--resume)"), err
    assert result["checkpoint"].endswith(f"step-{result['final_step']:08d}")


@pytest.fixture
def small_disk(tmpfs):
    """A 1 MB tmpfs (root only)."""
    return tmpfs("1M")


def _fill(disk: Path, leave_kb: int) -> None:
    free_kb = shutil.disk_usage(disk).free // 1024
    (disk / "fill").write_bytes(b"\0" * (free_kb - leave_kb) * 1024)


def test_a_full_run_directory_is_refused_up_front(tmp_path, small_disk):
    # an empty file still fits: the run started and a worker failed after 8 iterations with no reason
    _fill(small_disk, 16)
    line = _one_error_line(*spantrain_here(*_run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "2",
                                                      "--run-dir", str(small_disk / "run"))))
    assert line == (f"spantrain run: error: --run-dir {small_disk / 'run'}: cannot write in '{small_disk}' (its disk "
                    "is full: 16 KB free); free some space, or pass a directory on another disk"), line


def test_a_worker_failed_by_its_full_run_directory_is_reported_with_the_fix(tmp_path, small_disk):
    # "the disk of RUN is full (16 KB free)" named no fix; --resume alone fails the same way
    from types import SimpleNamespace

    from spantrain.runtime.launcher import _failure_error

    (small_disk / "run" / "logs").mkdir(parents=True)
    _fill(small_disk, 16)
    cfg = SimpleNamespace(run_dir=str(small_disk / "run"), checkpoint_dir=None)
    line = str(_failure_error(cfg, ["a-0", "a-1"], 0, "exited with code 1", 8))
    assert line == (f"worker rank 0 (device a-0) exited with code 1 after iteration 8: the disk of "
                    f"{small_disk / 'run'} is full (16 KB free): free some space; stopped the other 1 worker(s); "
                    "no checkpoint was written; "
                    f"logs in {small_disk / 'run' / 'logs'}"), line


def test_a_resume_into_its_runs_directory_on_a_full_disk_is_refused_up_front(tmp_path, small_disk):
    # the run directory a --resume continues in (not passed as --run-dir) went unchecked: the workers
    # failed at once, exit 1, "continue with --resume", which failed the same way
    one = plan("1f1b", "allreduce", [(2, 2, [("a-0", 0, 6)])])
    ckpt = tmp_path / "ckpt"
    code, _, err = spantrain_here(*_run_args(tmp_path, one, "--steps", "1", "--run-dir", str(small_disk / "run"),
                                             "--checkpoint-dir", str(ckpt)))
    assert code == 0, err
    _fill(small_disk, 16)
    line = _one_error_line(*spantrain_here(*_run_args(tmp_path, one, "--steps", "2", "--checkpoint-dir", str(ckpt),
                                                      "--resume")))
    assert line == (f"spantrain run: error: --run-dir {small_disk / 'run'}: cannot write in '{small_disk / 'run'}' "
                    "(its disk is full: 16 KB free); free some space, or pass a directory on another disk"), line
    assert (ckpt / "latest").read_text().strip() == "step-00000001"


@pytest.mark.slow
def test_a_run_directory_that_fills_up_stops_the_run_with_a_checkpoint_and_says_so(tmp_path, small_disk):
    # it failed with "exited with code 1 after iteration 8; ... no checkpoint was written", though the
    # checkpoint directory had room: the error file and the log were on the full disk too
    _fill(small_disk, 72)
    ckpt = tmp_path / "ckpt"
    code, out, err = spantrain_here(*_run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "100000",
                                               "--run-dir", str(small_disk / "run"), "--checkpoint-dir", str(ckpt)))
    line = _one_error_line(code, out, err, expected=1)
    saved = (ckpt / "latest").read_text().strip()
    assert f"exited with code 1 after iteration {int(saved.removeprefix('step-'))}: " in line, line
    assert (f"the disk of {small_disk / 'run'} is full" in line
            or "No space left on device" in line), line  # the worker's own line, when a few bytes were left
    assert line.endswith(f"last checkpoint: {ckpt / saved} (continue with --resume); logs in "
                         f"{small_disk / 'run' / 'logs'}"), line


def test_a_plan_whose_workers_outgrow_this_machine_is_refused_before_any_process_starts(tmp_path, monkeypatch):
    from spantrain.runtime import preflight

    monkeypatch.setattr(preflight, "available_memory_bytes", lambda: 1_000_000)  # 1 MB free
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "2", "--run-dir",
                     str(tmp_path / "run"))
    line = _one_error_line(*spantrain_here(*args))
    assert line.startswith("spantrain run: error: the plan's 4 workers need about ") and line.endswith(
        " together (cost model) and this machine has 1 MB available: use a smaller micro-batch size or model, "
        "or run the devices on their own machines (torchrun)"), line
    assert not (tmp_path / "run").exists()


def test_a_plan_too_big_for_its_devices_and_too_many_threads_run_with_notes(tmp_path):
    from spantrain.runtime.preflight import cpu_cores

    one = plan("gpipe", "allreduce", [(5, 2, [("a-0", 0, 6)])])
    args = _run_args(tmp_path, one, "--steps", "1", "--threads", "8", "--json", "--run-dir", str(tmp_path / "run"))
    cluster = tmp_path / "cluster.json"
    spec = json.loads(cluster.read_text())
    spec["devices"][0]["memory_gb"] = 0.001  # a-0 and a-1: 1 MB each, less than the model's training state
    cluster.write_text(json.dumps(spec))
    code, out, err = spantrain_here(*args)
    assert code == 0, err
    assert json.loads(out)["steps"] == 1  # it ran: the cost model may be conservative, the user decides
    notes = [x for x in err.splitlines() if x.startswith("spantrain run: note: ")]
    assert any(x.startswith("spantrain run: note: the cost model says the plan does not fit: a-0 needs ") and
               x.endswith("; on real devices it would run out of memory (`spantrain plan` finds one that fits)")
               for x in notes), err
    if cpu_cores() < 8:
        assert f"spantrain run: note: --threads 8 x 1 worker is 8 threads on {cpu_cores()} CPU cores: they will " \
               "wait for each other (leave --threads out to give each worker cores / workers = " \
               f"{cpu_cores()} thread{'s' if cpu_cores() > 1 else ''})" in notes, err


def test_resuming_with_a_learning_rate_passed_on_purpose_gives_no_reason_about_defaults():
    # beside test_run_cli's test_resuming_with_other_adamw_settings_says_so: "settings left out take their
    # defaults" told a user who passed --lr 5e-4 on purpose why it differed
    from spantrain.cli.run import other_optim_note

    before = {"lr": 3e-4, "weight_decay": 0.1, "eps": 1e-8}
    assert other_optim_note(before, {"lr": 5e-4, "weight_decay": 0.1, "eps": 1e-8}) == (
        "resuming with --lr 0.0005 (the checkpoint's run: 0.0003)")
    assert other_optim_note(before, {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-8}).endswith(
        "; AdamW settings left out take their defaults, not the checkpoint's")  # --lr left out: its default


def test_a_run_starting_while_another_command_probes_the_lock_is_not_refused(tmp_path):
    import fcntl
    import threading

    from spantrain.runtime.launcher import RUN_LOCK, lock_holder, run_dir_lock

    run = tmp_path / "run"
    with run_dir_lock(run):  # a finished run leaves its pid in the lock file
        pass
    assert lock_holder(run) is None
    # `lock_holder`'s probe (run --resume, train-policy) holds a shared lock for an instant
    fd = os.open(run / RUN_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    threading.Timer(0.03, os.close, (fd,)).start()
    with run_dir_lock(run):  # was refused, naming the finished run's pid as a live one
        assert (run / RUN_LOCK).read_text().strip() == str(os.getpid())


def test_a_new_run_into_a_used_run_dir_is_refused_and_a_refused_run_creates_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')  # a finished run's iterations
    args = _run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "2")
    # its records would have mixed with this run's in one file (a new run appends, as a resumed one must)
    line = _one_error_line(*spantrain_here(*args, "--run-dir", str(run), "--checkpoint-dir", str(tmp_path / "ck")))
    # that run left no checkpoint: --resume, where the message sent the user, refused for want of one
    assert line == (f"spantrain run: error: --run-dir {run} holds the metrics of a run that left no checkpoint to "
                    f"resume from ({run / 'metrics.jsonl'}): remove that file to start over in it, or pass another "
                    "--run-dir")
    # it did leave one (its run_config.json says where): the way on is named
    (tmp_path / "its-ck" / "step-00000001").mkdir(parents=True)
    (tmp_path / "its-ck" / "step-00000001" / "train_state.json").write_text('{"step": 1}')
    (run / "run_config.json").write_text(json.dumps({"checkpoint_dir": str(tmp_path / "its-ck")}))
    line = _one_error_line(*spantrain_here(*args, "--run-dir", str(run)))
    assert line == (f"spantrain run: error: --run-dir {run} holds another run's metrics ({run / 'metrics.jsonl'}): "
                    f"continue that run with --resume --checkpoint-dir {tmp_path / 'its-ck'}, or pass another "
                    "--run-dir (or remove that file)")
    shutil.rmtree(tmp_path / "its-ck")
    line = _one_error_line(*spantrain_here(*args, "--run-dir", str(tmp_path / "other"), "--metrics",
                                           str(run / "metrics.jsonl")))
    assert line.startswith(f"spantrain run: error: --metrics {run / 'metrics.jsonl'} holds another run's metrics")
    # refused after the directory checks: nothing made (an empty --checkpoint-dir was left behind)
    line = _one_error_line(*spantrain_here(*args, "--run-dir", str(tmp_path / "r2"), "--checkpoint-dir",
                                           str(tmp_path / "ck"), "--metrics", str(tmp_path / "m" / "m.jsonl"),
                                           "--loss-scale", "100"))
    assert "--loss-scale applies to fp16 training" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.json", "model.json", "plan.json", "run"]


def test_a_run_directory_removed_mid_run_still_ends_with_the_result(tmp_path):
    # the workers trained to the end and saved, and the run reported "rank 0 exited with code 1
    # after iteration 2: FileNotFoundError: .../result.json"
    import shutil
    import threading

    from spantrain.runtime.metrics import read_step_records

    run_dir = tmp_path / "run"

    def remove_after_the_first_iteration() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not read_step_records(run_dir / "metrics.jsonl"):
            time.sleep(0.01)
        shutil.rmtree(run_dir, ignore_errors=True)

    remover = threading.Thread(target=remove_after_the_first_iteration, daemon=True)
    remover.start()
    code, out, err = spantrain_here(*_run_args(tmp_path, plan("1f1b", "allreduce", ASYMMETRIC), "--steps", "6",
                                               "--run-dir", str(run_dir), "--json"))
    remover.join(1)
    assert code == 0, err
    assert json.loads(out)["final_step"] == 6 and (run_dir / "result.json").exists()
