"""Emulator parts that need no root: the latency contract, shaping plans, CPU shares, names,
the CLI's input errors and the fallback to plain local processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from spantrain.cluster import GBPS, Cluster
from spantrain.errors import EmulationError
from spantrain.runtime.emulator import cpu, latency, netns, shaping, state
from spantrain.runtime.emulator.cluster import EmulatedCluster
from spantrain.runtime.emulator.options import RUN_OPTIONS
from spantrain.runtime.emulator.state import RunNames

SPEC = {
    "name": "units",
    "devices": [{"id": "a", "count": 2, "region": "ra", "tflops": 30, "memory_gb": 8},
                {"id": "b-0", "region": "rb", "tflops": 10, "memory_gb": 4}],
    "network": {"regions": {"ra": {"gbps": 0.2, "latency_ms": 2}, "rb": {"gbps": 0.1, "latency_ms": 3}},
                "links": [{"between": ["ra", "rb"], "gbps": 0.02, "latency_ms": 20}],
                "overrides": [{"from": "a-0", "to": "b-0", "gbps": 0.005, "latency_ms": 30}]},
}


@pytest.fixture
def cluster() -> Cluster:
    return Cluster.from_spec(SPEC)


def _emulation(cluster: Cluster, kernel_shaping: bool) -> latency.Emulation:
    n = len(cluster)
    gbps = [[None if i == j else float(cluster.bandwidth[i, j] / GBPS) for j in range(n)] for i in range(n)]
    return latency.Emulation(cluster="units", run_id="abcd", kernel_shaping=kernel_shaping, bandwidth_scale=1.0,
                             max_gbps=1.0, master_addr="127.0.0.1", master_port=1, cpu={"cores": 1},
                             devices=[{"rank": k, "id": d.id} for k, d in enumerate(cluster.devices)],
                             latency=cluster.latency.tolist(), spec_gbps=gbps, emulated_gbps=gbps)


def test_latency_contract_reads_the_file_named_by_the_env_var(cluster, tmp_path, monkeypatch):
    path = tmp_path / "emulation.json"
    _emulation(cluster, kernel_shaping=True).write(path)
    monkeypatch.setenv(latency.ENV_VAR, str(path))
    assert latency.latency_s(0, 2) == pytest.approx(0.030)  # the directional override
    assert latency.latency_s(2, 0) == pytest.approx(0.020)
    assert latency.latency_s(1, 1) == 0.0
    # ring 0 -> 1 -> 2 -> 0: the slowest hop is 20 ms, paid 2 (n - 1) = 4 times
    assert latency.ring_latency_s([0, 1, 2]) == pytest.approx(4 * 0.020)
    t0 = time.perf_counter()
    slept = latency.delay_before_send(0, 1, nbytes=10**6)  # kernel shapes: latency only
    took = time.perf_counter() - t0
    assert slept == pytest.approx(0.002) and 0.002 <= took < 0.035  # 1 MB at 0.2 Gbit/s would add 40 ms
    assert latency.current().rank_of("b-0") == 2
    assert latency.ring_allreduce_delay_s([0, 1, 2], 10**9) == pytest.approx(0.08)  # the kernel shapes bytes


def test_fallback_file_makes_the_transport_add_serialization(cluster, tmp_path, monkeypatch):
    path = tmp_path / "emulation.json"
    _emulation(cluster, kernel_shaping=False).write(path)
    monkeypatch.setenv(latency.ENV_VAR, str(path))
    # 250 kB at 0.2 Gbit/s = 10 ms, plus 2 ms of latency
    t0 = time.perf_counter()
    assert latency.delay_before_send(0, 1, nbytes=250_000) == pytest.approx(0.012)
    assert time.perf_counter() - t0 >= 0.012
    # a ring all-reduce of 3 MB over a-0, a-1, b-0: 4 hops of 20 ms, plus 4/3 x 3 MB at the
    # slowest ring link (b-0 -> a-0, 0.02 Gbit/s = 2.5 MB/s)
    assert latency.ring_allreduce_delay_s([0, 1, 2], 3_000_000) == pytest.approx(0.08 + 4 / 3 * 3e6 / 2.5e6)


def test_not_emulated_means_no_delay(monkeypatch):
    monkeypatch.delenv(latency.ENV_VAR, raising=False)
    assert latency.current() is None
    assert latency.latency_s(0, 1) == 0.0 and latency.delay_before_send(0, 1, 10**9) == 0.0


def test_malformed_emulation_file_is_one_clear_error(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"version": 1, "cluster": "x"}))
    monkeypatch.setenv(latency.ENV_VAR, str(bad))
    with pytest.raises(EmulationError, match="missing or malformed"):
        latency.current()
    monkeypatch.setenv(latency.ENV_VAR, str(tmp_path / "missing.json"))
    with pytest.raises(EmulationError, match="cannot read emulation file"):
        latency.current()


def test_shaping_plan_has_a_class_per_region_and_per_deviating_pair(cluster):
    addrs = netns.addresses(cluster)
    assert addrs == ["10.77.0.1", "10.77.0.2", "10.77.1.1"]
    classes = shaping.device_classes(cluster, 0, addrs, shaping.RateLimits())
    by_dst = {c.dst: c for c in classes}
    assert by_dst["10.77.0.0/24"].gbps == pytest.approx(0.2) and by_dst["10.77.0.0/24"].prio == 2
    assert by_dst["10.77.1.0/24"].gbps == pytest.approx(0.02)
    assert by_dst["10.77.1.1/32"].gbps == pytest.approx(0.005) and by_dst["10.77.1.1/32"].prio == 1
    # a-1 has no override: regions only
    assert len(shaping.device_classes(cluster, 1, addrs, shaping.RateLimits())) == 2


def test_tc_script_compensates_headers_and_bounds_the_burst(cluster):
    classes = shaping.device_classes(cluster, 0, netns.addresses(cluster), shaping.RateLimits())
    script = shaping.tc_batch("spt0", classes, 1.0)
    lines = script.splitlines()
    assert lines[0] == "qdisc add dev spt0 root handle 1: htb default 1"

    def line(classid: str) -> str:
        return next(x for x in lines if f"classid {classid} " in x)

    # 20 Mbit/s goodput -> 20e6 * 1514 / 1448 bit/s on the wire, burst 2 ms of that
    wire = round(20e6 * 1514 / 1448)
    assert f"parent 1: classid 1:11 htb rate {wire}bit ceil {wire}bit burst 5228b" in line("1:11")
    # its small-packet child is served first and may use the whole pipe; bulk gets the rest
    assert "parent 1:11" in line("1:8011") and line("1:8011").endswith("prio 0")
    assert f"ceil {wire}bit" in line("1:4011") and line("1:4011").endswith("prio 1")
    assert "burst 3028b" in line("1:1002")  # 5 Mbit/s override: 2 ms is less than two frames
    assert "burst 261395b" in line("1:1")  # 2 ms at 1 Gbit/s on the wire
    assert ("prio 1 u32 match ip dst 10.77.1.1/32 match u16 0x0000 0xff80 at 2 flowid 1:9002" in script
            and "prio 2 u32 match ip dst 10.77.1.1/32 flowid 1:5002" in script)
    assert "prio 4 u32 match ip dst 10.77.1.0/24 flowid 1:4011" in script


def test_gso_is_capped_at_one_millisecond_of_the_slowest_class(cluster):
    classes = shaping.device_classes(cluster, 0, netns.addresses(cluster), shaping.RateLimits())
    assert shaping.gso_bytes(classes, 1.0) == 1514  # 5 Mbit/s: 625 bytes per ms, one frame
    fast = [shaping.TcClass(minor=0x10, gbps=0.2, dst="10.77.0.0/24", prio=2)]
    assert shaping.gso_bytes(fast, 1.0) == 25_000
    assert shaping.gso_bytes([shaping.TcClass(minor=0x10, gbps=10, dst="x", prio=2)], 10.0) == 65536


def test_rate_limits_scale_and_cap(cluster):
    capped = shaping.emulated_gbps(cluster, shaping.RateLimits(scale=10.0, max_gbps=1.0))
    assert capped[0, 1] == pytest.approx(1.0) and capped[0, 2] == pytest.approx(0.05)
    fit = shaping.RateLimits.fit(cluster, max_gbps=0.1)
    assert fit.scale == pytest.approx(0.5)
    assert np.nanmax(shaping.emulated_gbps(cluster, fit)) == pytest.approx(0.1)
    with pytest.raises(EmulationError):
        shaping.RateLimits(scale=0)


def test_rates_the_shaper_cannot_enforce_are_named(cluster):
    shaping.check_rates(cluster, shaping.RateLimits(scale=1e-7 / 0.005))  # a-0 -> b-0 at exactly 100 bit/s
    with pytest.raises(EmulationError, match=r"^a-0 -> b-0: emulated bandwidth 5e-08 Gbit/s is below the 1e-07"):
        shaping.check_rates(cluster, shaping.RateLimits(scale=1e-5))
    with pytest.raises(EmulationError, match=r"^--max-gbps: emulated bandwidth 5e-08"):
        shaping.check_rates(Cluster.from_spec({"name": "one", "devices": [{"id": "x", "region": "r", "tflops": 1,
                                                                           "memory_gb": 1}],
                                               "network": {"regions": {"r": {"gbps": 1, "latency_ms": 1}}}}),
                            shaping.RateLimits(max_gbps=5e-8))
    # the fast end: a 2 ms burst past 32 bits failed in tc ("Command failed -:2"), taken for no namespaces
    shaping.check_rates(cluster, shaping.RateLimits(max_gbps=shaping.MAX_GBPS))
    with pytest.raises(EmulationError, match=r"^--max-gbps 20000 Gbit/s is above the 16000 Gbit/s the kernel's "
                                             r"shaper can enforce: lower it$"):
        shaping.check_rates(cluster, shaping.RateLimits(max_gbps=20000))


@pytest.mark.skipif(netns.unavailable_reason() is not None, reason="needs network namespaces")
def test_a_rate_too_slow_to_shape_is_an_error_not_a_fallback(cluster, tmp_path, monkeypatch, capsys):
    # tc refused it ('Command failed -:9'), and mode auto took that for namespaces being unavailable
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    with pytest.raises(EmulationError, match="the kernel's shaper can enforce: raise it"):
        EmulatedCluster(cluster, bandwidth_scale=1e-5, cpu_limits=False).setup()
    assert "falling back" not in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # refused before anything was made


def test_cpu_shares_follow_tflops_and_fit_the_cores():
    shares = cpu.cpu_shares([30, 30, 10], cores=2.0)
    assert sum(shares) == pytest.approx(2.0) and shares[0] / shares[2] == pytest.approx(3.0)
    assert cpu.period_us(0.5) == cpu.period_us(2.0) == 10_000  # short period for smooth throttling
    assert cpu.period_us(0.02) == 50_000  # long enough for the kernel's 1 ms minimum quota
    assert cpu.period_us(0.0005) == 1_000_000
    with pytest.raises(EmulationError):
        cpu.cpu_shares([1.0], cores=0)


def test_cpu_shares_below_the_smallest_quota_are_refused():
    # the kernel would give such a device 0.001 cores, not its share: its speed ratio to the others breaks
    cpu.check_shares(["a", "b"], [1.5, 0.001], cores=1.501)
    with pytest.raises(EmulationError, match=r"leave device b 0\.00047 cores, .* at least 3\.2 cores \(--cpus\)"):
        cpu.check_shares(["a", "b"], [1.49953, 0.00047], cores=1.5)  # 3.19 rounds up, not down


@pytest.mark.skipif(cpu.unavailable_reason() is not None, reason="needs cgroup v1 cpu quotas")
def test_emulate_refuses_quotas_the_kernel_would_round_up(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(SPEC))  # 30 : 30 : 10 TFLOP/s
    code, out, err = run_cli("emulate", "-c", spec, "--mode", "local", "--cpus", "0.002", "--", "true")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "device b-0 0.00029 cores" in err and "at least 0.007 cores (--cpus)" in err, err


@pytest.mark.skipif(cpu.unavailable_reason() is not None, reason="needs cgroup v1 cpu quotas")
def test_run_emulate_names_its_own_flags_in_the_fix(tmp_path, monkeypatch):
    # it named `emulate`'s --cpus and --no-cpu-limits, which `run` does not have
    from runtime_helpers import ASYMMETRIC, plan, spantrain_here, write_inputs

    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    cluster, model = write_inputs(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    code, out, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan",
                                    str(tmp_path / "plan.json"), "--steps", "1", "--emulate", "--emulate-cpus",
                                    "0.002", "--run-dir", str(tmp_path / "run"))
    errors = [x for x in err.splitlines() if "error" in x]
    assert code == 2 and out == "" and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].endswith("give the cluster at least 0.004 cores (--emulate-cpus)"), err
    with pytest.raises(EmulationError, match=r"raise it, or emulate without namespaces \(--emulate-mode local\)$"):
        shaping.check_rates(Cluster.from_file(cluster), shaping.RateLimits(scale=1e-9), RUN_OPTIONS)


@pytest.mark.skipif(cpu.unavailable_reason() is not None, reason="needs cgroup v1 cpu quotas")
def test_a_quota_above_the_machines_cores_gives_no_more_threads_than_it_has(cluster, tmp_path, monkeypatch):
    # --emulate-cpus 200 on 2 cores gave each worker 47 threads, and the run went 6x slower
    from spantrain.runtime.preflight import cpu_cores

    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with EmulatedCluster(cluster, mode="local", cpus=200.0) as emu:
        assert emu.cpu_limited and max(emu.shares) > cpu_cores()
        assert {emu.device_env(r)["OMP_NUM_THREADS"] for r in range(len(cluster))} == {str(cpu_cores())}
        # and they wait passively: spinning, 4 devices of 2 threads on 2 cores ran 35x slower
        assert {emu.device_env(r)["OMP_WAIT_POLICY"] for r in range(len(cluster))} == {"PASSIVE"}
        assert any(f"more than this machine's {cpu_cores()} cores" in line and f"--cpus {cpu_cores()} or less" in line
                   for line in emu.describe())


def test_interface_names_fit_linux_limit():
    names = RunNames("beef")
    assert len(names.hub_if(9999)) <= 15
    assert names.device_ns(3) == "spt-beef-3" and names.hub == "spt-beef-hub"


def test_fallback_without_root_runs_plain_processes(cluster, tmp_path, monkeypatch, capsys):
    # Pretend not to be root: the emulator must say so in one line and run local processes.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    code = ("import json, os; e = json.load(open(os.environ['SPANTRAIN_EMULATION'])); "
            "print(os.environ['RANK'], os.environ['WORLD_SIZE'], os.environ['MASTER_ADDR'], "
            "os.environ['SPANTRAIN_DEVICE_ID'], e['kernel_shaping'])")
    with EmulatedCluster(cluster) as emu:
        assert emu.mode == "local" and not emu.cpu_limited
        results = emu.run([sys.executable, "-c", code], echo=False)
    err = capsys.readouterr().err
    assert "network namespaces unavailable (not running as root)" in err
    assert [r.stdout.split() for r in results] == [[str(k), "3", "127.0.0.1", d.id, "False"]
                                                   for k, d in enumerate(cluster.devices)]
    assert not any((tmp_path / "state").iterdir())  # run directory removed


def test_description_of_one_device_is_singular(cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    with EmulatedCluster(cluster, devices=["b-0"], log=lambda line: None) as emu:
        assert ", 1 device, mode local" in emu.describe()[0]


def test_missing_cpu_quotas_are_reported_once(cluster, tmp_path, monkeypatch):
    # set-up said "no CPU quotas (not running as root)", then the description said it again
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    said: list[str] = []
    with EmulatedCluster(cluster, log=said.append) as emu:
        said += emu.describe()
    quotas = [line for line in said if "no CPU quotas" in line]
    assert len(quotas) == 1 and "not running as root" in quotas[0]


def test_another_users_sweep_leaves_roots_namespaces_alone(tmp_path, monkeypatch):
    # with a state directory per user, root's live runs are not registered where this user looks
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(netns, "list_namespaces", lambda: ["spt-beef-0", "spt-beef-hub"])
    assert state.sweep_leftovers() == []


def test_first_failure_stops_the_others_in_local_mode(cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    code = "import os, sys, time; r = int(os.environ['RANK']); time.sleep(0.2) if r == 1 else time.sleep(30); " \
           "sys.exit(3)"
    t0 = time.monotonic()
    with EmulatedCluster(cluster, mode="local", cpu_limits=False) as emu:
        results = emu.run([sys.executable, "-c", code], echo=False)
    assert time.monotonic() - t0 < 15
    assert results[1].returncode == 3 and not results[1].stopped
    assert all(r.stopped and r.returncode != 0 for k, r in enumerate(results) if k != 1)


def test_what_a_device_left_running_ends_with_it(cluster, tmp_path, monkeypatch):
    """A device's background processes (outside cgroups, nothing else would stop them) end when
    it does, failed or not; they held its output pipes open, which cost 5 s a pipe."""
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    pids = tmp_path / "pids"
    pids.mkdir()
    # every device starts its background process before rank 0 fails (the others are stopped then)
    script = (f"sleep 300 & echo $! > {pids}/$RANK.tmp && mv {pids}/$RANK.tmp {pids}/$RANK; "
              f"if [ $RANK = 0 ]; then while [ $(ls {pids} | grep -vc tmp) -lt {len(cluster)} ]; do sleep 0.05; "
              "done; exit 3; else sleep 30; fi")
    t0 = time.monotonic()
    with EmulatedCluster(cluster, mode="local", cpu_limits=False) as emu:
        results = emu.run(["sh", "-c", script], echo=False)
    assert time.monotonic() - t0 < 5
    assert results[0].returncode == 3 and all(r.stopped for r in results[1:])
    left = [int(p.read_text()) for p in pids.iterdir()]
    assert len(left) == len(results)
    deadline = time.monotonic() + 2  # SIGKILL is sent, not waited for
    while any(_running(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in left if _running(pid)], "a device's background process outlived it"


def test_a_reaped_device_is_signalled_no_more(monkeypatch):
    """Its group's id is free once it is reaped and nothing of it lives: a later process may hold
    it (SIGKILL at an ended device's group killed an unrelated process that had reused the id)."""
    from spantrain.runtime.emulator.launch import DeviceProcess

    device = DeviceProcess(rank=0, device_id="x", command=["true"], env=dict(os.environ), netns=None, cgroup=None,
                           echo=False, log_dir=None)
    assert device.result().returncode == 0
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    device.signal(signal.SIGKILL)
    assert device.poll() == 0 and sent == []


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_second_ctrl_c_while_devices_stop_kills_them(cluster, tmp_path, monkeypatch):
    # Devices that take their time over SIGINT (these ignore it); the user presses Ctrl-C again
    # during the grace. Outside namespaces and cgroups nothing else would ever stop them.
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    code = ("import os, signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "open(os.path.join(sys.argv[1], os.environ['RANK']), 'w').write(str(os.getpid())); time.sleep(30)")
    pids: list[int] = []

    def first_ctrl_c() -> bool:
        if len(pids) < len(cluster):
            pids[:] = [int(p.read_text()) for p in tmp_path.glob("[0-9]") if p.read_text()]
            return False
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()  # the second one
        raise KeyboardInterrupt

    t0 = time.monotonic()
    try:
        with EmulatedCluster(cluster, mode="local", cpu_limits=False) as emu, pytest.raises(KeyboardInterrupt):
            emu.run([sys.executable, "-c", code, str(tmp_path)], echo=False, stop_when=first_ctrl_c)
        deadline = time.monotonic() + 2  # SIGKILL is sent, not waited for: give the kernel a moment
        while (alive := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert alive == [] and time.monotonic() - t0 < 4.5, alive  # killed, without waiting out the 5 s grace


def test_ctrl_c_gives_devices_the_callers_grace_to_finish_their_iteration(cluster, tmp_path, monkeypatch):
    # `run --emulate`: a worker stops after its iteration and checkpoints; the emulator killed it
    # after 5 s, losing the iteration and the checkpoint, where a local run waits up to 120 s
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    code = ("import os, signal, sys, time\n"
            "done = []\n"
            "signal.signal(signal.SIGINT, lambda *a: done.append(1))\n"
            "open(os.path.join(sys.argv[1], 'up-' + os.environ['RANK']), 'w').close()\n"
            "while not done: time.sleep(0.05)\n"
            "time.sleep(6)  # the iteration in flight, longer than the emulator's own 5 s grace\n"
            "open(os.path.join(sys.argv[1], 'saved-' + os.environ['RANK']), 'w').close()\n")
    told = []

    def ctrl_c() -> bool:
        if len(list(tmp_path.glob("up-*"))) < len(cluster):
            return False
        raise KeyboardInterrupt

    with EmulatedCluster(cluster, mode="local", cpu_limits=False) as emu, pytest.raises(KeyboardInterrupt):
        emu.run([sys.executable, "-c", code, str(tmp_path)], echo=False, stop_when=ctrl_c, interrupt_grace_s=30,
                on_interrupt=lambda: told.append("stopping"))
    assert told == ["stopping"] and len(list(tmp_path.glob("saved-*"))) == len(cluster)


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_an_ignored_hangup_stays_ignored(cluster, tmp_path, monkeypatch):
    """`nohup spantrain run --emulate ... &`: closing the terminal must not stop the run."""
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with EmulatedCluster(cluster, mode="local", cpu_limits=False):
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))  # a plain `kill` still cleans up
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)


def test_cli_input_errors_are_one_line(run_cli, tmp_path):
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(SPEC))
    for args, needle in [((), "--cluster is required"),
                         (("-c", spec), "no command"),
                         (("-c", spec, "--bandwidth-scale", "x", "--", "true"), "--bandwidth-scale"),
                         # it ran nothing and exited 0, as if the command had run
                         (("--cleanup", "-c", spec, "--", "true"), "--cleanup only removes what crashed runs left"),
                         (("-c", tmp_path / "none.yaml", "--", "true"), "file not found"),
                         (("-c", spec, "--mode", "local", "--", "no-such-command-xyz"), "command not found"),
                         (("-c", spec, "--mode", "local", "--log-dir", spec / "logs", "--", "true"),
                          f"--log-dir {spec / 'logs'}: Not a directory"),
                         (("-c", spec, "--mode", "local", "--log-dir", spec, "--", "true"),
                          f"--log-dir {spec} is a file, not a directory"),
                         (("-c", spec, "--mode", "local", "--log-dir", "/proc/logs", "--", "true"),
                          "--log-dir /proc/logs: cannot write in '/proc' ("),
                         # the spec is read after --log-dir is checked: it was made, and left behind empty
                         (("-c", tmp_path / "none.yaml", "--log-dir", tmp_path / "new" / "logs", "--", "true"),
                          "file not found")]:
        code, out, err = run_cli("emulate", *args)
        assert code == 2 and out == "" and needle in err and len(err.strip().splitlines()) == 1, (args, err)
        assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def test_devices_that_all_failed_on_their_own_are_not_said_to_be_stopped():
    from spantrain.cli.emulate import _the_others
    from spantrain.runtime.emulator import DeviceResult

    def ended(*stopped: bool) -> list[DeviceResult]:
        return [DeviceResult(device_id=f"d{k}", rank=k, returncode=7, stdout="", stderr="", seconds=1.0, stopped=s)
                for k, s in enumerate(stopped)]

    # `sh -c 'exit 7'` everywhere: the same error ended every device; none was stopped
    results = ended(False, False, False)
    assert _the_others(results, results[0]) == "the other devices ended on their own"
    results = ended(False, True, True)
    assert _the_others(results, results[0]) == "the other devices were stopped"
    results = ended(False, False, True)
    assert _the_others(results, results[0]) == "1 of the other 2 was stopped"
    results = ended(False)
    assert _the_others(results, results[0]) == "it was the only device"
    # every device stopped (first_failure then takes one of them): it is not one of "the others";
    # this read "3 of the other 2 were stopped"
    results = ended(True, True, True)
    assert _the_others(results, results[1]) == "the other devices were stopped"
    results = ended(True, False, True)
    assert _the_others(results, results[0]) == "1 of the other 2 was stopped"


def test_a_timeout_exits_124_not_as_bad_input(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(SPEC))
    code, out, err = run_cli("emulate", "-c", spec, "--mode", "local", "--no-cpu-limits", "--quiet", "--timeout", "0.5",
                             "--", "sleep", "30")
    assert code == 124 and out == "" and err.strip().splitlines() == [
        "spantrain emulate: the command was still running after 0.5 s; stopped every device"], err


@pytest.mark.parametrize("flag", ["--cpus", "--max-gbps", "--bandwidth-scale", "--timeout"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_non_finite_numbers_are_one_line_errors(run_cli, tmp_path, monkeypatch, flag, value):
    # argparse's float() takes both; nan passed `<= 0` checks and inf overflowed tc's integer rates
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(SPEC))
    code, out, err = run_cli("emulate", "-c", spec, "--mode", "local", flag, value, "--", "true")
    assert code == 2 and out == "" and err.strip().splitlines() == [
        f"spantrain emulate: error: {flag} must be a finite number > 0, got {value}"], err
    with pytest.raises(EmulationError, match="finite"):
        EmulatedCluster(Cluster.from_spec(SPEC), cpus=float(value))  # `profile --cluster C --cpus nan`


def test_a_closed_output_stops_the_echo_not_the_draining():
    # `spantrain emulate ... | head -1`: the relay thread died on BrokenPipeError with a traceback,
    # the device filled its pipe and blocked, and the command hung
    import io

    from spantrain.runtime.emulator.launch import _Pump

    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    log = io.StringIO()
    pump = _Pump(io.BytesIO(b"".join(b"%d\n" % k for k in range(5000))), "[a-0] ", Closed(), log)
    pump.run()  # returns: read to the end
    assert pump.echo is None and list(pump.lines)[-1] == "4999\n" and log.getvalue().count("\n") == 5000


def test_how_a_device_ended_is_said_in_words_for_any_signal():
    from spantrain.runtime.emulator.launch import describe_exit

    assert describe_exit(3) == "exited with code 3" and describe_exit(None) == "is still running"
    assert describe_exit(-9) == "was killed by SIGKILL"
    assert describe_exit(-40) == "was killed by signal 40"  # a real-time signal: `emulate` raised ValueError


def test_devices_stop_when_the_emulator_is_killed(tmp_path):
    # kill -9 on `spantrain emulate` left its devices running (ranks trained on into the checkpoint
    # directory) until the next start swept them up
    import subprocess

    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(SPEC))
    env = {**os.environ, "SPANTRAIN_EMULATOR_DIR": str(tmp_path / "state")}
    launcher = subprocess.Popen([sys.executable, "-m", "spantrain", "emulate", "-c", str(spec), "--mode", "local",
                                 "--no-cpu-limits", "--quiet", "--", "sleep", "120"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        devices: list[int] = []
        deadline = time.monotonic() + 60
        while len(devices) < len(Cluster.from_spec(SPEC)) and time.monotonic() < deadline:
            time.sleep(0.2)
            devices = [pid for pid in _children(launcher.pid) if _command(pid).startswith("sleep")]
        assert devices, "the devices did not start"
        launcher.kill()
        launcher.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in devices) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(pid) for pid in devices)
    finally:
        launcher.kill()
        for pid in devices:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry.name))
    return out


def _command(pid: int) -> str:
    with contextlib.suppress(OSError):
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return ""


def _alive(pid: int) -> bool:
    """Running and not a zombie (a reaped-later child of init counts as gone)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_device_logs_stay_in_the_log_directory_whatever_the_ids(run_cli, tmp_path):
    # an id "../../escape" wrote escape.log two directories above --log-dir; "a/b" failed: no directory a
    spec = {"name": "odd", "devices": [{"id": "../../escape", "region": "r", "tflops": 1, "memory_gb": 1},
                                       {"id": "a/b%", "region": "r", "tflops": 1, "memory_gb": 1}],
            "network": {"regions": {"r": {"gbps": 1, "latency_ms": 1}}}}
    (tmp_path / "odd.json").write_text(json.dumps(spec))
    logs = tmp_path / "x" / "y" / "logs"
    code, _, err = run_cli("emulate", "-c", tmp_path / "odd.json", "--mode", "local", "--no-cpu-limits", "--log-dir",
                           logs, "--", sys.executable, "-c", "print('hello')")
    assert code == 0, err
    assert sorted(p.name for p in logs.iterdir()) == ["..%2F..%2Fescape.log", "a%2Fb%25.log"]
    assert all("hello" in p.read_text() for p in logs.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["odd.json", "x"]


def test_a_device_id_with_a_hash_gets_a_whole_host_name():
    # /etc/hosts reads the rest of a line after '#' as a comment: `emu-a#1` resolved as `emu-a`
    from spantrain.runtime.emulator.cluster import _host_name

    assert _host_name("a#1") == "emu-a%231" and _host_name("5%#") == "emu-5%25%23"
    assert _host_name("gpu-0") == "emu-gpu-0"


def test_cleanup_names_a_killed_probes_namespace_as_such(run_cli, monkeypatch):
    # "removed 1 leftover run(s): spt-probe-6989": a probe is no run
    from spantrain.runtime.emulator import state

    monkeypatch.setattr(state, "sweep_leftovers", lambda: ["ab12", "spt-probe-6989"])
    code, out, err = run_cli("emulate", "--cleanup")
    assert code == 0 and out == "" and err.strip() == (
        "spantrain emulate: removed 1 leftover run(s): ab12, and 1 namespace(s) of killed availability probes: "
        "spt-probe-6989")


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_stop_during_the_teardown_ends_emulate_as_one_during_the_run(tmp_path, sig):
    # SIGTERM held through the teardown was delivered after the run's handlers were gone: the
    # process ended by the signal (exit 143) with no word
    import subprocess

    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(SPEC))
    script = ("import os, signal, sys\n"
              "from spantrain.runtime.emulator import state\n"
              "real = state.teardown\n"
              "def teardown(names):\n"
              f"    os.kill(os.getpid(), signal.{sig})\n"
              "    return real(names)\n"
              "state.teardown = teardown\n"
              "from spantrain.__main__ import run\n"
              f"sys.argv[1:] = ['emulate', '-c', {str(spec)!r}, '--mode', 'local', '--quiet', '--', 'true']\n"
              "raise SystemExit(run())\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    said = "spantrain emulate: interrupted" + (" by SIGTERM" if sig == "SIGTERM" else "")
    assert result.returncode == 130 and result.stderr.strip().splitlines()[-1] == said, result.stderr
