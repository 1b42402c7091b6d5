"""`spantrain run --emulate` (root only): a plan's devices on the local emulated cluster.

It trains exactly what a plain local run trains, rank k runs the plan's k-th device with the
CPU quota it has in the whole cluster, a dead worker fails the run in one line without a
hang, and no namespace, link or cgroup outlives a run.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import ASYMMETRIC, CLUSTER, plan, rewrite, rewrite_after_step, spantrain_here, write_inputs

from spantrain.plan import Plan
from spantrain.runtime.emulator import netns
from spantrain.runtime.emulator.cpu import CGROUP_CPU

_REASON = netns.unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.slow,
              pytest.mark.skipif(_REASON is not None, reason=f"needs root, ip netns and tc htb: {_REASON}")]


def _emulator_objects() -> set[str]:
    """Every emulator namespace, cgroup and hub link on the machine."""
    found = {ns for ns in netns.list_namespaces() if ns.startswith("spt-")}
    found |= {str(p) for p in CGROUP_CPU.glob("spt-*")}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return found | {line.split(":")[1].strip() for line in links.splitlines() if ": spt" in line}


@pytest.fixture
def no_leftovers():
    """Fails the test if it leaves an emulator object behind (objects of other emulators are ignored)."""
    before = _emulator_objects()
    yield
    assert _emulator_objects() - before == set()


def _args(tmp_path: Path, name: str, plan_dict: dict, steps: int, *extra: str) -> list[str]:
    cluster, model = write_inputs(tmp_path)
    path = tmp_path / f"{name}.plan.json"
    path.write_text(json.dumps(plan_dict))
    return ["run", "--cluster", str(cluster), "--model", str(model), "--plan", str(path), "--steps", str(steps),
            "--lr", "0.01", "--adam-eps", "1.0", "--run-dir", str(tmp_path / name), "--no-progress", "--json", *extra]


def _result(code: int, out: str, err: str) -> dict:
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def test_emulated_run_trains_exactly_like_a_local_run(tmp_path, no_leftovers):
    both = plan("1f1b", "allreduce", ASYMMETRIC)
    local = _result(*spantrain_here(*_args(tmp_path, "local", both, 3, "--threads", "1")))
    emulated = _result(*spantrain_here(*_args(tmp_path, "emulated", both, 3, "--threads", "1", "--emulate",
                                              "--emulate-mode", "netns")))
    assert emulated["emulated"] is True and emulated["world_size"] == 4
    assert emulated["final_step"] == 3
    # predicted with the profile fitted to this runtime; the spec's TFLOP/s are not the emulated devices' speed
    assert emulated["prediction_calibration"] == "emulated-cpu.yaml" and emulated["prediction_comparable"] is False
    assert emulated["predicted_step_s"] > local["predicted_step_s"] > 0  # no sync overlap, per-op overheads
    # Same samples, same initialisation, same sums: shaping and latency change timing, not training.
    assert emulated["losses"] == pytest.approx(local["losses"], rel=1e-5)


def test_plan_devices_are_the_ranks_with_their_whole_cluster_quotas(tmp_path, no_leftovers):
    # Two of the four devices, in reverse cluster order: ranks 0 and 1 are b-1 and a-0, and each
    # keeps the quota it has when all four share the 2 cores (0.5 core per TFLOP/s), not 1 core.
    two = plan("gpipe", "allreduce", [(2, 2, [("b-1", 0, 3), ("a-0", 3, 6)])])
    code, out, err = spantrain_here(*_args(tmp_path, "two", two, 2, "--emulate", "--emulate-cpus", "2",
                                           "--emulate-mode", "netns"))
    result = _result(code, out, err)
    assert result["world_size"] == 2
    start = json.loads((tmp_path / "two" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["devices"] == {"0": "b-1", "1": "a-0"}
    assert "emulator: CPU quota 1 core over 2 spec TFLOP/s = 0.5 cores per TFLOP/s" in err
    assert "2 devices, mode netns" in err


def test_input_the_emulator_refuses_makes_no_run_directory(tmp_path, no_leftovers):
    from spantrain.runtime.emulator import cpu

    slow = copy.deepcopy(CLUSTER)
    slow["network"]["default"]["gbps"] = 1e-8  # 10 bit/s: below what tc can shape
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    two = plan("gpipe", "allreduce", [(2, 2, [("a-0", 0, 3), ("b-0", 3, 6)])])
    cases = [("--emulate-network", str(tmp_path / "slow.json"), "--emulate-mode", "netns")]
    if cpu.unavailable_reason() is None:
        cases.append(("--emulate-cpus", "0.001"))
    for k, extra in enumerate(cases):
        code, out, err = spantrain_here(*_args(tmp_path, f"refused{k}", two, 2, "--emulate", *extra))
        assert code == 2 and out == "", err
        assert err.startswith("spantrain run: error: emulated run: ") and err.count("\n") == 1, err
        assert ("the kernel's shaper can enforce" if k == 0 else "below the smallest CPU quota") in err, err
        assert not (tmp_path / f"refused{k}").exists()


def _worker_pids(config: Path) -> list[int]:
    """Pids of the emulated workers of one run (their command line names its config file)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"spantrain.runtime.emulated_worker" in cmd and str(config).encode() in cmd:
                pids.append(int(entry.name))
    return pids


def test_a_killed_worker_fails_the_run_in_one_line_without_hanging(tmp_path, no_leftovers):
    args = _args(tmp_path, "dies", plan("1f1b", "allreduce", ASYMMETRIC), 10_000, "--emulate",
                 "--emulate-mode", "netns")
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    metrics = tmp_path / "dies" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or metrics.read_text().count('"loss"') < 2):
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1]
    pids = _worker_pids(tmp_path / "dies" / "run_config.json")
    assert len(pids) == 4
    victim = sorted(pids)[2]
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=90)
    assert time.monotonic() - t0 < 45, "the run took too long to notice its dead worker"
    assert proc.returncode == 1 and out == ""  # the run failed on its own: not bad input (2)
    lines = [x for x in err.strip().splitlines() if not x.startswith("emulator: ")]
    assert len(lines) == 1 and lines[0].startswith("spantrain run: error: worker rank "), err
    assert "was killed by SIGKILL after iteration" in lines[0] and "stopped the other 3 worker(s)" in lines[0]
    assert "Traceback" not in err
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]


def test_a_device_too_slow_to_start_is_noted_and_ctrl_c_before_training_ends_the_run_at_once(tmp_path,
                                                                                             no_leftovers):
    # 0.005 cores: the run looked hung (no word), and Ctrl-C waited the launcher's 120 s grace, with
    # KeyboardInterrupt tracebacks of torch's imports in the devices' logs
    args = _args(tmp_path, "slow", plan("1f1b", "allreduce", ASYMMETRIC), 100, "--emulate", "--emulate-mode",
                 "netns", "--emulate-cpus", "0.08")
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        logs = tmp_path / "slow" / "logs"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(logs.glob("*.log"))) < 4:
            time.sleep(0.2)
        time.sleep(2)  # the devices are importing torch, at a few hundredths of a core each
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=150)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and took < 30, (took, err)
    assert "needs about" in err and "s to start (about 3 CPU-seconds of imports) before training" in err, err
    assert not [p.name for p in logs.glob("*.log") if "Traceback" in p.read_text()], err


def test_adapting_run_follows_a_network_change_and_switches_plans(tmp_path, no_leftovers):
    """Two devices in two regions, one pipeline across them; the cluster file's link between the
    regions drops from 1 Gbit/s to 2 Mbit/s after iteration 3: the emulator reshapes the live
    link, and the run moves onto one device. (Two devices, so each gets a whole core of the
    two and the two launches start up in seconds.)"""
    two = copy.deepcopy(CLUSTER)
    two["devices"] = [{"id": "a-0", "region": "r1", "tflops": 1, "memory_gb": 8},
                      {"id": "b-0", "region": "r2", "tflops": 1, "memory_gb": 8}]
    # 24 iterations: with 21 to go moving pays (about 0.16 s an iteration kept against 1.7 s of migration over
    # the slow link); with 9 to go the adapter rightly keeps the plan
    args = _args(tmp_path, "adapt", plan("1f1b", "allreduce", [(5, 2, [("a-0", 0, 3), ("b-0", 3, 6)])]), 24,
                 "--emulate", "--emulate-mode", "netns", "--checkpoint-dir", str(tmp_path / "ckpt"), "--adapt",
                 "--adapt-planner", "heuristic")
    rewrite(tmp_path / "cluster.json", two)
    slow = copy.deepcopy(two)
    slow["network"]["default"] = {"gbps": 0.002, "latency_ms": 20}
    rewrite_after_step(tmp_path / "adapt" / "metrics.jsonl", tmp_path / "cluster.json", 3, slow)
    code, out, err = spantrain_here(*args)
    result = _result(code, out, err)
    assert "emulator: links reshaped to the new cluster file" in err
    first, second = result["segments"]
    assert result["final_step"] == 24 and len(result["losses"]) == 24 and result["emulated"] is True
    assert Plan.from_dict(first["plan"]).devices == ["a-0", "b-0"]
    assert len(Plan.from_dict(second["plan"]).devices) == 1  # off the slow link
    (decision,) = result["adaptations"]
    assert decision["switch"] and decision["switched_at"] == first["final_step"] == second["start_step"]
