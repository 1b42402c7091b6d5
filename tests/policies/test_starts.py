"""Cached heuristic starts: computed once, and a damaged cache file is recomputed, not fatal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from spantrain.env.evaluator import Evaluator
from spantrain.env.plan_env import scenario_workload
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.policies.starts import HeuristicStarts
from spantrain.profiler.topology import generate

KEY = ("cee", 5, 3, "gpt2-medium", 1.0)


def _evaluator() -> Evaluator:
    profile, n, seed, model, scale = KEY
    return Evaluator(generate(n, seed=seed, profile=profile), scenario_workload(model, scale))


def test_a_start_is_cached_and_equals_the_heuristic_plan(tmp_path):
    starts = HeuristicStarts(tmp_path)
    assert starts.prepare([KEY, KEY], progress=False) == 1
    assert starts.prepare([KEY], progress=False) == 0
    files = list(tmp_path.iterdir())
    assert [p.suffix for p in files] == [".json"]  # no temporary file left behind
    want = HeuristicPlanner().best_candidate(_evaluator())
    got = HeuristicStarts(tmp_path)(KEY, _evaluator())
    assert (got.layout, got.shares, got.knobs, got.time) == (want.layout, want.shares, want.knobs, want.time)


def test_a_half_written_cache_file_is_recomputed(tmp_path):
    HeuristicStarts(tmp_path).prepare([KEY], progress=False)
    (path,) = tmp_path.iterdir()
    whole = path.read_text()
    path.write_text(whole[: len(whole) // 2])  # as if interrupted mid-write by an older version
    assert HeuristicStarts(tmp_path).prepare([KEY], progress=False) == 1
    assert path.read_text() == whole
    path.write_text("{")
    assert HeuristicStarts(tmp_path)(KEY, _evaluator()).feasible
    assert path.read_text() == whole


@pytest.mark.parametrize("start", [{"layout": 5}, {"layout": [[0, "a"]], "shares": [1], "knobs": {}},
                                   {"layout": [[0]], "shares": [1, 2], "knobs": {"micro_batch_size": 1}}, [1, 2]])
def test_a_cache_file_that_holds_no_start_is_recomputed(tmp_path, start):
    # valid JSON of another shape was a traceback ("TypeError: 'int' object is not iterable")
    HeuristicStarts(tmp_path).prepare([KEY], progress=False)
    (path,) = tmp_path.iterdir()
    whole = path.read_text()
    path.write_text(json.dumps({"start": start}))
    assert HeuristicStarts(tmp_path).prepare([KEY], progress=False) == 1
    assert path.read_text() == whole
    path.write_text(json.dumps({"start": start}))
    assert HeuristicStarts(tmp_path)(KEY, _evaluator()).feasible


def test_a_worker_terminated_while_writing_its_start_finishes_the_file_first(tmp_path):
    # the pool's exit after Ctrl-C sends its workers SIGTERM; one that came mid-write left a
    # temporary file in the cache. Here SIGTERM arrives between writing and renaming.
    code = ("import os, signal, sys\n"
            "from spantrain.policies.starts import _plan_one\n"
            "rename = os.replace\n"
            "def terminated_then_rename(a, b):\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"
            "    rename(a, b)\n"
            "os.replace = terminated_then_rename\n"
            f"_plan_one(({KEY!r}, sys.argv[1]))\n"
            "print('not terminated')\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGTERM, proc.stderr + proc.stdout
    assert [p.suffix for p in tmp_path.iterdir()] == [".json"]
    assert HeuristicStarts(tmp_path).prepare([KEY], progress=False) == 0  # whole: read back, not recomputed


@pytest.mark.slow
@pytest.mark.parametrize("to_group", [True, False], ids=["ctrl-c", "kill-int"])
def test_interrupt_while_computing_starts_in_parallel_exits_and_keeps_what_was_written(tmp_path, to_group):
    # the parent alone takes the KeyboardInterrupt (workers ignore it) and the pool's exit
    # terminates the workers; with a ProcessPoolExecutor, SIGINT to the parent alone made it
    # wait for every queued start (minutes) before exiting
    # a runner in the background (nohup, CI) may hand down SIGINT ignored: restore Python's handler
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from spantrain.runtime import stop_signals\n"
            "stop_signals.install()  # as train-policy does\n"
            "from spantrain.policies.starts import HeuristicStarts\n"
            "keys = [('datacenter', 32, s, 'gpt2-xl', 1.0) for s in range(200)]\n"
            "HeuristicStarts(sys.argv[1]).prepare(keys, workers=2, progress=False)\n")
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", code, str(cache)], stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not (cache.exists() and any(p.suffix == ".json" for p in cache.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, "no start was written"
        time.sleep(0.1)
    if to_group:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the whole foreground process group
    else:
        proc.send_signal(signal.SIGINT)  # kill -INT, timeout -s INT, a scheduler: the parent only
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("prepare kept running after SIGINT") from None
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert "ForkPoolWorker" not in err and "Terminated" not in err, err  # the workers ended quietly
    written = list(cache.iterdir())
    assert 0 < len(written) < 200 and all(p.suffix == ".json" for p in written)  # no half-written file
    keys = [tuple(json.loads(p.read_text())["key"]) for p in written]  # every file whole
    assert HeuristicStarts(cache).prepare(keys, progress=False) == 0


def test_workers_end_quietly_when_the_pool_closes_under_train_policys_signal_handlers(tmp_path):
    # forked from train-policy, they inherited its SIGTERM handler, and the pool's SIGTERM at its
    # exit made each print a `Terminated` traceback, in runs that went well
    code = ("import sys\n"
            "from spantrain.runtime import stop_signals\n"
            "stop_signals.install()\n"
            "from spantrain.policies.starts import HeuristicStarts\n"
            "keys = [('cee', 4, s, 'gpt2-medium', 1.0) for s in range(4)]\n"
            "print(HeuristicStarts(sys.argv[1]).prepare(keys, workers=2, progress=False))\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "4" and proc.stderr == "", proc.stderr


def test_a_hang_up_under_nohup_leaves_the_starts_running_to_the_end(tmp_path):
    # the hang-up reaches the whole job; workers that reset SIGHUP to the default died of it, and the
    # pool waited for ever for the starts they held, where the parent (under nohup) ignores it
    code = ("import signal, sys\n"
            "signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup\n"
            "from spantrain.runtime import stop_signals\n"
            "stop_signals.install()\n"
            "from spantrain.policies.starts import HeuristicStarts\n"
            "keys = [('cee', 6, s, 'gpt2-medium', 1.0) for s in range(30)]\n"
            "print(HeuristicStarts(sys.argv[1]).prepare(keys, workers=2, progress=False))\n")
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", code, str(cache)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not (cache.exists() and any(p.suffix == ".json" for p in cache.iterdir())):
        assert proc.poll() is None and time.monotonic() < deadline, "no start was written"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGHUP)  # the terminal closes
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the pool waited for ever for starts whose workers the hang-up killed") from None
    assert proc.returncode == 0 and out.strip() == "30" and err == "", err


def test_no_more_processes_than_starts_to_compute(tmp_path, monkeypatch):
    import multiprocessing

    def no_pool(*args, **kwargs):
        raise AssertionError("one missing start needs no process pool")

    monkeypatch.setattr(multiprocessing, "Pool", no_pool)
    assert HeuristicStarts(tmp_path).prepare([KEY], workers=8, progress=False) == 1


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_spantrain_cache_is_the_default_cache(tmp_path, monkeypatch, value):
    # as a path "" is the working directory: the starts went to ./starts
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("SPANTRAIN_CACHE", value)
    assert HeuristicStarts().prepare([KEY], progress=False) == 1
    assert list(work.iterdir()) == []
    assert len(list((home / ".cache" / "spantrain" / "starts").iterdir())) == 1
    monkeypatch.setenv("SPANTRAIN_CACHE", str(tmp_path / "mine"))  # set, it is the cache
    assert HeuristicStarts().prepare([KEY], progress=False) == 1
    assert len(list((tmp_path / "mine" / "starts").iterdir())) == 1
