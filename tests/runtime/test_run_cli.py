"""`spantrain run` as a user meets it: human output, metrics, data files, Ctrl-C, torchrun."""

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
from runtime_helpers import (
    ASYMMETRIC,
    BATCH,
    CLUSTER,
    EXACT_EPS,
    LR,
    default_stop_signals,
    plan,
    spantrain_here,
    workload,
    write_inputs,
)

from spantrain.runtime.checkpoint import read_tensors
from spantrain.runtime.config import OptimConfig
from spantrain.runtime.launcher import workers_file
from spantrain.runtime.reference import train_reference

pytestmark = pytest.mark.slow


def test_human_run_on_a_text_file_writes_metrics(tmp_path):
    cluster, model = write_inputs(tmp_path)
    text = tmp_path / "corpus.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    (tmp_path / "p.json").write_text(json.dumps(plan("gpipe", "allreduce", [(5, 2, [("a-0", 0, 3), ("a-1", 3, 6)])])))
    code, out, err = spantrain_here("run", "-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"),
                                    "--steps", "3", "--data", str(text), "--run-dir", str(tmp_path / "run"))
    assert code == 0, err
    assert out.startswith("trained iterations 0..3 of 3: loss ")
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "step" in x and "loss" in x]
    assert [x["step"] for x in steps] == [1, 2, 3]
    for rec in steps:
        assert rec["samples"] == BATCH and rec["samples_per_s"] == pytest.approx(BATCH / rec["step_s"])
        assert [r["device"] for r in rec["ranks"]] == ["a-0", "a-1"]
        assert all(r["compute_s"] > 0 and r["p2p_wait_s"] >= 0 and r["sync_s"] >= 0 for r in rec["ranks"])
    # the two stages exchanged activations and gradients, so some waiting was measured
    assert sum(r["p2p_wait_s"] for rec in steps for r in rec["ranks"]) > 0
    assert lines[0]["event"] == "start" and lines[-1]["event"] == "end"
    # torch's "Converting a tensor with requires_grad=True to a scalar", from reading the loss: on the
    # terminal under torchrun
    assert not any("UserWarning" in log.read_text() for log in (tmp_path / "run" / "logs").iterdir())


def test_ctrl_c_stops_together_checkpoints_and_leaves_no_process(tmp_path):
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    proc = _start_run(tmp_path, run_dir, ckpt)  # its own session: Ctrl-C in a terminal signals the whole group
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run_dir / "metrics.jsonl").exists():
            time.sleep(0.2)
        time.sleep(1.0)
        workers = json.loads(workers_file(run_dir).read_text())["workers"]
        # OpenMP threads wait passively: spinning ones slowed a worker 50x beside another job
        for w in workers:
            assert b"OMP_WAIT_POLICY=PASSIVE" in Path(f"/proc/{w['pid']}/environ").read_bytes().split(b"\0")
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    result = json.loads(out)
    assert result["stopped_early"] and result["checkpoint"].endswith(f"step-{result['final_step']:08d}")
    assert (ckpt / "latest").read_text().strip() == f"step-{result['final_step']:08d}"
    for w in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(w["pid"], 0)


@pytest.mark.parametrize("name", ["what?", "exp#2"])
def test_directories_with_url_characters_in_their_names(tmp_path, name):
    """The workers meet through a file in the run directory: '?' and '#' are part of its path."""
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 3), ("a-1", 3, 6)])])))
    (tmp_path / "exp").mkdir()  # an earlier experiment, where a URL parser would cut "exp#2/..." short
    code, out, err = spantrain_here("run", "-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"),
                                    "--steps", "2", "--run-dir", str(tmp_path / name / "run"), "--checkpoint-dir",
                                    str(tmp_path / name / "ckpt"), "--json")
    assert code == 0, err
    assert json.loads(out)["checkpoint"] == str(tmp_path / name / "ckpt" / "step-00000002")
    assert not any((tmp_path / "exp").iterdir())


def _processes() -> list[tuple[int, int, int, str]]:
    """(pid, parent pid, process group, command line) of every live process (zombies excluded)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            out.append((int(d), int(fields[1]), int(fields[2]), cmd))
    return out


def _start_run(tmp_path, run_dir, ckpt, *extra):
    """An endless local run of two workers in its own session (so its process group is its pid)."""
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 3), ("b-0", 3, 6)])])))
    # its temporary files here: a test that kills its whole process group leaves them behind
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "spantrain", "run", "-c", str(cluster), "-m", str(model),
                             "--plan", str(tmp_path / "p.json"), "--steps", "100000", "--run-dir", str(run_dir),
                             "--checkpoint-dir", str(ckpt), "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_stop_signals, env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})


def _workers_once_training(run_dir: Path) -> list[dict]:
    """The run's workers (pid, rank, device), once its metrics hold a loss (120 s at most)."""
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and '"loss"' not in (metrics.read_text() if metrics.exists() else ""):
        time.sleep(0.2)
    return json.loads(workers_file(run_dir).read_text())["workers"]


@pytest.mark.parametrize("sig, group", [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGHUP, True)],
                         ids=["kill-pid", "timeout", "terminal-closed"])
def test_sigterm_or_sighup_stops_like_ctrl_c(tmp_path, sig, group):
    """`kill PID`, `timeout` or a scheduler ending the job (SIGTERM, to the launcher or its whole
    process group), a closed terminal (SIGHUP): the workers still stop together and checkpoint."""
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    proc = _start_run(tmp_path, run_dir, ckpt)
    try:
        workers = _workers_once_training(run_dir)
        (os.killpg if group else os.kill)(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == f"spantrain run: interrupted by {sig.name}", err
    result = json.loads(out)
    assert result["stopped_early"] and result["checkpoint"].endswith(f"step-{result['final_step']:08d}")
    assert (ckpt / "latest").read_text().strip() == f"step-{result['final_step']:08d}"
    assert not any(pid in {w["pid"] for w in workers} for pid, *_ in _processes())


def test_a_stop_names_every_rank_it_reached_also_after_the_iterations_vote(tmp_path):
    # stopped_by named only the ranks whose stop signal came before they voted in the iteration's row
    # exchange: after a Ctrl-C, 2 of 4. Two replicas that never sync (local SGD, a long period) meet
    # only in that exchange: with rank 0 held, rank 1 waits there, its vote cast, when the launcher's
    # SIGTERM reaches it.
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan("gpipe", "local-sgd", [(5, 1, [("a-0", 0, 6)]),
                                                                            (5, 1, [("b-0", 0, 6)])], period=1000)))
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", "run", "-c", str(cluster), "-m", str(model),
                             "--plan", str(tmp_path / "p.json"), "--steps", "100000", "--run-dir", str(run_dir),
                             "--checkpoint-dir", str(ckpt), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_stop_signals)
    try:
        workers = _workers_once_training(run_dir)
        os.kill(workers[0]["pid"], signal.SIGSTOP)
        time.sleep(2.0)  # rank 1 finishes its iteration and waits for rank 0's row
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(1.0)  # the launcher has signalled both
        os.kill(workers[0]["pid"], signal.SIGCONT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    result = json.loads(out)
    assert result["stopped_by"] == [{"rank": 0, "device": "a-0", "signal": "SIGTERM"},
                                    {"rank": 1, "device": "b-0", "signal": "SIGTERM"}], result["stopped_by"]
    assert (ckpt / "latest").read_text().strip() == f"step-{result['final_step']:08d}"


@pytest.mark.parametrize("periodic", [True, False], ids=["checkpointed", "no-checkpoint-yet"])
def test_ctrl_c_twice_kills_the_workers_and_names_the_checkpoint_left(tmp_path, periodic):
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    proc = _start_run(tmp_path, run_dir, ckpt, *(["--checkpoint-every", "2"] if periodic else []))
    metrics = run_dir / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ((ckpt / "latest").exists() if periodic else
                                                   metrics.exists() and '"loss"' in metrics.read_text()):
            time.sleep(0.1)
        workers = json.loads(workers_file(run_dir).read_text())["workers"]
        os.kill(workers[1]["pid"], signal.SIGSTOP)  # cannot finish its iteration: only the second Ctrl-C ends it
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and out == "", err
    if periodic:
        latest = ckpt / (ckpt / "latest").read_text().strip()
        assert err.strip().splitlines()[-1] == ("spantrain run: interrupted before the workers finished; last "
                                                f"checkpoint: {latest} (continue with --resume)"), err
    else:  # it said "no checkpoint was written", not that the iterations trained were lost
        done = max(json.loads(x)["step"] for x in metrics.read_text().splitlines() if '"loss"' in x)
        assert err.strip().splitlines()[-1] == ("spantrain run: interrupted before the workers finished; no checkpoint "
                                                f"was written (the {done} iteration{'s' if done > 1 else ''} trained "
                                                f"{'are' if done > 1 else 'is'} lost)"), err
    assert not any(pid in {w["pid"] for w in workers} for pid, *_ in _processes())


def test_ctrl_c_while_the_workers_start_prints_no_traceback_and_leaves_no_process(tmp_path):
    """Ctrl-C reaches the fork server too, which spends its first seconds importing torch."""
    proc = _start_run(tmp_path, tmp_path / "run", tmp_path / "ckpt")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(ppid == proc.pid and "forkserver" in cmd
                                                      for _, ppid, _, cmd in _processes()):
            time.sleep(0.02)
        time.sleep(0.3)  # into its imports (not the interpreter's start, where SIGINT still ends it silently)
        os.killpg(proc.pid, signal.SIGINT)
        # the output ends when every process holding it has: the launcher, the fork server, any worker
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("spantrain run: interrupted"), err
    deadline = time.monotonic() + 10  # their output is closed; they may still be exiting
    while time.monotonic() < deadline and any(pgid == proc.pid for _, _, pgid, _ in _processes()):
        time.sleep(0.1)
    assert not [cmd for _, _, pgid, cmd in _processes() if pgid == proc.pid]
    # no worker the fork server forked for the interrupted launcher wrote to the run directory after it
    assert not (tmp_path / "run" / "rendezvous").exists()


def test_ctrl_c_while_the_workers_are_started_stops_at_once(tmp_path, monkeypatch):
    """Ctrl-C while the launcher was starting four workers: the two started waited at the
    rendezvous for the rest, armed to finish an iteration, and held the launcher for its 120 s
    grace (and a start cut off mid-request left a worker with no pid to stop)."""
    import multiprocessing.process

    cluster, model = write_inputs(tmp_path)
    four = plan("1f1b", "allreduce", [(5, 1, [("a-0", 0, 3), ("b-0", 3, 6)]), (5, 1, [("a-1", 0, 3), ("b-1", 3, 6)])])
    (tmp_path / "p.json").write_text(json.dumps(four))
    real_start = multiprocessing.process.BaseProcess.start

    def ctrl_c_at_the_third(self):
        if self.name == "spantrain-rank2":
            signal.raise_signal(signal.SIGINT)
        return real_start(self)

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", ctrl_c_at_the_third)
    t0 = time.monotonic()
    code, _, err = spantrain_here("run", "-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"),
                                  "--steps", "100000", "--run-dir", str(tmp_path / "run"), "--checkpoint-dir",
                                  str(tmp_path / "ckpt"), "--no-progress")
    took = time.monotonic() - t0
    assert code == 130 and "interrupted" in err and "Traceback" not in err, err
    assert took < 30, f"{took:.0f} s"
    workers = json.loads(workers_file(tmp_path / "run").read_text())["workers"] \
        if workers_file(tmp_path / "run").exists() else []
    assert not any(pid in {w["pid"] for w in workers} for pid, *_ in _processes())
    assert not (tmp_path / "run" / "rendezvous").exists()


def test_a_second_run_on_the_same_run_dir_is_refused_while_the_first_runs(tmp_path, monkeypatch):
    """Two runs writing one run directory would corrupt each other (rendezvous file, metrics,
    result), as would two writing one checkpoint directory: the second is refused in one line
    before it starts anything; the run directory is free again once its holder is gone,
    killed or failed."""
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    first = _start_run(tmp_path, run_dir, ckpt)  # endless, on a-0 and b-0
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not workers_file(run_dir).exists():
            time.sleep(0.1)
        started = workers_file(run_dir).read_text()
        (tmp_path / "one.json").write_text(json.dumps(plan("1f1b", "allreduce", [(10, 1, [("a-1", 0, 6)])])))
        second = ("run", "-c", str(tmp_path / "cluster.json"), "-m", str(tmp_path / "model.json"), "--plan",
                  str(tmp_path / "one.json"), "--steps", "1", "--run-dir", str(run_dir), "--json")
        code, out, err = spantrain_here(*second)
        assert code == 2 and out == "", err
        assert err.count("\n") == 1 and err.startswith(f"spantrain run: error: --run-dir {run_dir} is in use by "
                                                        f"another spantrain run (pid {first.pid})"), err
        assert first.poll() is None and workers_file(run_dir).read_text() == started  # the first runs on untouched
        # another run directory, but the first run's checkpoint directory: its checkpoints would mix in
        # (and no note on its threads above the refusal: it printed one)
        code, out, err = spantrain_here(*second[:-3], "--run-dir", str(tmp_path / "other"), "--checkpoint-dir",
                                        str(ckpt), "--json", "--threads", "256")
        assert code == 2 and out == "", err
        assert err.count("\n") == 1 and err.startswith(f"spantrain run: error: --checkpoint-dir {ckpt} is in use by "
                                                        f"another spantrain run (pid {first.pid})"), err
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # no clean exit: its lock must not outlive it
        first.wait()
    deadline = time.monotonic() + 10  # its workers notice their launcher is gone
    while time.monotonic() < deadline and any(pgid == first.pid for _, _, pgid, _ in _processes()):
        time.sleep(0.1)

    from spantrain.errors import ExecutionError
    from spantrain.runtime import launcher

    # the holder gone, the lock is free; the first run's records (if it finished an iteration before it
    # was killed) would refuse a new run there (tested in test_failures), so they go
    (run_dir / "metrics.jsonl").unlink(missing_ok=True)

    def fail(cfg, **kw):
        raise ExecutionError("worker rank 0 failed")

    with monkeypatch.context() as m:  # a run that fails gives the run directory back too
        m.setattr(launcher, "launch_local", fail)
        code, _, err = spantrain_here(*second)
    assert code == 2 and err == "spantrain run: error: worker rank 0 failed\n", err
    code, out, err = spantrain_here(*second)
    assert code == 0 and json.loads(out)["final_step"] == 1, err


def _check_exact(result, tmp_path):
    ref = train_reference(workload(), steps=3, batch=BATCH, seed=0, optim=OptimConfig(lr=LR, eps=EXACT_EPS))
    assert result["losses"] == pytest.approx(ref.losses, rel=1e-5)
    got = read_tensors(result["checkpoint"])
    assert max((got[k] - v).abs().max().item() for k, v in ref.params.items()) < 1e-6


def _exact_args(tmp_path, schedule):
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan(schedule, "allreduce", [(2, 5, [("a-0", 0, 3), ("a-1", 3, 6)])])))
    return ["-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"), "--steps", "3",
            "--lr", str(LR), "--adam-eps", str(EXACT_EPS), "--run-dir", str(tmp_path / "run"),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--json"]


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_rank_map_file_puts_the_first_stage_on_rank_one(tmp_path, schedule):
    """Stage order != rank order: torch's group ranks must follow the map, not the stage index."""
    (tmp_path / "ranks.json").write_text(json.dumps({"a-0": 1, "a-1": 0}))
    code, out, err = spantrain_here("run", *_exact_args(tmp_path, schedule), "--rank-map", str(tmp_path / "ranks.json"))
    assert code == 0, err
    result = json.loads(out)
    assert result["rank_map"] == f"mapping file {tmp_path / 'ranks.json'}"
    start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["devices"] == {"0": "a-1", "1": "a-0"}
    _check_exact(result, tmp_path)


@pytest.mark.skipif(shutil.which("torchrun") is None and not os.path.exists(
    os.path.join(os.path.dirname(sys.executable), "torchrun")), reason="torchrun not installed")
def test_torchrun_maps_devices_by_host_and_local_rank(tmp_path):
    """Two torchrun processes; the cluster's records put the first stage on local rank 1."""
    args = _exact_args(tmp_path, "zb-h1")
    cluster = tmp_path / "cluster.json"
    spec = json.loads(cluster.read_text())
    spec["devices"] = [{"id": "a-0", "region": "r1", "tflops": 1, "memory_gb": 8, "host": "box", "local_rank": 1},
                       {"id": "a-1", "region": "r1", "tflops": 1, "memory_gb": 8, "host": "box", "local_rank": 0},
                       {"id": "b", "count": 2, "region": "r2", "tflops": 1, "memory_gb": 8}]
    cluster.write_text(json.dumps(spec))
    torchrun = shutil.which("torchrun") or os.path.join(os.path.dirname(sys.executable), "torchrun")
    # torchrun keeps its per-run log directory (torchelastic_*): in tmp_path, not /tmp
    proc = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "torchrun"),
                           "-m", "spantrain", "run", *args],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "SPANTRAIN_HOST": "box"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["rank_map"] == "host/local_rank records"
    start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["devices"] == {"0": "a-1", "1": "a-0"}
    _check_exact(result, tmp_path)


def test_resuming_on_another_plan_than_the_checkpoint_continued_on_says_so(tmp_path):
    # after --adapt switched plans, the command's own --plan is the abandoned one: a resume went
    # back to a 17x slower plan without a word
    from spantrain.cli.run import _other_plan_note
    from spantrain.plan import Plan

    running, other = Plan.from_dict(plan("1f1b", "allreduce", ASYMMETRIC)), Plan.from_dict(plan("gpipe", "allreduce",
                                                                                               ASYMMETRIC))
    checkpoint = tmp_path / "step-00000004"
    checkpoint.mkdir()
    assert _other_plan_note(checkpoint, other) is None  # nothing to compare with
    # a checkpoint from before the plan file: its train state's plan, with no file to name
    assert _other_plan_note(checkpoint, other, running.to_dict()) == (
        "resuming on another plan than the run of checkpoint step-00000004 continued on: its plan is in its "
        "train_state.json")
    running.save(checkpoint / "plan.json")
    assert _other_plan_note(checkpoint, running) is None
    assert _other_plan_note(checkpoint, other, other.to_dict()) == (  # the file wins: an --adapt switch writes it
        "resuming on another plan than the run of checkpoint step-00000004 continued on: pass --plan "
        f"{checkpoint / 'plan.json'} to continue on that one")
    # a plan the cluster cannot run any more is not offered for --plan (which then failed: unknown device)
    from spantrain.cluster import Cluster

    smaller = Cluster.from_spec({**CLUSTER, "devices": [{**d, "count": 1} for d in CLUSTER["devices"]]})
    assert _other_plan_note(checkpoint, other, None, smaller) == (
        "resuming on another plan than the run of checkpoint step-00000004 continued on: that plan needs device(s) "
        "--cluster no longer has (a-1, b-1)")
    (checkpoint / "plan.json").write_text("{")  # damaged: no note, no error
    assert _other_plan_note(checkpoint, other) is None


def test_an_adapt_resume_whose_own_plan_lost_a_device_continues_on_the_checkpoints(tmp_path, capsys):
    # a device left, --adapt switched to a plan without it; the same command resumed was refused
    # ("plan plan.json: ... unknown device 'b-1'") before it looked at the checkpoint's plan
    from spantrain.cli.run import _plan_adapted_to
    from spantrain.cluster import Cluster
    from spantrain.errors import PlanError
    from spantrain.plan import Plan
    from spantrain.workload import load_workload

    _, model = write_inputs(tmp_path)
    cluster, workload = Cluster.from_spec(CLUSTER), load_workload(str(model))
    switched = Plan.from_dict(plan("1f1b", "allreduce", [(1, 10, [("a-1", 0, 6)])]))
    checkpoint = tmp_path / "ckpt" / "step-00000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "train_state.json").write_text('{"step": 4}')
    switched.save(checkpoint / "plan.json")

    def lost_a_device():
        raise PlanError("plan plan.json: pipeline 0 stage 1: unknown device 'b-1'")

    assert _plan_adapted_to(tmp_path / "ckpt", lost_a_device, cluster, workload, "--plan") == switched
    assert capsys.readouterr().err.strip() == (
        f"spantrain run: note: --adapt: resuming on the plan checkpoint step-00000004 was trained on "
        f"({checkpoint / 'plan.json'}): --plan's cannot run here (plan plan.json: pipeline 0 stage 1: unknown "
        "device 'b-1')")
    # no checkpoint plan to fall back on: the command's own error stands
    (checkpoint / "plan.json").unlink()
    with pytest.raises(PlanError, match="unknown device 'b-1'"):
        _plan_adapted_to(tmp_path / "ckpt", lost_a_device, cluster, workload, "--plan")


def test_an_adapt_resume_with_another_global_batch_is_refused_as_without_adapt(tmp_path):
    # --adapt --resume --global-batch 20 trained the checkpoint's 10-sample plan with a note, and every
    # re-plan of the run then failed ("the running plan's batch is 10 samples but ... 20")
    from runtime_helpers import spantrain_here

    from spantrain.plan import Plan

    cluster, model = write_inputs(tmp_path)
    ten = plan("1f1b", "allreduce", [(1, 10, [("a-1", 0, 6)])])
    (tmp_path / "plan.json").write_text(json.dumps(ten))
    checkpoint = tmp_path / "ckpt" / "step-00000004"
    checkpoint.mkdir(parents=True)
    (checkpoint / "train_state.json").write_text('{"step": 4}')
    Plan.from_dict(ten).save(checkpoint / "plan.json")
    code, out, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan",
                                    str(tmp_path / "plan.json"), "--steps", "8", "--checkpoint-dir",
                                    str(tmp_path / "ckpt"), "--adapt", "--resume", "--global-batch", "20",
                                    "--run-dir", str(tmp_path / "run"))
    assert code == 2 and out == "", err
    assert err.strip().splitlines() == [f"spantrain run: error: --global-batch 20 but plan {tmp_path / 'plan.json'} "
                                        "trains 10 samples per iteration (pass --global-batch 10, or leave it out)"]


def test_a_resume_continues_in_its_run_directory_and_names_a_change_of_precision(tmp_path, monkeypatch):
    """Without --run-dir a resume made a new run directory: the run's metrics and W&B run split in two."""
    monkeypatch.chdir(tmp_path)  # where a run without --run-dir makes its directory
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 3), ("b-0", 3, 6)])])))
    args = ["run", "-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"),
            "--checkpoint-dir", str(tmp_path / "ckpt")]
    code, _, err = spantrain_here(*args, "--steps", "2", "--run-dir", str(tmp_path / "first"), "--precision", "bf16")
    assert code == 0, err
    code, _, err = spantrain_here(*args, "--steps", "3", "--resume")
    assert code == 0, err
    assert f"note: continuing in the run directory of the checkpoint's run, {tmp_path / 'first'}" in err
    assert "note: resuming in fp32, where the checkpoint's run trained in bf16 (pass --precision bf16 to continue " \
           "as it was)" in err
    events = [json.loads(x) for x in (tmp_path / "first" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events if e.get("event") == "start"] == [0, 2]
    assert [e["step"] for e in events if "loss" in e] == [1, 2, 3]

    # a directory of another job, made where the checkpoint's run was, is not taken over
    import shutil

    shutil.rmtree(tmp_path / "first")
    code, _, err = spantrain_here(*args[:-2], "--checkpoint-dir", str(tmp_path / "other-ckpt"), "--steps", "1",
                                  "--run-dir", str(tmp_path / "first"))
    assert code == 0, err
    code, _, err = spantrain_here(*args, "--steps", "4", "--resume")
    assert code == 0, err
    assert "continuing in the run directory" not in err and len(list((tmp_path / "runs").iterdir())) == 1
    assert (tmp_path / "first" / "metrics.jsonl").read_text().count('"loss"') == 1
    # nor when named: --resume --run-dir into it appended this run's records to that job's (its W&B
    # run too) and replaced its job id, so that job's own --resume lost its directory
    before = (tmp_path / "first" / "metrics.jsonl").read_text()
    code, _, err = spantrain_here(*args, "--steps", "5", "--resume", "--run-dir", str(tmp_path / "first"))
    (ours,) = (tmp_path / "runs").iterdir()
    assert code == 2 and err.strip().splitlines()[-1].startswith(
        f"spantrain run: error: --run-dir {tmp_path / 'first'} holds another run's records (job "), err
    assert err.strip().endswith(f"leave --run-dir out to continue in the checkpoint's own, {ours}"), err
    assert (tmp_path / "first" / "metrics.jsonl").read_text() == before


def test_a_copied_project_resumes_in_the_copy_with_its_own_metrics_file(tmp_path):
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 3), ("b-0", 3, 6)])])))
    project = tmp_path / "project"
    project.mkdir()
    code, _, err = spantrain_here("run", "-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"),
                                  "--steps", "2", "--checkpoint-dir", str(project / "ckpt"), "--run-dir",
                                  str(project / "run"), "--metrics", str(project / "m.jsonl"))
    assert code == 0, err
    import shutil

    shutil.copytree(project, tmp_path / "copy")
    code, _, err = spantrain_here("run", "-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"),
                                  "--steps", "3", "--checkpoint-dir", str(tmp_path / "copy" / "ckpt"), "--resume")
    assert code == 0, err
    assert f"continuing in the run directory of the checkpoint's run, {tmp_path / 'copy' / 'run'}" in err
    assert (tmp_path / "copy" / "m.jsonl").read_text().count('"loss"') == 3  # --metrics's file went on
    assert (project / "m.jsonl").read_text().count('"loss"') == 2  # the original is left alone


def test_resuming_on_other_data_says_so():
    from spantrain.cli.run import other_data_note

    assert other_data_note("/d/a.txt", "/d/a.txt") is None and other_data_note(None, None) is None
    assert other_data_note("/d/a.txt", "/d/b.txt") == ("resuming on /d/b.txt, where the checkpoint's run trained "
                                                        "on /d/a.txt: the sample sequence changes")
    assert other_data_note("/d/a.txt", None) == ("resuming on the built-in synthetic corpus, where the checkpoint's "
                                                 "run trained on /d/a.txt: the sample sequence changes")


def test_resuming_with_other_adamw_settings_says_so():
    """The checkpoint keeps the seed and notes other data; a learning rate changed by leaving --lr out
    (its default, not the checkpoint's) went without a word."""
    from spantrain.cli.run import other_optim_note

    before = {"lr": 3e-4, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8}
    assert other_optim_note(before, {"lr": 3e-4, "weight_decay": 0.1, "eps": 1e-8}) is None
    assert other_optim_note(None, {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-8}) is None  # nothing recorded
    assert other_optim_note(before, {"lr": 1e-3, "weight_decay": 0.0, "eps": 1e-8}) == (
        "resuming with --lr 0.001 (the checkpoint's run: 0.0003), --weight-decay 0 (the checkpoint's run: 0.1); "
        "AdamW settings left out take their defaults, not the checkpoint's")


@pytest.mark.parametrize(("losses", "note", "in_fp16"), [
    ([5.0, float("nan"), float("nan")], "the loss became nan at iteration 12 and stayed so: training diverged; "
                                        "lower --lr (this run: 10)", True),
    ([5.0, float("inf"), 4.0], None, False),  # an fp16 overflow's loss, skipped; training went on
    ([5.0, 4.0], None, False),
    # the last one alone: diverged in fp32; in fp16 an overflowing forward, skipped, the scale halved
    ([5.0, 4.0, float("inf")], "the loss became inf at iteration 13", False),
    # finite but far above the start (a d_model of 1024 at the default --lr: 5.39, 5.39, 9.25), said by no note
    ([5.39, 5.39, 9.25], "the loss rose from 5.39 to 9.25 over the run: the learning rate may be too high for this "
                         "model; lower --lr (this run: 10)", True),
    ([5.0, 6.0], None, False),  # noise of a short run
])
def test_a_diverged_run_says_so(capsys, losses, note, in_fp16):
    from spantrain.cli.run import _report

    result = {"start_step": 10, "final_step": 10 + len(losses), "target_steps": 20, "stopped_early": False,
              "loss_first": losses[0], "loss_last": losses[-1], "samples_per_s": 10.0, "step_s": 1.0,
              "metrics": "m.jsonl", "losses": losses}
    _report(result, as_json=True, lr=10.0)
    err = capsys.readouterr().err
    assert err.startswith(f"spantrain run: note: {note}") if note else err == "", err
    _report({**result, "precision": "fp16"}, as_json=True, lr=10.0)
    assert (capsys.readouterr().err != "") == in_fp16


def test_the_closing_line_names_every_offline_part_of_a_resumed_jobs_wandb_run(tmp_path, capsys):
    # a resumed or --adapt job logs each launch to a directory of its own under one run id; the
    # closing line named the last launch's alone, whose `wandb sync` uploaded that part only (under
    # --adapt not even the one holding the decisions table)
    from spantrain.cli.run import _report

    runs = tmp_path / "r" / "wandb" / "wandb"
    parts = [runs / f"offline-run-2026112{k}_000000-abcd1234" for k in range(3)]
    for p in parts:
        p.mkdir(parents=True)
    (runs / "offline-run-20261124_000000-other123").mkdir()  # another run's: not a part
    result = {"start_step": 4, "final_step": 8, "target_steps": 8, "stopped_early": False, "loss_first": 5.0,
              "loss_last": 4.0, "samples_per_s": 10.0, "step_s": 1.0, "metrics": "m.jsonl", "losses": [5.0, 4.0],
              "wandb": str(parts[1])}
    _report(result, as_json=False)
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("W&B run: ")]
    assert line == (f"W&B run: {parts[1]} (one of 3 offline parts of run abcd1234, one per launch: "
                    f"`wandb sync {runs}/offline-run-*-abcd1234` uploads them all)")
    for p in parts[1:]:
        p.rmdir()
    _report(result | {"wandb": str(parts[0])}, as_json=False)
    # a run of one launch: its directory, and the command that uploads it
    assert f"W&B run: {parts[0]} (offline: `wandb sync {parts[0]}` uploads it)\n" in capsys.readouterr().out
    _report(result | {"wandb": "https://wandb.ai/me/spantrain/runs/abcd1234"}, as_json=False)
    assert "W&B run: https://wandb.ai/me/spantrain/runs/abcd1234\n" in capsys.readouterr().out  # online: its page
    _report(result | {"wandb": str(parts[0])}, as_json=True)  # on stderr: stdout holds the JSON alone
    out, err = capsys.readouterr()
    assert json.loads(out)["wandb"] == str(parts[0])
    assert err == f"W&B run: {parts[0]} (offline: `wandb sync {parts[0]}` uploads it)\n"


def test_a_tracked_run_names_its_wandb_run_and_records_cluster_and_stop(tmp_path, monkeypatch, wandb_records):
    from runtime_helpers import ASYMMETRIC, CLUSTER, MODEL, plan, run_plan, wandb_items

    from spantrain.cluster import Cluster
    from spantrain.env.calibration import Calibration
    from spantrain.env.costmodel import estimate
    from spantrain.plan import Plan
    from spantrain.workload import Workload

    monkeypatch.setenv("WANDB_MODE", "offline")
    calibration = tmp_path / "cal.yaml"
    calibration.write_text("op_overhead_s: 0.125\n")
    the_plan = plan("1f1b", "allreduce", ASYMMETRIC)
    res = run_plan(tmp_path, "tracked", the_plan, 2, "--track", "--calibration", str(calibration))
    where = Path(res["wandb"])  # what `wandb sync` takes; it was nowhere in the output
    assert where.is_dir() and where.name.startswith("offline-run-") and tmp_path / "tracked" in where.parents
    # the cluster in the config; the summary; the prediction on the chart beside the measured step_s
    records = wandb_records(where, b"rt-test", b"stopped_early", b"predicted_step_s")
    assert b"rt-test" in records and b"stopped_early" in records and b"predicted_step_s" in records
    expected = estimate(Cluster.from_spec(CLUSTER, "c"), Workload.from_spec(MODEL, "m"), Plan.from_dict(the_plan),
                        Calibration.from_file(calibration)).iteration_s
    assert res["predicted_step_s"] == pytest.approx(expected) and expected > 0.125 * 8
    # the workers share this machine's cores: a figure to keep, not to compare
    assert res["prediction_calibration"] == "cal.yaml" and res["prediction_comparable"] is False
    # what made the plan, and what it runs, to group runs by in W&B
    records = wandb_records(where, b"tracked.plan.json", b"schedule", b"rt-small on rt-test: tracked")
    assert b"file:" in records and b"tracked.plan.json" in records and b"1f1b" in records
    assert b"rt-small on rt-test: tracked" in records  # the run's name: model, cluster, run directory

    # resumed: the same W&B run continues (it was a new run, unlinked to the first); offline, in a
    # second directory under the same id, which `wandb sync` of both uploads as one
    resumed = run_plan(tmp_path, "tracked", the_plan, 3, "--track", "--resume")
    again = Path(resumed["wandb"])
    assert again != where and again.name.split("-")[-1] == where.name.split("-")[-1]
    assert (tmp_path / "tracked" / "wandb" / f"last-step-{where.name.split('-')[-1]}").read_text() == "3"
    # and its summary counts the whole run, as its chart shows it: it held the resumed launch's
    # one iteration (steps 1, its own first loss)
    records = wandb_records(again, b"loss_first", b"stopped_early")
    assert wandb_items(records, "loss_first") == [json.dumps(res["losses"][0])] != [json.dumps(resumed["losses"][0])]
    assert wandb_items(records, "loss_last") == [json.dumps(resumed["losses"][-1])]
    assert wandb_items(records, "start_step") == ["2", "0"]  # the launch's (config), the run's (summary)



def test_a_bad_calibration_file_is_named_by_its_flag_before_any_worker_starts(tmp_path):
    from runtime_helpers import ASYMMETRIC

    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    (tmp_path / "cal.yaml").write_text("op_overhead: 1\n")
    code, out, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan",
                                    str(tmp_path / "p.json"), "--steps", "1", "--run-dir", str(tmp_path / "r"),
                                    "--calibration", str(tmp_path / "cal.yaml"))
    assert code == 2 and out == "" and not (tmp_path / "r").exists()
    assert err.startswith(f"spantrain run: error: --calibration {tmp_path / 'cal.yaml'}: unknown constant "
                          "'op_overhead'") and len(err.strip().splitlines()) == 1, err


def test_an_unknown_wandb_mode_is_refused_before_any_worker_starts(tmp_path, monkeypatch):
    from runtime_helpers import ASYMMETRIC, plan, spantrain_here, write_inputs

    monkeypatch.setenv("WANDB_MODE", "bogus")
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    code, _, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan",
                                  str(tmp_path / "plan.json"), "--steps", "1", "--track", "--run-dir",
                                  str(tmp_path / "run"))
    assert code == 2 and "WANDB_MODE=bogus" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_an_online_run_without_a_login_says_so_on_the_terminal_and_leaves_no_rendezvous(tmp_path):
    # the note went only to rank 0's log, and the workers' rendezvous file stayed in the run directory
    from runtime_helpers import ASYMMETRIC, plan, spantrain, write_inputs

    cluster, model = write_inputs(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    proc = spantrain("run", "--cluster", str(cluster), "--model", str(model), "--plan", str(tmp_path / "plan.json"),
                     "--steps", "1", "--track", "--run-dir", str(tmp_path / "run"), "--no-progress",
                     env={"WANDB_MODE": "online", "HOME": str(tmp_path / "home"), "WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stderr
    assert "spantrain run: note: W&B cannot log online (" in proc.stderr and "wandb sync " in proc.stderr
    assert not (tmp_path / "run" / "rendezvous").exists()


@pytest.mark.slow
@pytest.mark.parametrize("emulate", [False, True], ids=["local", "emulated"])
def test_a_tracked_run_leaves_no_wandb_directories_in_tmpdir(tmp_path, emulate):
    # its workers end with os._exit, which skips the exit handler that removes wandb's import-time directories
    from runtime_helpers import ASYMMETRIC, plan, spantrain, write_inputs

    cluster, model = write_inputs(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    (tmp_path / "tmp").mkdir()
    proc = spantrain("run", "--cluster", str(cluster), "--model", str(model), "--plan", str(tmp_path / "plan.json"),
                     "--steps", "1", "--track", "--run-dir", str(tmp_path / "run"), "--no-progress",
                     *(["--emulate", "--emulate-mode", "local"] if emulate else []),
                     env={"TMPDIR": str(tmp_path / "tmp"), "WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "tmp").rglob("*wandb*")] == []


def test_run_plans_with_its_calibration(tmp_path):
    from spantrain.cluster import Cluster
    from spantrain.env.calibration import Calibration
    from spantrain.policies.heuristic import HeuristicPlanner

    cluster, model = write_inputs(tmp_path)
    (tmp_path / "cal.yaml").write_text("op_overhead_s: 0.05\n")  # every op costs: few micro-batches pay
    code, out, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--planner", "heuristic",
                                    "--steps", "1", "--run-dir", str(tmp_path / "r"), "--calibration",
                                    str(tmp_path / "cal.yaml"), "--json")
    assert code == 0, err
    res = json.loads(out)
    spec = Cluster.from_file(cluster)
    expected = HeuristicPlanner().plan(spec, workload(), Calibration(op_overhead_s=0.05))
    assert res["plan"]["pipelines"] == expected.to_dict()["pipelines"]
    assert res["plan"] != HeuristicPlanner().plan(spec, workload()).to_dict()  # the built-in constants' differs
    assert res["predicted_step_s"] == pytest.approx(expected.predicted["iteration_s"])


def test_a_wandb_setting_wandb_refuses_stops_a_tracked_run_before_any_worker(tmp_path, monkeypatch):
    # was exit 1, "worker rank 0 ... stopped responding ... ValidationError", once every worker had started
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 6)])])))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "maybe")
    code, out, err = spantrain_here("run", "-c", str(cluster), "-m", str(model), "--plan", str(tmp_path / "p.json"),
                                    "--steps", "2", "--run-dir", str(tmp_path / "run"), "--track")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["spantrain run: error: WANDB_SILENT=maybe is refused by W&B (Input should "
                                        "be a valid boolean, unable to interpret input): fix it or unset it"], err
    assert not (tmp_path / "run").exists()


def test_a_model_of_a_tiny_vocabulary_is_refused_with_the_fix(tmp_path):
    # planned, then "byte-level data needs a vocabulary of at least 256, it has 33" and no fix
    cluster, model = write_inputs(tmp_path)
    spec = json.loads(model.read_text())
    spec["architecture"]["vocab_size"] = 33
    small = tmp_path / "small-vocab.json"
    small.write_text(json.dumps(spec))
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 3), ("b-0", 3, 6)])])))
    code, _, err = spantrain_here("run", "-c", str(cluster), "-m", str(small), "--plan", str(tmp_path / "p.json"),
                                  "--steps", "1", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and err.count("\n") == 1, err
    assert err.rstrip().endswith("it has 33: set the architecture's vocab_size to 256 or more to run it (the runtime "
                                 "trains on bytes; planning takes any size)"), err


def test_run_plans_and_adapts_with_a_user_trained_policy(tmp_path, monkeypatch):
    # run had no --policy: a policy the user trained could drive a run only through plan -o, and
    # --adapt's re-plans always used the shipped one
    from spantrain.cli.run import _replanner
    from spantrain.cluster import Cluster
    from spantrain.plan import Plan
    from spantrain.policies import ppo

    mine = tmp_path / "my-policy.pt"
    shutil.copy(ppo.SHIPPED_POLICY, mine)  # a policy file of the user's, as train-policy writes them
    loaded = []
    real = ppo.load_policy
    monkeypatch.setattr(ppo, "load_policy", lambda path=None, **kw: loaded.append(path) or real(path, **kw))
    cluster, model = write_inputs(tmp_path)
    base = ["run", "--cluster", str(cluster), "--model", str(model), "--steps", "1", "--json"]
    code, out, err = spantrain_here(*base, "--planner", "ppo", "--policy", str(mine), "--run-dir", str(tmp_path / "r"))
    assert code == 0, err
    assert str(mine) in map(str, loaded) and None not in loaded  # planned with the user's policy alone
    assert json.loads(out)["plan"]["pipelines"]
    # --adapt's re-planner takes it too
    loaded.clear()
    spec, w = Cluster.from_file(cluster), workload()
    running = Plan.from_dict(json.loads(out)["plan"])
    _replanner("auto", spec, w, running, options={"policy": str(mine)})(running, spec, 10)
    assert loaded and all(str(p) == str(mine) for p in loaded), loaded
    # and what cannot use it is one line before any work
    (tmp_path / "p.json").write_text(json.dumps(running.to_dict()))
    for extra, needle in ((["--plan", str(tmp_path / "p.json")], "--policy is for the policy's planners"),
                          (["--planner", "heuristic"], "--policy is for the policy's planners"),
                          (["--planner", "auto"], "missing.pt")):
        policy = str(tmp_path / "missing.pt") if needle == "missing.pt" else str(mine)
        code, out, err = spantrain_here(*base, *extra, "--policy", policy, "--run-dir", str(tmp_path / "bad"))
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and needle in err, err
        assert not (tmp_path / "bad").exists()


def test_a_sequence_longer_than_the_data_is_refused_before_any_worker_starts(tmp_path):
    # a worker found it after start-up ("the data has 262144 bytes; one sample needs 300001", no fix)
    cluster, model = write_inputs(tmp_path)
    spec = json.loads(model.read_text())
    spec["seq_len"] = spec["architecture"]["max_seq_len"] = 300_000
    long = tmp_path / "long.json"
    long.write_text(json.dumps(spec))
    (tmp_path / "p.json").write_text(json.dumps(plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 6)])])))
    code, _, err = spantrain_here("run", "-c", str(cluster), "-m", str(long), "--plan", str(tmp_path / "p.json"),
                                  "--steps", "1", "--run-dir", str(tmp_path / "run"))
    assert code == 2 and err.strip() == ("spantrain run: error: model 'rt-small': one sample of seq_len 300000 needs "
                                         "300001 bytes and the built-in corpus has 262144: pass a longer text file "
                                         "with --data, or lower seq_len"), err
    assert not (tmp_path / "run" / "logs").exists()  # no worker started
