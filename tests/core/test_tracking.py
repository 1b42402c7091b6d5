"""The W&B tracker: offline unless logged in, and online trouble never fails the job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("error", ["UsageError", "CommError"])
def test_online_without_login_or_network_logs_offline_with_a_note(tmp_path, monkeypatch, capsys, error):
    import wandb

    from spantrain.tracking import INIT_TIMEOUT_S, Tracker

    real_init = wandb.init
    seen = []

    def init(*, mode, settings, **kwargs):
        seen.append((mode, settings.init_timeout))
        if mode == "online":  # what wandb raises without a login (at once) or without the network (after retries)
            raise getattr(wandb.errors, error)("No API key configured. Use `wandb login` to log in.\nmore advice")
        return real_init(mode=mode, settings=settings, **kwargs)

    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_INIT_TIMEOUT", raising=False)
    monkeypatch.setattr(wandb, "init", init)
    tracker = Tracker(job_type="test", config={"a": 1}, dir=tmp_path / "wandb")
    try:
        tracker.log({"x": 1.0}, step=0)
        where = tracker.url_or_dir
    finally:
        tracker.finish()
    assert seen[0] == ("online", INIT_TIMEOUT_S) and seen[1][0] == "offline"  # no 90 s wait for the network
    assert where.startswith(str(tmp_path / "wandb" / "wandb" / "offline-run-"))
    assert list((tmp_path / "wandb").rglob("*.wandb"))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"spantrain: note: W&B cannot log online (No API key configured. Use `wandb login` to log in.); "
                   f"logging offline to {where} instead (`wandb sync {where}` uploads it later)"]


def test_a_run_id_that_cannot_start_online_logs_offline_under_the_same_id(tmp_path, monkeypatch, capsys):
    """A `run --track` (its launcher picks the id) or a resumed job with a W&B server that does not
    answer: the offline retry under the same id was refused by wandb's service ("run ID ... is in
    use"), and the whole training run failed before its first iteration."""
    import socket

    from spantrain.tracking import Tracker

    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "2")
    earlier = tmp_path / "wandb" / "wandb" / "run-20260101_000000-earlier1"  # an online run's, not this attempt's
    earlier.mkdir(parents=True)
    tracker = Tracker(job_type="test", config={"a": 1}, dir=tmp_path / "wandb", run_id="abcd1234")
    try:
        tracker.log({"x": 1.0}, step=0)
        where, run_id = tracker.url_or_dir, tracker.run_id
    finally:
        tracker.finish()
    assert run_id == "abcd1234"
    assert where.startswith(str(tmp_path / "wandb" / "wandb" / "offline-run-")) and where.endswith("-abcd1234")
    assert "W&B cannot log online" in capsys.readouterr().err
    # the failed attempt left its directory, a run record inside, for `wandb sync` to upload as a run
    assert sorted((tmp_path / "wandb" / "wandb").glob("*run-*")) == [Path(where), earlier]


def test_an_online_attempt_prints_no_wandb_login_line_but_keeps_its_warnings(tmp_path):
    # "wandb: [wandb.login()] Loaded credentials for ... from WANDB_API_KEY." came before spantrain's note
    import socket

    with socket.socket() as s:  # a port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": f"http://127.0.0.1:{port}",
           "WANDB_INIT_TIMEOUT": "3"}
    env.pop("WANDB_SILENT", None)
    code = ("import sys, wandb; from spantrain.tracking import Tracker; "
            "Tracker(job_type='t', dir=sys.argv[1]).finish(); wandb.termlog('an info line'); "
            "wandb.termwarn('a warning')")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "w")], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("spantrain: note: W&B cannot log online ("), done.stderr
    assert "WARNING" in lines[1] and lines[1].endswith("a warning"), done.stderr


@pytest.mark.parametrize("machine,env", [
    ("api.wandb.ai", {}),
    ("api.forge.coreweave.com", {}),  # what `wandb login` writes since W&B's API moved there
    ("wandb.example.com", {"WANDB_BASE_URL": "https://wandb.example.com"}),  # a W&B server of one's own
    ("api.forge.coreweave.com", {"NETRC": "{home}/elsewhere/netrc"}),  # where wandb reads and writes it then
])
def test_a_wandb_login_entry_means_online(tmp_path, monkeypatch, machine, env):
    from spantrain.tracking import wandb_mode

    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name, value in env.items():
        monkeypatch.setenv(name, value.format(home=tmp_path))
    assert wandb_mode() == "offline"
    rc = tmp_path / ".netrc" if "NETRC" not in env else tmp_path / "elsewhere" / "netrc"
    rc.parent.mkdir(exist_ok=True)
    rc.write_text(f"machine {machine}\n  login user\n  password {'k' * 40}\n")
    rc.chmod(0o600)
    assert wandb_mode() == "online"


@pytest.mark.parametrize("mode", ["offline", "disabled"])
def test_a_logged_file_is_versioned_in_the_run_without_a_copy_in_home(tmp_path, monkeypatch, mode, wandb_records):
    from spantrain.tracking import Tracker

    monkeypatch.setenv("WANDB_MODE", mode)
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))  # where wandb stages copies by default
    policy = tmp_path / "policy-96.pt"
    policy.write_bytes(b"weights")
    monkeypatch.chdir(tmp_path)
    with Tracker(job_type="test", dir=tmp_path / "wandb") as tracker:
        tracker.log_artifact(Path("policy-96.pt"), name="ppo-policy", type="model", aliases=["step-96", "best"],
                             metadata={"steps": 96})
    assert not list((tmp_path / "data").rglob("*.pt"))
    expected = (b"ppo-policy", b"step-96", b"best", b"policy-96.pt", str(policy.resolve()).encode())
    records = wandb_records(tmp_path / "wandb", *expected, timeout_s=10 if mode == "offline" else 0)
    if mode == "offline":  # the run's log holds the artifact: name, aliases and the file to upload
        # the path absolute: `wandb sync` may run from another directory
        assert all(s in records for s in expected), [s for s in expected if s not in records]
    else:
        assert records == b""


def test_tables_and_images_stay_with_the_run_not_in_home(tmp_path, monkeypatch):
    # wandb staged a copy of each under ~/.local/share/wandb, which offline runs never cleared
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spantrain.tracking import Tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("WANDB_DATA_DIR", raising=False)
    plt.plot([0, 1])
    plt.savefig(tmp_path / "curve.png")
    plt.close()
    with Tracker(job_type="test", dir=tmp_path / "run") as tracker:
        tracker.log_table("eval/final", ["case", "ratio"], [["a", 1.0], ["b", 1.02]])
        tracker.log_image("eval/curve", tmp_path / "curve.png")
    assert not list((tmp_path / "home").rglob("wandb"))
    assert [p for p in (tmp_path / "run" / "data").rglob("*") if p.is_file()], "nothing staged with the run"
    assert "WANDB_DATA_DIR" not in os.environ  # the setting ends with the run


def test_the_summary_outlasts_the_last_open_row(tmp_path, monkeypatch, wandb_records):
    # wandb held the last iteration's row until the run's end, and then it overwrote the run's
    # median samples_per_s in the summary with that one iteration's
    from spantrain.tracking import Tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    with Tracker(job_type="test", dir=tmp_path / "wandb") as tracker:
        for value in (31335.125, 31336.125, 31337.125):  # digits and a point no timestamp in the log has
            tracker.log({"samples_per_s": value}, step=int(value) - 31334)
        tracker.summary({"samples_per_s": 27182.875})
    records = wandb_records(tmp_path / "wandb", b"31337.125", b"27182.875")
    last, summary = records.find(b"31337.125"), records.find(b"27182.875")
    assert last >= 0 and records.count(b"27182.875") == 1 and last < summary, "the last row came after the summary"


def test_wandbs_import_time_directories_go_with_a_process_that_skips_exit_handlers(tmp_path):
    # a runtime worker ends with os._exit: every tracked run left two empty directories in $TMPDIR
    (tmp_path / "tmp").mkdir()
    code = ("import os, wandb\n"
            "from spantrain.tracking import remove_import_temp_dirs\n"
            "made = len(os.listdir(os.environ['TMPDIR']))\n"
            "remove_import_temp_dirs()\n"
            "print(made)\n"
            "os._exit(0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path / "tmp")})
    assert proc.returncode == 0 and int(proc.stdout) >= 1, proc.stderr  # wandb made some: the test means something
    assert list((tmp_path / "tmp").iterdir()) == []


def test_tables_and_images_go_to_the_step_they_are_given(tmp_path, monkeypatch):
    # a resumed run's offline part counts from 0: its final table landed at step 0, below the history it
    # continues, and syncing drops such rows
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from spantrain.tracking import Tracker

    plt.plot([0, 1])
    plt.savefig(tmp_path / "curve.png")
    plt.close()
    logged = []

    class Run:
        def log(self, metrics, step=None, commit=None):
            logged.append((sorted(metrics), step))

    tracker = Tracker(job_type="test", enabled=False)
    tracker.run = Run()
    tracker.log_table("eval/final", ["case"], [["a"]], step=1088)
    tracker.log_image("eval/curve", tmp_path / "curve.png", step=1088)
    tracker.log_table("t", ["case"], [["a"]])  # no step: wandb's own next one
    # below a step already logged: W&B drops the row ("less than the current step"), so it goes
    # to that step (train-policy logged its final table below PPO's last losses)
    tracker.log({"ppo/loss": 1.0}, step=1090)
    tracker.log_table("late", ["case"], [["a"]], step=1089)
    assert logged == [(["eval/final"], 1088), (["eval/curve"], 1088), (["t"], None), (["ppo/loss"], 1090),
                      (["late"], 1090)]


def test_a_part_that_continues_a_run_logs_past_the_steps_the_run_already_has(tmp_path, monkeypatch):
    # a resumed train-policy part logged its final table at the step the first part ended on, and
    # its first rollout again at one the first part had logged: W&B drops both on sync
    from spantrain.tracking import Tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    first = Tracker(job_type="test", dir=tmp_path / "wandb")
    first.log({"x": 1.0}, step=64)
    first.log({"x": 2.0}, step=128)
    run_id = first.run_id
    first.finish()
    assert (tmp_path / "wandb" / f"last-step-{run_id}").read_text() == "128"

    second = Tracker(job_type="test", dir=tmp_path / "wandb", run_id=run_id)
    logged = []
    real_log = second.run.log
    second.run.log = lambda metrics, step=None, **kw: logged.append(step) or real_log(metrics, step=step, **kw)
    second.log({"x": 3.0}, step=64)  # trained again after the resume
    second.log_table("eval/final", ["case"], [["a"]], step=128)
    second.log({"x": 4.0}, step=192)
    second.finish()
    assert logged == [129, 129, 192]
    assert (tmp_path / "wandb" / f"last-step-{run_id}").read_text() == "192"
    # a new run starts where it likes
    third = Tracker(job_type="test", dir=tmp_path / "wandb")
    assert third._at(0) == 0
    third.finish()


def test_a_copied_artifact_keeps_the_file_as_it_was_when_logged(tmp_path, monkeypatch, wandb_records):
    # train-policy's resumed part rewrites ppo-policy.pt and best-policy.pt: the first part's
    # `final` and `best` versions, by reference, then pointed at the second part's weights
    from spantrain.tracking import Tracker

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DATA_DIR", raising=False)
    policy = tmp_path / "ppo-policy.pt"
    policy.write_bytes(b"first part's weights")
    with Tracker(job_type="test", dir=tmp_path / "wandb") as tracker:
        tracker.log_artifact(policy, name="ppo-policy", type="model", aliases=["final"], copy=True)
    wandb_records(tmp_path / "wandb", b"ppo-policy", b"final")
    policy.write_bytes(b"second part's weights")
    staged = [p.read_bytes() for p in (tmp_path / "wandb" / "data").rglob("*") if p.is_file()]
    assert b"first part's weights" in staged, staged


def test_a_job_continues_the_run_id_it_left_in_its_directory(tmp_path, monkeypatch):
    from spantrain.tracking import RUN_ID_FILE, wandb_run_id

    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    first = wandb_run_id(tmp_path, resume=False)
    assert len(first) == 8 and first.isalnum() and first != wandb_run_id(tmp_path, resume=False)
    (tmp_path / RUN_ID_FILE).write_text(first)
    assert wandb_run_id(tmp_path, resume=True) == first
    assert wandb_run_id(tmp_path, resume=False) != first  # a new job starts a new run
    (tmp_path / RUN_ID_FILE).write_text("../../etc")  # damaged: a new run, not an error
    assert wandb_run_id(tmp_path, resume=True).isalnum()
    monkeypatch.setenv("WANDB_RUN_ID", "mine123")  # the user's choice wins
    assert wandb_run_id(tmp_path, resume=True) == wandb_run_id(tmp_path, resume=False) == "mine123"


def test_a_copied_job_directory_starts_a_run_of_its_own(tmp_path, monkeypatch, capsys):
    # `cp -r R R2` then a resume in R2 logged into R's W&B run: two jobs in one run
    import shutil

    from spantrain.tracking import Tracker, continued_run_id, wandb_run_id

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    original, copy = tmp_path / "R" / "wandb", tmp_path / "R2" / "wandb"
    with Tracker(job_type="test", dir=original) as tracker:
        first = tracker.run_id
    shutil.copytree(original.parent, copy.parent)
    capsys.readouterr()
    assert wandb_run_id(original, resume=True) == continued_run_id(original, first) == first
    assert capsys.readouterr().err == ""
    assert wandb_run_id(copy, resume=True) != first
    assert continued_run_id(copy, first) is None
    err = capsys.readouterr().err
    assert err.count(f"{copy} was copied or moved from {original.resolve()}") == 2, err
    assert f"set WANDB_RUN_ID={first} to continue that one" in err, err
    # the copy's own run is the one it continues from then on
    with Tracker(job_type="test", dir=copy, run_id=wandb_run_id(copy, resume=True)) as tracker:
        second = tracker.run_id
    assert wandb_run_id(copy, resume=True) == second != first
    monkeypatch.setenv("WANDB_RUN_ID", first)  # the user's choice wins
    assert continued_run_id(copy, second) == first


@pytest.mark.parametrize(("var", "value", "says"), [
    ("WANDB_SILENT", "maybe", "WANDB_SILENT=maybe is refused by W&B (Input should be a valid boolean"),
    ("WANDB_INIT_TIMEOUT", "abc", "WANDB_INIT_TIMEOUT=abc is refused by W&B (Input should be a valid number"),
    ("WANDB_CONSOLE", "bogus", "WANDB_CONSOLE=bogus is refused by W&B (Input should be 'auto', 'off'"),
    ("WANDB_RUN_ID", "bad/id", "WANDB_RUN_ID=bad/id is refused by W&B (Run ID cannot contain the characters"),
])
def test_a_wandb_variable_wandb_refuses_is_named_in_one_line(monkeypatch, var, value, says):
    # each was a traceback from train-policy, and a worker's failure (exit 1, "stopped responding") from run
    from spantrain.errors import SpantrainError
    from spantrain.tracking import check_environment

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv(var, value)
    with pytest.raises(SpantrainError) as e:
        check_environment()
    assert str(e.value).startswith(says) and str(e.value).endswith("): fix it or unset it"), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("var", "value", "says"), [
    # wandb takes them, then waits for ever for the run to start online (Ctrl-C: a traceback, wandb-core left)
    ("WANDB_INIT_TIMEOUT", "0", "WANDB_INIT_TIMEOUT=0 makes W&B wait for ever for a run to start: give a positive "
                                "number of seconds, or unset it"),
    ("WANDB_INIT_TIMEOUT", "-5", "WANDB_INIT_TIMEOUT=-5 makes W&B wait for ever"),
    # a traceback after the whole training, when the final table was staged
    ("WANDB_DATA_DIR", "/dev/null/x", "WANDB_DATA_DIR=/dev/null/x: W&B cannot write there (Not a directory at "
                                      "/dev/null): pass a directory this user can write, or unset it"),
])
def test_wandb_values_wandb_takes_but_cannot_work_with_are_named(monkeypatch, var, value, says):
    from spantrain.errors import SpantrainError
    from spantrain.tracking import check_environment

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv(var, value)
    with pytest.raises(SpantrainError, match=re.escape(says)):
        check_environment()
    monkeypatch.setenv(var, "30" if var == "WANDB_INIT_TIMEOUT" else str(os.getcwd()))
    check_environment()


def test_an_empty_wandb_variable_counts_as_unset(monkeypatch):
    from spantrain.tracking import check_environment

    monkeypatch.setenv("WANDB_MODE", "")  # wandb refused it as a mode; spantrain's own check took it for unset
    monkeypatch.setenv("WANDB_RUN_ID", " ")
    check_environment()
    assert "WANDB_MODE" not in os.environ and "WANDB_RUN_ID" not in os.environ


def test_what_a_killed_process_logged_a_moment_before_is_in_its_offline_run(tmp_path, wandb_records):
    # wandb's service dies with a SIGKILLed job and loses what it had not written to the run's
    # file: at wandb's default of 15 s, a train-policy killed 10 s in had lost half its records
    import signal
    import time

    code = ("import sys, time\n"
            "from spantrain.tracking import Tracker\n"
            "t = Tracker(job_type='test', dir=sys.argv[1])\n"
            "t.log({'x': 31337.125}, step=7)\n"
            "t.log({'x': 1.0}, step=8)\n"  # commits step 7's row
            "print(t.url_or_dir, flush=True)\n"
            "time.sleep(120)\n")
    # its temporary directories too: killed, it cannot remove what wandb made in TMPDIR as it started
    (tmp_path / "tmp").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "wandb")], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "WANDB_MODE": "offline", "TMPDIR": str(tmp_path / "tmp")})
    try:
        where = proc.stdout.readline().strip()
        time.sleep(3)  # a few of the tracker's flush intervals, well under wandb's own
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert where and Path(where).is_dir()
    records = wandb_records(tmp_path / "wandb", b"31337.125", timeout_s=2)
    assert b"31337.125" in records


def test_a_later_part_of_a_run_starts_with_the_name_and_config_of_the_part_before(tmp_path, wandb_part):
    # run --adapt's decisions: the launcher logged them in a part with an empty name and config
    from spantrain.tracking import Tracker, part_settings

    config = {"model": "m", "plan": {"pipelines": [[1, 2]]}, "planner": "heuristic"}
    with Tracker(job_type="test", dir=tmp_path, name="m on c: run", config=config) as first:
        first.log({"x": 1.0}, step=3)
        run_id = first.run_id
    assert part_settings(tmp_path, "other123") == {} and part_settings(tmp_path, None) == {}
    with Tracker(job_type="test", dir=tmp_path, run_id=run_id, **part_settings(tmp_path, run_id)) as later:
        later.log({"y": 2.0}, step=0)
        where = later.url_or_dir
    got = wandb_part(where)
    assert (got["name"], got["config"], got["steps"]) == ("m on c: run", config, [4])
