"""The profiler recovers an emulated cluster (root only): 6 devices in 3 regions, every
pair's bandwidth within 15 % and latency within 25 % of what the emulator enforces, the
regions as network groups, and a spec a run can map to processes. Also the fallback:
local processes whose network exists only in the transport. (The 60 s target is a timing,
not a test: the README times `spantrain profile` on the calibration cluster.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from spantrain.cluster import GBPS, Cluster
from spantrain.runtime.emulator import netns

_REASON = netns.unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.slow,
              pytest.mark.skipif(_REASON is not None, reason=f"needs root, ip netns and tc htb: {_REASON}")]

# Latencies of 3 ms and up: the transport's own software latency (a gloo round trip between
# processes and the emulator's sleeps, 0.1-0.4 ms one way here, more on a busy machine) adds
# to whatever the spec says, so a sub-millisecond link cannot be measured within 25 % of its
# spec, and a 2 ms one only just (one CI run measured 2.64 ms; README, profiler section).
SIX = {
    "name": "six",
    "devices": [{"id": "fast", "count": 3, "region": "r1", "tflops": 30, "memory_gb": 16},
                {"id": "mid", "count": 2, "region": "r2", "tflops": 20, "memory_gb": 8},
                {"id": "slow-0", "region": "r3", "tflops": 10, "memory_gb": 4}],
    "network": {"regions": {"r1": {"gbps": 0.2, "latency_ms": 4}, "r2": {"gbps": 0.1, "latency_ms": 3},
                            "r3": {"gbps": 0.05, "latency_ms": 0.5}},
                "links": [{"between": ["r1", "r2"], "gbps": 0.05, "latency_ms": 10},
                          {"between": ["r1", "r3"], "gbps": 0.02, "latency_ms": 25}],
                "default": {"gbps": 0.01, "latency_ms": 40}},
}


def _check_pairs(doc: dict, spec: Cluster, *, bw_tol: float, lat_tol: float) -> None:
    """Every directed pair against the spec (all its rates are below the emulator's 1 Gbit/s cap)."""
    assert len(doc["pairs"]) == len(spec) * (len(spec) - 1)
    bad = []
    for p in doc["pairs"]:
        i, j = spec.index(p["a"]), spec.index(p["b"])
        gbps, ms = spec.bandwidth[i, j] / GBPS, (spec.latency[i, j] + spec.latency[j, i]) / 2 * 1e3
        if abs(p["gbps"] / gbps - 1) > bw_tol or abs(p["latency_ms"] / ms - 1) > lat_tol:
            bad.append(f"{p['a']}->{p['b']}: {p['gbps'] * 1e3:.1f} Mbit/s (spec {gbps * 1e3:.1f}), "
                       f"{p['latency_ms']:.2f} ms (spec {ms:.2f})")
    assert not bad, bad


def test_six_device_profile_recovers_the_emulated_cluster(tmp_path):
    spec_path, out = tmp_path / "six.json", tmp_path / "profiled.yaml"
    spec_path.write_text(json.dumps(SIX))
    # 25 s, not the default 60: alone the pairs come out within 2.5 % of the spec at 20 s too, but in
    # a full suite run one pair came out 19 % slow there; the suite's time is short
    proc = subprocess.run([sys.executable, "-m", "spantrain", "profile", "--cluster", str(spec_path), "--json",
                           "--budget-s", "25", "-o", str(out)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # stdout holds exactly the JSON object
    assert set(doc) == {"devices", "pairs", "groups"}
    spec = Cluster.from_spec(SIX)
    _check_pairs(doc, spec, bw_tol=0.15, lat_tol=0.25)
    assert [g["devices"] for g in doc["groups"]] == [["fast-0", "fast-1", "fast-2"], ["mid-0", "mid-1"], ["slow-0"]]

    profiled = Cluster.from_file(out)
    assert profiled.ids == spec.ids
    assert [(d.host, d.local_rank) for d in profiled.devices] == [(f"emu-{i}", 0) for i in spec.ids]
    assert all(len(d.layer_times["tiny-gpt"].forward_s) == 8 for d in profiled.devices)
    # The region LANs and links are the medians of what was measured, close to the spec's.
    assert profiled.network.between("net-0", "net-1").gbps == pytest.approx(0.05, rel=0.15)
    assert profiled.network.regions["net-1"].latency_ms == pytest.approx(3, rel=0.25)
    # CPU quotas follow TFLOP/s 3:2:1; contention with other work on the cores blurs the ratio.
    tflops = np.array([d.tflops for d in profiled.devices])
    assert tflops[:3].min() > tflops[3:5].max() and tflops[3:5].min() > tflops[5]


def test_fallback_profile_sees_the_network_the_transport_emulates(tmp_path):
    spec = {"name": "three", "devices": [{"id": "a", "count": 2, "region": "ra", "tflops": 10, "memory_gb": 4},
                                         {"id": "b-0", "region": "rb", "tflops": 10, "memory_gb": 4}],
            "network": {"regions": {"ra": {"gbps": 0.1, "latency_ms": 3}, "rb": {"gbps": 0.1, "latency_ms": 3}},
                        "links": [{"between": ["ra", "rb"], "gbps": 0.02, "latency_ms": 15}]}}
    spec_path, out = tmp_path / "three.json", tmp_path / "profiled.json"
    spec_path.write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, "-m", "spantrain", "emulate", "-c", str(spec_path), "--mode", "local",
                           "--", sys.executable, "-m", "spantrain", "profile", "--budget-s", "12", "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    profiled = Cluster.from_file(out)
    measured = {"devices": [], "pairs": [
        {"a": a.id, "b": b.id, "gbps": profiled.bandwidth[i, j] / GBPS, "latency_ms": profiled.latency[i, j] * 1e3}
        for i, a in enumerate(profiled.devices) for j, b in enumerate(profiled.devices) if i != j]}
    _check_pairs(measured, Cluster.from_spec(spec), bw_tol=0.15, lat_tol=0.25)
