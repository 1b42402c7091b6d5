"""Profiler parts that need no root: the round schedule, grouping, assembly into a spec,
compute timing, the single-device profile and the CLI's input errors."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from spantrain.cluster import GBPS, Cluster, LayerTimes
from spantrain.profiler import compute
from spantrain.profiler.assemble import DeviceMeasurement, assemble
from spantrain.profiler.grouping import compute_groups, network_groups
from spantrain.profiler.network import PairMeasurement, round_robin
from spantrain.workload import Workload

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n", range(2, 10))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    met = [pair for r in rounds for pair in r]
    assert sorted(met) == list(itertools.combinations(range(n), 2))
    for r in rounds:
        busy = [x for pair in r for x in pair]
        assert len(busy) == len(set(busy)), r


def _bandwidth(regions: list[int], lan: dict[int, float], wan: float, noise: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = len(regions)
    bw = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            bw[i, j] = (lan[regions[i]] if regions[i] == regions[j] else wan) * GBPS * rng.uniform(1 - noise, 1 + noise)
    return bw


def test_network_groups_recover_regions_despite_noise():
    regions = [0, 0, 0, 1, 1, 2]
    labels = network_groups(_bandwidth(regions, {0: 0.2, 1: 0.1, 2: 0.05}, wan=0.02, noise=0.1))
    assert labels == regions


def test_equally_fast_lans_that_are_slow_between_them_are_two_groups():
    regions = [0, 0, 1, 1]
    assert network_groups(_bandwidth(regions, {0: 1.0, 1: 1.0}, wan=0.05, noise=0.05)) == regions
    # ... and a uniform network is one group
    assert network_groups(_bandwidth(regions, {0: 1.0, 1: 1.0}, wan=1.0, noise=0.05)) == [0, 0, 0, 0]


def test_compute_groups_split_by_speed():
    assert compute_groups(np.array([10.0, 11.0, 30.0, 9.5, 31.0]), [0, 1, 2, 3, 4]) == [[0, 1, 3], [2, 4]]


def _device(rank: int, tflops: float) -> DeviceMeasurement:
    return DeviceMeasurement(rank=rank, id=f"d{rank}", host=f"h{rank}", local_rank=0, gpu="cpu", tflops=tflops,
                             memory_gb=4.0, model="tiny-gpt",
                             layer_times=LayerTimes(batch=2, forward_s=(0.001, 0.002), backward_s=(0.002, 0.004)))


def test_assemble_builds_regions_links_and_overrides():
    regions = [0, 0, 0, 1]
    lan, wan = 0.2 * GBPS, 0.02 * GBPS
    pairs = []
    for a, b in itertools.combinations(range(4), 2):
        same = regions[a] == regions[b]
        bw = lan if same else wan
        pairs.append(PairMeasurement(a=a, b=b, latency_s=0.002 if same else 0.02, a_to_b=bw, b_to_a=bw))
    # one pair is slow in one direction only: a directional override
    pairs[0] = PairMeasurement(a=0, b=1, latency_s=0.002, a_to_b=0.1 * GBPS, b_to_a=lan)
    profile = assemble([_device(k, 0.01) for k in range(4)], pairs, name="measured")
    c = profile.cluster
    assert c.regions == ["net-0", "net-1"]
    assert c.network.regions["net-0"].gbps == pytest.approx(0.2)
    assert c.network.links[("net-0", "net-1")].gbps == pytest.approx(0.02)
    assert c.network.links[("net-0", "net-1")].latency_ms == pytest.approx(20)
    assert c.bandwidth[0, 1] == pytest.approx(0.1 * GBPS) and c.bandwidth[1, 0] == pytest.approx(lan)
    spec = c.to_spec()
    assert spec["network"]["overrides"] == [{"from": "d0", "to": "d1", "gbps": 0.1, "latency_ms": 2}]
    assert Cluster.from_spec(spec) == c
    assert c.devices[2].host == "h2" and c.devices[2].local_rank == 0
    assert c.devices[0].layer_times["tiny-gpt"].forward_s == (0.001, 0.002)
    doc = profile.document
    assert set(doc) == {"devices", "pairs", "groups"}
    assert len(doc["pairs"]) == 12 and set(doc["pairs"][0]) == {"a", "b", "gbps", "latency_ms"}
    assert [g["devices"] for g in doc["groups"]] == [["d0", "d1", "d2"], ["d3"]]


def test_a_layer_too_large_to_hold_is_refused_before_torch_tries():
    from spantrain.errors import WorkloadError

    arch = {"family": "gpt2", "vocab_size": 256, "d_model": 1024, "n_layers": 2, "n_heads": 2, "d_ff": 2**24,
            "max_seq_len": 32}  # 34 billion parameters a block
    w = Workload.from_spec({"name": "huge-mlp", "global_batch": 8, "seq_len": 32, "architecture": arch}, "w")
    # torch's allocator failed with a traceback asking for terabytes
    with pytest.raises(WorkloadError, match=r"^layer 1 of huge-mlp has [\d,]+ parameters \([\d,.]+ GB with their "
                                            r"gradients\), more than this device has free"):
        compute.measure_compute(w, micro_batch=2, budget_s=1.0)


def test_an_emulated_profile_of_layers_too_large_is_refused_before_the_emulator_starts(run_cli, tmp_path):
    # it printed the emulator's banner, then the same error from every device and from the command
    import json

    arch = {"family": "gpt2", "vocab_size": 256, "d_model": 1024, "n_layers": 2, "n_heads": 2, "d_ff": 2**24,
            "max_seq_len": 32}
    (tmp_path / "huge.json").write_text(json.dumps({"name": "huge-mlp", "global_batch": 8, "seq_len": 32,
                                                    "architecture": arch}))
    spec = {"name": "two", "devices": [{"id": "a", "count": 2, "region": "r", "tflops": 1, "memory_gb": 8}],
            "network": {"regions": {"r": {"gbps": 1, "latency_ms": 1}}}}
    (tmp_path / "two.json").write_text(json.dumps(spec))
    code, out, err = run_cli("profile", "--cluster", tmp_path / "two.json", "--model", tmp_path / "huge.json")
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith("spantrain profile: error: layer 1 of huge-mlp has "), err


def test_compute_times_every_layer_of_the_workload(monkeypatch):
    # the 50 ms matmul probe only sizes the proxy; descheduled on a loaded machine it read under
    # 1 GFLOP/s and shrank the proxy batch this test expects (a full `make test` beside other jobs)
    monkeypatch.setattr(compute, "_probe_flops_per_s", lambda torch, device, dtype: 1e10)
    w = Workload.from_preset("tiny-gpt")
    cp = compute.measure_compute(w, micro_batch=2, budget_s=1.0)
    lt = cp.layer_times
    assert lt.batch == 2 and len(lt.forward_s) == len(lt.backward_s) == w.num_layers
    assert all(t > 0 for t in lt.forward_s + lt.backward_s)
    assert len(set(lt.forward_s[1:-1])) == 1  # one block timed, listed for every block
    assert (cp.proxy_batch, cp.proxy_seq_len) == (2, w.seq_len) and cp.reps >= 3
    total = sum(sum(compute.layer_flops(w, i, 2)) for i in range(w.num_layers))
    assert cp.tflops == pytest.approx(total / (sum(lt.forward_s) + sum(lt.backward_s)) / 1e12)


def test_big_models_are_timed_on_a_proxy_with_the_same_token_shapes():
    w = Workload.from_preset("gpt2-xl")
    # at 10 GFLOP/s one full-size pass takes minutes: fewer tokens, batch first
    batch, seq = compute._choose_shape(w, micro_batch=8, rate=1e10, budget_s=2.0)
    assert batch == 1 and 16 <= seq < w.seq_len
    assert compute._choose_shape(w, micro_batch=8, rate=1e18, budget_s=2.0) == (8, w.seq_len)


@pytest.mark.slow
def test_single_device_profile_without_a_launcher(tmp_path):
    out = tmp_path / "me.yaml"
    env_keys = ("RANK", "WORLD_SIZE", "SPANTRAIN_EMULATION")
    env = {k: v for k, v in __import__("os").environ.items() if k not in env_keys}
    proc = subprocess.run([sys.executable, "-m", "spantrain", "profile", "--budget-s", "10", "--json", "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert set(doc) == {"devices", "pairs", "groups"} and doc["pairs"] == []
    (dev,) = doc["devices"]
    assert dev["tflops"] > 0 and dev["memory_gb"] > 0 and dev["local_rank"] == 0
    c = Cluster.from_file(out)
    assert len(c) == 1 and len(c.devices[0].layer_times["tiny-gpt"].forward_s) == 8


_SEES = """
import os, sys
from spantrain.profiler import runner
def seen(*args, **kwargs):
    print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules)
runner.profile_rank = seen
from spantrain.cli import main
main(["profile", "--budget-s", "5"])
"""


def test_the_profile_computes_with_passive_openmp_threads_as_the_runtime_does():
    # set before torch loads OpenMP (which reads it once); a spinning pool measured a busy CPU 17-38x slow
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("RANK", "WORLD_SIZE", "OMP_WAIT_POLICY")}
    proc = subprocess.run([sys.executable, "-c", _SEES], capture_output=True, text=True, timeout=120, env=env)
    assert proc.stdout.split() == ["PASSIVE", "False"], proc.stdout + proc.stderr
    proc = subprocess.run([sys.executable, "-c", _SEES], capture_output=True, text=True, timeout=120,
                          env={**env, "OMP_WAIT_POLICY": "ACTIVE"})  # the user's choice stands
    assert proc.stdout.split() == ["ACTIVE", "False"], proc.stdout + proc.stderr


def test_cli_input_errors_are_one_line(run_cli):
    for args, needle in [(("--budget-s", "nan"), "--budget-s must be a number of seconds in (0, 86400], got nan"),
                         (("--budget-s", "inf"), "--budget-s must be a number of seconds in (0, 86400], got inf"),
                         (("--budget-s", "0"), "--budget-s must be a number of seconds in (0, 86400], got 0"),
                         (("--model", "nosuch"), "unknown model"),
                         (("--cpus", "2"), "--cpus only applies with --cluster"),
                         (("--cluster", "nosuch.json", "--cpus", "nan"), "--cpus must be a finite number > 0, got nan"),
                         (("--micro-batch", "-1"), "--micro-batch")]:
        code, out, err = run_cli("profile", *args)
        assert code == 2 and needle in err and out == "", (args, err)
        assert len(err.strip().splitlines()) == 1


def test_an_output_path_that_cannot_be_written_is_refused_before_profiling(run_cli, tmp_path):
    (tmp_path / "file").write_text("")
    for output, needle in [(tmp_path / "file" / "p.yaml", f"'{tmp_path / 'file'}' is not a directory"),
                           (tmp_path / "missing" / "p.yaml", f"'{tmp_path / 'missing'}' does not exist"),
                           ("/proc/p.yaml", "cannot create a file in '/proc' ("),
                           (tmp_path, "is a directory; give a file name")]:
        code, out, err = run_cli("profile", "--budget-s", "3", "-o", output)
        # one line, and no measurement before it (the whole budget was spent before the write failed)
        lines = err.strip().splitlines()
        assert code == 2 and out == "" and len(lines) == 1, err
        assert lines[0].startswith(f"spantrain profile: error: -o {output}: {needle}"), err


def test_a_workload_without_architecture_is_refused_in_one_line(run_cli, tmp_path):
    w = tmp_path / "layers.yaml"
    w.write_text("name: flat\nglobal_batch: 8\nseq_len: 16\nlayers:\n  - {name: l, count: 2, "
                 "forward_flops: 1000000, params: 10, boundary_bytes: 64, activation_bytes: 64}\n")
    code, out, err = run_cli("profile", "--model", str(w), "--budget-s", "5")
    assert code == 2 and out == "" and "has no architecture" in err and len(err.strip().splitlines()) == 1


_THREE = {"name": "three",
          "devices": [{"id": "a", "count": 2, "region": "ra", "tflops": 30, "memory_gb": 8},
                      {"id": "b-0", "region": "rb", "tflops": 10, "memory_gb": 4}],
          "network": {"regions": {"ra": {"gbps": 0.2, "latency_ms": 2}, "rb": {"gbps": 0.1, "latency_ms": 3}},
                      "links": [{"between": ["ra", "rb"], "gbps": 0.02, "latency_ms": 20}]}}


def test_profile_cluster_errors_name_only_profiles_own_flags(run_cli, tmp_path, monkeypatch):
    # they named emulate's --no-cpu-limits and --mode (which argparse took for profile's --model)
    from spantrain.errors import EmulationError
    from spantrain.runtime.emulator import cpu, shaping
    from spantrain.runtime.emulator.options import PROFILE_OPTIONS

    spec = tmp_path / "c.json"
    spec.write_text(json.dumps(_THREE))
    with pytest.raises(EmulationError, match=r"below the 1e-07 Gbit/s \(100 bit/s\) the kernel's shaper can "
                                             r"enforce: raise it$"):
        shaping.check_rates(Cluster.from_file(spec), shaping.RateLimits(scale=1e-9), PROFILE_OPTIONS)
    if cpu.unavailable_reason() is not None:
        pytest.skip(f"needs cgroup v1 cpu quotas: {cpu.unavailable_reason()}")
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "state"))
    code, out, err = run_cli("profile", "--cluster", spec, "--cpus", "0.002", "--budget-s", "5")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.strip().endswith("give the cluster at least 0.007 cores (--cpus)"), err


def test_a_profile_that_outlives_its_wait_exits_124_not_2(run_cli, tmp_path, monkeypatch):
    # the emulator's TimedOut is an EmulationError: it exited 2, the code of a mistyped option
    import spantrain.runtime.emulator as emulator
    from spantrain.runtime.emulator.launch import TimedOut

    def hang(timeout_s):
        raise TimedOut(f"the command was still running after {timeout_s:g} s; stopped every device")

    monkeypatch.setattr(emulator, "EmulatedCluster", _emulated(hang))
    code, out, err = run_cli("profile", "--cluster", tmp_path / "c.json", "--budget-s", "50")
    assert code == 124 and out == "", err
    assert err == ("spantrain profile: error: the profile outlived 4 x --budget-s (at least 120 s): stopped every "
                   "device after 200 s\n"), err


@pytest.mark.parametrize("returncode, code", [(-9, 1), (2, 2)])
def test_a_device_that_dies_in_a_profile_is_named_with_its_last_line(run_cli, monkeypatch, returncode, code):
    # it said "see its [device] lines above" (no such lines: the devices' output is not relayed),
    # and exit 2, the code of bad input, for a device killed under it
    from spantrain.runtime import emulator
    from spantrain.runtime.emulator.launch import DeviceResult

    def die(timeout_s):
        return [DeviceResult(device_id="cloud-0", rank=0, returncode=returncode, seconds=1.0, stdout="",
                             stderr="loading\nRuntimeError: out of memory\n"),
                DeviceResult(device_id="edge-0", rank=1, returncode=-15, seconds=1.0, stdout="", stderr="",
                             stopped=True)]

    monkeypatch.setattr(emulator, "EmulatedCluster", _emulated(die))
    got, _, err = run_cli("profile", "--cluster", ROOT / "examples" / "cee-demo.yaml", "--budget-s", "5")
    how = ("was killed by SIGKILL (its last line: RuntimeError: out of memory)" if returncode < 0
           else "exited with code 2: RuntimeError: out of memory")
    assert got == code and err.strip() == f"spantrain profile: error: device cloud-0 (rank 0) {how}", err


def _emulated(answer):
    """`EmulatedCluster` as the profile command uses it, whose run returns (or raises) `answer(timeout_s)`."""

    class Emulated:
        emulation = None

        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def describe(self):
            return []

        def run(self, argv, *, timeout_s, env=None):
            return answer(timeout_s)

    return Emulated
