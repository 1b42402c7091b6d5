"""What `spantrain run` checks under torchrun before and as its processes meet: the world size,
one job for every rank, a restarted attempt resuming, Ctrl-C stopping like SIGTERM."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from runtime_helpers import ASYMMETRIC, plan, run_plan, spantrain_here, write_inputs

from spantrain.errors import ExecutionError
from spantrain.runtime.config import OptimConfig, RunConfig
from spantrain.runtime.worker import check_same_job, job_fingerprint


@pytest.fixture
def torchrun_env(monkeypatch):
    """This process as torchrun's rank 0 of `world` (set with the returned function)."""

    def world(n: int, restart: int = 0) -> None:
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "TORCHELASTIC_RUN_ID": "t",
                           "TORCHELASTIC_RESTART_COUNT": str(restart)}.items():
            monkeypatch.setenv(key, value)

    return world


def _args(tmp_path, *extra: str) -> list[str]:
    cluster, model = write_inputs(tmp_path)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))  # 4 devices
    return ["run", "--cluster", str(cluster), "--model", str(model), "--plan", str(plan_file), "--steps", "4",
            "--run-dir", str(tmp_path / "run"), *extra]


def test_a_wrong_process_count_is_refused_before_the_processes_meet(tmp_path, torchrun_env):
    torchrun_env(3)
    code, _, err = spantrain_here(*_args(tmp_path))
    # it was found after rendezvous and process-group set-up, leaving an empty logs directory
    assert code == 2 and "the plan uses 4 device(s) but 3 process(es) started" in err, err
    assert not (tmp_path / "run").exists()


def test_a_restarted_attempt_resumes_from_the_last_checkpoint_its_job_wrote(tmp_path, torchrun_env, monkeypatch):
    from spantrain.cli import run as run_cli

    # checkpoints of iteration 2 (here from a local run of the same plan)
    res = run_plan(tmp_path, "first", plan("1f1b", "allreduce", ASYMMETRIC), 2, "--seed", "7")
    seen = {}

    def capture(cfg):
        seen["resume"], seen["seed"] = cfg.resume, cfg.seed
        return None  # as a rank other than 0 returns

    monkeypatch.setattr(run_cli, "_run_torchrun", capture)
    args = _args(tmp_path, "--checkpoint-dir", str(tmp_path / "first.ckpt"))
    torchrun_env(4, restart=0)
    code, _, err = spantrain_here(*args)  # the first attempt's command: another run's checkpoints are refused
    assert code == 2 and "already holds the checkpoints of a run" in err
    torchrun_env(4, restart=1)  # torchrun --max-restarts started it again after that failure: still refused
    code, _, err = spantrain_here(*args)  # (it resumed from the other run's checkpoints)
    assert code == 2 and "already holds the checkpoints of a run" in err and not seen
    # checkpoints this job wrote (its rendezvous id in their train state): the restart continues them
    state = tmp_path / "first.ckpt" / "step-00000002" / "train_state.json"
    assert res["checkpoint"] == str(state.parent)
    state.write_text(json.dumps({**json.loads(state.read_text()), "job": "t"}))
    code, _, err = spantrain_here(*args)
    assert code == 0 and seen["resume"] is True, err
    assert "torchrun restart 1: resuming from" in err
    assert seen["seed"] == 7  # resumed as --resume does: the checkpoint's seed keeps the sample order
    # a job that failed after its last checkpoint (tearing down, say) has nothing left to train
    seen.clear()
    code, _, err = spantrain_here(*[a if a != "4" else "2" for a in args])  # --steps 2
    assert code == 0 and not seen and "the job already trained its 2 iterations" in err, err


def test_a_restartable_job_on_a_shared_rendezvous_store_is_told_how_to_restart_safely(tmp_path, torchrun_env,
                                                                                      monkeypatch):
    from spantrain.cli import run as run_cli

    monkeypatch.setattr(run_cli, "_run_torchrun", lambda cfg: None)
    args = _args(tmp_path)
    torchrun_env(4)
    hint = "start torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    for restarts, shared, told in (("3", "True", True), ("0", "True", False), ("3", "False", False)):
        # torchrun --max-restarts 3 (c10d rendezvous): workers get the agent's store unless the variable is set
        monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", restarts)
        monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", shared)
        code, _, err = spantrain_here(*args)
        assert code == 0 and (hint in err) is told, (restarts, shared, err)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "3")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("RANK", "1")  # said once per job, by rank 0
    code, _, err = spantrain_here(*args)
    assert code == 0 and hint not in err, err


def test_every_rank_must_run_the_same_job():
    cfg = RunConfig(cluster_spec={}, model="/node1/models/tiny.json", global_batch=None,
                    plan=plan("1f1b", "allreduce", ASYMMETRIC), steps=10, seed=0, optim=OptimConfig(),
                    run_dir="r", metrics_path="r/m.jsonl")
    same = job_fingerprint(dataclasses.replace(cfg, model="/node2/models/tiny.json", run_dir="elsewhere"))
    assert job_fingerprint(cfg) == same  # where the files are does not matter
    stale = job_fingerprint(dataclasses.replace(cfg, plan=plan("gpipe", "allreduce", ASYMMETRIC)))
    # another node's planning may round the predicted figures apart: the plan as it runs counts
    assert job_fingerprint(dataclasses.replace(cfg, plan={**cfg.plan, "predicted": {"iteration_s": 0.1}})) == same
    check_same_job([job_fingerprint(cfg), same])
    with pytest.raises(ExecutionError, match=r"rank\(s\) 2 run another plan, model or settings .* than rank 0: give "
                                             "every process the same command, plan file and checkpoint directory"):
        check_same_job([job_fingerprint(cfg), same, stale])
    assert job_fingerprint(dataclasses.replace(cfg, steps=11)) != job_fingerprint(cfg)


def test_ctrl_c_under_torchrun_stops_after_the_iteration_as_sigterm_does(monkeypatch, tmp_path):
    from spantrain.cli import run as run_cli
    from spantrain.runtime import worker

    handlers = {}

    def fake_worker(cfg, *, stop, **kwargs):
        handlers.update({sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)})
        return None

    monkeypatch.setattr(worker, "run_worker", fake_worker)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert run_cli._run_torchrun(SimpleCfg(tmp_path)) is None
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    # both set the stop flag: it had lost the training (no checkpoint, no result) on Ctrl-C
    flag = handlers[signal.SIGINT]
    assert isinstance(flag, worker.StopFlag) and flag is handlers[signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt):  # before training starts there is no iteration to finish
        flag(signal.SIGINT, None)
    flag.armed = True  # as the worker does when its first iteration starts
    flag(signal.SIGINT, None)
    assert flag.requested


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_rank_waiting_for_the_others_stops_at_once(tmp_path, sig):
    # rank 0 of 4 waits in torch's process-group set-up for ranks that never come: Python runs
    # no signal handler there, and Ctrl-C (or torchrun's SIGTERM after another rank failed its
    # checks) went unheard until torchrun killed the process 30 s later
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WANDB_MODE": "offline"}
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *_args(tmp_path)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        log = tmp_path / "run" / "logs" / "rank0.log"
        deadline = time.monotonic() + 60
        while not log.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # into the set-up's wait
        assert proc.poll() is None, proc.communicate()
        sent = time.monotonic()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + sig, err
    assert err.strip().endswith(f"stopped by {signal.Signals(sig).name} before training started "
                                "(waiting for the other ranks; nothing to save)"), err
    assert took < 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SimpleCfg:
    def __init__(self, tmp_path):
        self.run_dir = str(tmp_path / "run")


def test_a_rank_that_lost_its_peer_says_so_with_the_checkpoint_to_resume_from(monkeypatch, tmp_path):
    import logging
    from types import SimpleNamespace

    from spantrain.cli import run as run_cli
    from spantrain.runtime import worker

    res = run_plan(tmp_path, "first", plan("1f1b", "allreduce", ASYMMETRIC), 2)  # metrics and a checkpoint

    def peer_died(cfg, **kwargs):
        logging.getLogger("torch.distributed.pipelining.schedules").error("schedule dump\n" * 170)
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                           "[127.0.0.1]:40557\nmore lines")

    monkeypatch.setattr(worker, "run_worker", peer_died)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = SimpleNamespace(run_dir=str(tmp_path / "first"), metrics_path=res["metrics"],
                          checkpoint_dir=str(tmp_path / "first.ckpt"))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    logger = logging.getLogger("torch.distributed.pipelining")
    import io

    terminal = io.StringIO()
    logger.addHandler(logging.StreamHandler(terminal))  # as torch._logging gives it one on stderr
    try:
        with pytest.raises(ExecutionError) as e:
            run_cli._run_torchrun(cfg)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        for h in list(logger.handlers):
            logger.removeHandler(h)
        logger.propagate = True
    log = tmp_path / "first" / "logs" / "rank1.log"
    # was "rank 1: RuntimeError: [../third_party/gloo/...] Connection closed by peer ..." and 170 lines of schedule
    assert str(e.value).startswith("rank 1: lost contact with another rank (") and "one died or hung" in str(e.value)
    assert e.value.exit_code == 1  # the run failed on its own: not bad input (2)
    assert f"after iteration 2; last checkpoint: {res['checkpoint']} (continue with --resume)" in str(e.value)
    assert log.read_text().count("schedule dump") == 170 and "Traceback" in log.read_text()
    assert terminal.getvalue() == ""  # 166 lines of it reached the terminal through torch's own handler


def test_a_new_torchrun_job_does_not_append_to_another_runs_metrics(tmp_path, torchrun_env, monkeypatch):
    from spantrain.cli import run as run_cli

    monkeypatch.setattr(run_cli, "_run_torchrun", lambda cfg: None)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')  # another job's
    torchrun_env(4)
    code, _, err = spantrain_here(*_args(tmp_path))
    # it appended to it (two start events in one file) and overwrote its result.json
    assert code == 2 and f"--run-dir {tmp_path / 'run'} holds the metrics of a run that left no checkpoint" in err, err
    torchrun_env(4, restart=1)  # a restarted attempt: still refused, the file is not its job's
    assert spantrain_here(*_args(tmp_path))[0] == 2
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:  # this job's first attempt started it
        f.write(json.dumps({"event": "start", "step": 0, "job": "t"}) + "\n")
    assert spantrain_here(*_args(tmp_path))[0] == 0
