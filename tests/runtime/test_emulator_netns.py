"""The emulator on real namespaces, htb and cgroups (root only): shaping is measured,
CPU quotas slow a loop in proportion, and nothing is left behind after success, failure,
a killed child, SIGTERM, or a crash of the emulator itself."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from runtime_helpers import default_stop_signals

from spantrain.cluster import Cluster
from spantrain.errors import EmulationError
from spantrain.runtime.emulator import EmulatedCluster, netns
from spantrain.runtime.emulator.cpu import CGROUP_CPU

_REASON = netns.unavailable_reason()
pytestmark = [pytest.mark.netns,
              pytest.mark.skipif(_REASON is not None, reason=f"needs root, ip netns and tc htb: {_REASON}")]

SHAPED = {
    "name": "shaped",
    "devices": [{"id": "a", "count": 2, "region": "ra", "tflops": 10, "memory_gb": 4},
                {"id": "b-0", "region": "rb", "tflops": 10, "memory_gb": 4}],
    "network": {"regions": {"ra": {"gbps": 0.08, "latency_ms": 1}, "rb": {"gbps": 0.05, "latency_ms": 1}},
                "links": [{"between": ["ra", "rb"], "gbps": 0.008, "latency_ms": 10}],
                "overrides": [{"from": "b-0", "to": "a-0", "gbps": 0.004, "latency_ms": 10}]},
}

# Each device receives on its ports and sends to its targets for SECONDS; a receiver's rate
# is payload bytes from the first byte to the sender's close.
FLOWS = """
import json, os, socket, sys, threading, time
SECONDS = 2.0
rank = int(os.environ["RANK"])
addr = {d["rank"]: d["address"] for d in json.load(open(os.environ["SPANTRAIN_EMULATION"]))["devices"]}
receive = {0: [(5001, 1), (5002, 2)], 1: [], 2: [(5003, 0)]}[rank]
send = {0: [(2, 5003)], 1: [(0, 5001)], 2: [(0, 5002)]}[rank]
rates = {}
def serve(port, src):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(1)
    c, _ = s.accept(); n = 0; t0 = None
    while True:
        b = c.recv(1 << 16)
        if not b: break
        t0 = t0 or time.perf_counter(); n += len(b)
    rates[src] = n * 8 / (time.perf_counter() - t0) / 1e6
def push(dst, port):
    for _ in range(200):
        try:
            c = socket.create_connection((addr[dst], port)); break
        except OSError:
            time.sleep(0.05)
    buf = b"x" * 65536; t0 = time.perf_counter()
    while time.perf_counter() - t0 < SECONDS:
        c.sendall(buf)
    c.close()
threads = [threading.Thread(target=serve, args=r) for r in receive]
threads += [threading.Thread(target=push, args=s) for s in send]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(rates))
"""


def _leftovers(run_id: str) -> list[str]:
    """Everything of run `run_id` still on the machine."""
    found = [ns for ns in netns.list_namespaces() if ns.startswith(f"spt-{run_id}-")]
    found += [str(p) for p in CGROUP_CPU.glob(f"spt-{run_id}*")]
    found += [str(p) for p in netns.NETNS_ETC.glob(f"spt-{run_id}-*")] if netns.NETNS_ETC.is_dir() else []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [line for line in links.splitlines() if f"spt{run_id}" in line]
    return found


def _run_id(stderr: str) -> str:
    m = re.search(r"emulator: run ([0-9a-f]{4})", stderr)
    assert m, stderr
    return m.group(1)


def _emulate(spec: Path, code: str, *extra: str, **kw) -> subprocess.Popen:
    kw.setdefault("preexec_fn", default_stop_signals)
    return subprocess.Popen([sys.executable, "-m", "spantrain", "emulate", "-c", str(spec), *extra, "--",
                             sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


@pytest.fixture
def spec(tmp_path) -> Path:
    path = tmp_path / "shaped.json"
    path.write_text(json.dumps(SHAPED))
    return path


@pytest.mark.slow
def test_links_are_shaped_to_the_spec_and_everything_is_removed():
    cluster = Cluster.from_spec(SHAPED)
    with EmulatedCluster(cluster) as emu:
        run_id = emu.emulation.run_id
        assert emu.mode == "netns" and _leftovers(run_id)
        results = emu.run([sys.executable, "-c", FLOWS], echo=False, timeout_s=60)
    assert all(r.ok for r in results), [r.stderr for r in results]
    got = {0: json.loads(results[0].stdout), 2: json.loads(results[2].stdout)}
    measured = {"a-1 -> a-0 (region LAN)": (got[0]["1"], 80.0),
                "b-0 -> a-0 (device-pair override)": (got[0]["2"], 4.0),
                "a-0 -> b-0 (between regions)": (got[2]["0"], 8.0)}
    for flow, (mbps, target) in measured.items():
        assert abs(mbps / target - 1) < 0.15, f"{flow}: {mbps:.2f} Mbit/s, spec {target} Mbit/s"
    assert _leftovers(run_id) == []


# Rank 1 sends to rank 0 for two seconds (as the shaping test does: slow start and timer slack fade),
# says so, waits for the go, sends for two more; rank 0 prints the Mbit/s of each of the two transfers.
TWO_PHASES = """
import json, os, socket, sys, time
from pathlib import Path
rank, here = int(os.environ["RANK"]), Path(sys.argv[1])
addr = json.load(open(os.environ["SPANTRAIN_EMULATION"]))["devices"][0]["address"]
if rank == 0:
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5001)); s.listen(2); rates = []
    for _ in range(2):
        c, _ = s.accept(); n = 0; t0 = None
        while True:
            b = c.recv(1 << 16)
            if not b: break
            t0 = t0 or time.perf_counter(); n += len(b)
        rates.append(n * 8 / (time.perf_counter() - t0) / 1e6)
    print(json.dumps(rates))
else:
    for phase in range(2):
        while phase and not (here / "go").exists(): time.sleep(0.01)
        for _ in range(200):
            try:
                c = socket.create_connection((addr, 5001)); break
            except OSError:
                time.sleep(0.05)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2.0: c.sendall(b"x" * 65536)
        c.close()
        (here / "sent").touch()
"""


@pytest.mark.slow
def test_reshape_changes_the_rates_of_a_live_run(tmp_path):
    spec = {"name": "two", "devices": [{"id": "a-0", "region": "ra", "tflops": 10, "memory_gb": 4},
                                       {"id": "b-0", "region": "rb", "tflops": 10, "memory_gb": 4}],
            "network": {"regions": {"ra": {"gbps": 1, "latency_ms": 0}, "rb": {"gbps": 1, "latency_ms": 0}},
                        "default": {"gbps": 0.04, "latency_ms": 0}}}
    slower = json.loads(json.dumps(spec))
    slower["network"]["default"]["gbps"] = 0.008
    tmp_path.chmod(0o777)

    def between_phases() -> bool:
        if (tmp_path / "sent").exists() and not (tmp_path / "go").exists():
            assert emu.reshape(Cluster.from_spec(slower)) is True
            (tmp_path / "go").touch()
        return False

    with EmulatedCluster(Cluster.from_spec(spec)) as emu:
        results = emu.run([sys.executable, "-c", TWO_PHASES, str(tmp_path)], echo=False, timeout_s=60,
                          stop_when=between_phases)
        with pytest.raises(EmulationError, match="no device b-0"):
            emu.reshape(Cluster.from_spec({**spec, "devices": spec["devices"][:1]}))
        # a rate tc cannot shape: refused before any shaper goes (device 0 was left half-shaped, its
        # link at the 1 Gbit/s default where the file asked for a crawl)
        shaped = [subprocess.run(["tc", "-n", emu.names.device_ns(k), "class", "show", "dev", "spt0"],
                                 capture_output=True, text=True, check=True).stdout for k in range(2)]
        crawl = json.loads(json.dumps(spec))
        crawl["network"]["default"]["gbps"] = 5e-8
        with pytest.raises(EmulationError, match="below the 1e-07 Gbit/s"):
            emu.reshape(Cluster.from_spec(crawl))
        assert shaped == [subprocess.run(["tc", "-n", emu.names.device_ns(k), "class", "show", "dev", "spt0"],
                                         capture_output=True, text=True, check=True).stdout for k in range(2)]
    assert all(r.ok for r in results), [r.stderr for r in results]
    before, after = json.loads(results[0].stdout)
    # 25 %: a slow phase of this machine read 33.3 Mbit/s of the 40 (no code change); 5x apart all the same
    assert abs(before / 40 - 1) < 0.25 and abs(after / 8 - 1) < 0.25, f"{before:.1f} then {after:.1f} Mbit/s"


def test_cpu_quota_slows_a_loop_in_proportion(tmp_path):
    spec = {"name": "cpu", "devices": [{"id": "fast-0", "region": "r", "tflops": 3, "memory_gb": 1},
                                       {"id": "slow-0", "region": "r", "tflops": 1, "memory_gb": 1}],
            "network": {"regions": {"r": {"gbps": 1, "latency_ms": 0}}}}
    loop = ("import time; c0, t0 = time.process_time(), time.perf_counter(); x = 0\n"
            "while time.process_time() - c0 < 0.4: x += 1\n"
            "print((time.perf_counter() - t0) / (time.process_time() - c0))")
    # 0.6 cores shared 3:1 -> quotas of 0.45 and 0.15 cores: a CPU second takes 2.2 and 6.7 s.
    # (Small quotas, so that the devices get them even while other work keeps the cores busy.)
    with EmulatedCluster(Cluster.from_spec(spec), cpus=0.6) as emu:
        assert emu.shares == pytest.approx([0.45, 0.15])
        results = emu.run([sys.executable, "-c", loop], echo=False, timeout_s=60)
    fast, slow = (float(r.stdout) for r in results)
    assert 0.8 * 1 / 0.15 < slow < 1.25 / 0.15, f"0.15 cores: {slow:.2f} wall seconds per CPU second"
    assert 2.25 < slow / fast < 3.75, f"slow-down ratio {slow / fast:.2f}, quotas say 3"


def test_failed_command_stops_the_others_and_cleans_up(spec):
    code = "import os, sys, time; time.sleep(0.5) if os.environ['RANK'] == '1' else time.sleep(60); sys.exit(3)"
    t0 = time.monotonic()
    proc = _emulate(spec, code)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert time.monotonic() - t0 < 20
    assert "device a-1 (rank 1) exited with code 3; the other devices were stopped" in err
    assert _leftovers(_run_id(err)) == []


def test_killed_child_stops_the_others_and_cleans_up(spec):
    code = ("import os, signal, time\n"
            "if os.environ['RANK'] == '2': time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)\n"
            "time.sleep(60)")
    proc = _emulate(spec, code)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "device b-0 (rank 2) was killed by SIGKILL" in err
    assert _leftovers(_run_id(err)) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupting_the_emulator_cleans_up(spec, sig):
    code = "import time; print('up', flush=True); time.sleep(60)"
    proc = _emulate(spec, code)
    assert "up" in proc.stdout.readline()  # devices are running
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert _leftovers(_run_id(err)) == []


def test_leftovers_of_a_crashed_emulator_are_removed_at_the_next_start(spec):
    code = "import time; print('up', flush=True); time.sleep(60)"
    proc = _emulate(spec, code)
    assert "up" in proc.stdout.readline()
    proc.kill()  # no chance to clean up: namespaces, cgroups and device processes stay
    proc.wait()
    err = proc.stderr.read()
    run_id = _run_id(err)
    assert _leftovers(run_id), "a SIGKILLed emulator should leave its run behind"
    sweep = subprocess.run([sys.executable, "-m", "spantrain", "emulate", "--cleanup"], capture_output=True,
                           text=True, timeout=60)
    assert sweep.returncode == 0 and run_id in sweep.stderr
    assert _leftovers(run_id) == []


def test_the_sweep_removes_an_availability_probe_whose_process_is_gone():
    import os

    from spantrain.runtime.emulator.state import sweep_leftovers

    dead = 4_000_000  # a pid nothing runs as (checked)
    while Path(f"/proc/{dead}").exists():
        dead += 1
    orphan, mine = f"{netns.PROBE_PREFIX}{dead}", f"{netns.PROBE_PREFIX}{os.getpid()}"
    for ns in (orphan, mine):
        subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        # a probe killed between its add and its delete stayed for good: the sweep's pattern is a run's
        assert orphan in sweep_leftovers()
        assert orphan not in netns.list_namespaces() and mine in netns.list_namespaces()  # a live one is kept
    finally:
        for ns in (orphan, mine):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
