"""`spantrain plan` and `spantrain compare`: JSON shapes, files, human output, exit codes."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from spantrain.cluster import Cluster
from spantrain.plan import Plan
from spantrain.workload import Workload


@pytest.fixture
def cluster_file(tmp_path, demo_spec):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(demo_spec))
    return path


def _one_line_error(code, out, err, needle):
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert needle in lines[0], lines[0]


def test_plan_json_shape_and_output_file(run_cli, cluster_file, tmp_path):
    out_file = tmp_path / "plan.json"
    code, out, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-medium", "--json", "-o", out_file)
    assert code == 0, err
    assert out.count("\n") == 1
    obj = json.loads(out)
    for key in ("plan", "estimate", "iteration_s", "samples_per_s", "feasible", "peak_memory_gb", "planner"):
        assert key in obj
    assert obj["feasible"] is True and obj["planner"] == "auto"  # the default planner
    assert obj["samples_per_s"] == pytest.approx(64 / obj["iteration_s"])
    cluster = Cluster.from_file(cluster_file)
    plan = Plan.from_file(out_file).validate(cluster, Workload.from_preset("gpt2-medium"))
    assert plan.to_dict()["pipelines"] == obj["plan"]["pipelines"]
    assert set(obj["peak_memory_gb"]) == set(plan.devices)


def test_plan_human_output(run_cli, cluster_file):
    code, out, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-medium", "--planner", "megatron",
                             "--global-batch", "32")
    assert code == 0, err
    assert "megatron plan" in out and "throughput" in out and "pipeline(s)" in out and "32 samples" in out
    # micro-batch size x count, the order `simulate` prints (count x size read as the other)
    code, js, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-medium", "--planner", "megatron",
                            "--global-batch", "32", "--json")
    pipe = json.loads(js)["plan"]["pipelines"][0]
    assert pipe["micro_batch_size"] != pipe["num_micro_batches"], pipe  # else the order would not show
    assert f"{pipe['micro_batch_size']} x {pipe['num_micro_batches']}" in out


def test_plan_ga_budget(run_cli, cluster_file):
    code, out, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-small", "--planner", "ga",
                             "--budget-s", "0.3", "--json")
    assert code == 0, err
    assert json.loads(out)["feasible"] is True


def test_plan_infeasible_baseline_is_printed_and_flagged(run_cli, cluster_file):
    code, out, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-xl", "--planner", "ddp", "--json")
    assert code == 0
    obj = json.loads(out)
    assert obj["feasible"] is False and obj["estimate"]["reasons"]
    assert "does not fit" in err


@pytest.mark.parametrize("args, needle", [
    (["--planner", "magic"], "unknown planner 'magic'"),
    (["--planner", "heuristic", "--budget-s", "2"], "--budget-s is not an option of planner 'heuristic'"),
    (["--planner", "ga", "--budget-s", "-1"], "--budget-s must be a number of seconds in (0, 86400], got -1"),
    (["--planner", "ga", "--budget-s", "1e9"], "--budget-s must be a number of seconds in (0, 86400], got 1e+09"),
    # inf is a bad value, not an option ga does not take
    (["--planner", "ga", "--budget-s", "inf"], "--budget-s must be a number of seconds in (0, 86400], got inf"),
    (["--model", "llama2-7b", "--global-batch", "8"], "fits nowhere"),
    (["--global-batch", "0"], "--global-batch must be a positive integer"),
    # 10**9 samples ran the cost model out of memory
    (["--planner", "heuristic", "--global-batch", "1000000000"],
     "--global-batch must be a positive integer up to 65536 samples, got 1000000000"),
    # a policy the user names must load: auto's heuristic fallback is for the shipped policy
    (["--model", "BIG", "--planner", "heuristic"], "big.yaml: global_batch must be at most 65536 samples, got "
                                                   "1000000000"),
    (["--policy", "MISSING"], "missing.pt not found"),
    (["--policy", "CLUSTER"], "tiny.yaml is not a spantrain policy file (not a torch file of tensors): pass a "
                              "policy file written by `spantrain train-policy`"),
    (["--planner", "ppo", "--policy", "CLUSTER"], "tiny.yaml is not a spantrain policy file"),
    (["--from", "RUNNING", "--policy", "MISSING"], "missing.pt not found"),
])
def test_plan_bad_input_exits_2_with_one_line(run_cli, tmp_path, args, needle):
    spec = {"name": "tiny", "devices": [{"id": "gpu", "count": 2, "region": "r", "tflops": 12, "memory_gb": 12}],
            "network": {"regions": {"r": {"gbps": 10, "latency_ms": 0.1}}}}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(spec))
    running = tmp_path / "running.json"
    running.write_text(json.dumps({"schedule": "1f1b", "sync": {"mode": "allreduce", "period": 1}, "pipelines": [
        {"micro_batch_size": 1, "num_micro_batches": 64, "stages": [{"devices": ["gpu-0"], "layers": [0, 14]}]}]}))
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump({"name": "big", "global_batch": 10**9, "seq_len": 64, "architecture": {
        "family": "gpt2", "vocab_size": 256, "d_model": 64, "n_layers": 2, "n_heads": 2, "d_ff": 128,
        "max_seq_len": 64}}))
    paths = {"MISSING": tmp_path / "missing.pt", "CLUSTER": path, "RUNNING": running, "BIG": big}
    argv = ["plan", "--cluster", path]
    if "--model" not in args:
        argv += ["--model", "gpt2-small"]
    code, out, err = run_cli(*argv, *[paths.get(a, a) for a in args])
    _one_line_error(code, out, err, needle)


def test_plan_refuses_an_unwritable_output_before_planning(run_cli, cluster_file, tmp_path, monkeypatch):
    # -o was first tried after planning (seconds to minutes with ga): the plan was lost to a
    # late "No such file or directory"
    import spantrain.policies.registry as registry

    def no_planning(*args, **kwargs):
        raise AssertionError("planning started")

    monkeypatch.setattr(registry, "get_planner", no_planning)
    out = tmp_path / "missing" / "plan.json"
    code, stdout, err = run_cli("plan", "-c", cluster_file, "-m", "tiny-gpt", "--planner", "heuristic", "-o", out,
                                "--json")
    _one_line_error(code, stdout, err, f"-o {out}: '{out.parent}' does not exist (create it first)")
    code, stdout, err = run_cli("plan", "-c", cluster_file, "-m", "tiny-gpt", "--planner", "heuristic", "-o", tmp_path)
    _one_line_error(code, stdout, err, f"-o {tmp_path}: is a directory; give a file name")
    # a directory that exists but takes no new file: planned, then "No such file or directory"
    code, stdout, err = run_cli("plan", "-c", cluster_file, "-m", "tiny-gpt", "--planner", "heuristic", "-o",
                                "/proc/plan.json")
    _one_line_error(code, stdout, err, "-o /proc/plan.json: cannot create a file in '/proc' (")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]


def test_plan_missing_cluster_file_exits_2(run_cli, tmp_path):
    code, out, err = run_cli("plan", "--cluster", tmp_path / "nope.yaml", "--model", "gpt2-small")
    assert code == 2 and out == "" and "Traceback" not in err


def test_compare_json_shape(run_cli, cluster_file):
    code, out, err = run_cli("compare", "--cluster", cluster_file, "--model", "gpt2-medium",
                             "--planners", "ddp,gpipe,heuristic,exhaustive", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert list(obj["planners"]) == ["ddp", "gpipe", "heuristic", "exhaustive"]
    for name, row in obj["planners"].items():
        for key in ("samples_per_s", "iteration_s", "feasible", "plan_s", "plan", "speedup_vs_ddp"):
            assert key in row, (name, key)
    rows = obj["planners"]
    # gpipe puts the whole pipeline through the 12 GB end device: out of memory, with the reason
    assert rows["gpipe"]["feasible"] is False and "end-0" in rows["gpipe"]["reason"]
    assert rows["ddp"]["speedup_vs_ddp"] == pytest.approx(1.0)
    assert rows["heuristic"]["samples_per_s"] > 10 * rows["ddp"]["samples_per_s"]
    assert rows["exhaustive"]["samples_per_s"] >= rows["heuristic"]["samples_per_s"] * (1 - 1e-9)


def test_compare_default_list_and_human_table(run_cli, tmp_path):
    from spantrain.profiler.topology import generate

    path = tmp_path / "c.yaml"
    generate(10, 0, "datacenter").save(path)
    code, out, err = run_cli("compare", "--cluster", path, "--model", "gpt2-small", "--budget-s", "0.3")
    assert code == 0, err
    for name in ("heuristic", "ddp", "gpipe", "megatron", "ga"):
        assert name in out
    assert "exhaustive" not in out  # above 8 devices it is left out by default
    # named, it is refused as `plan --planner exhaustive` refuses it (it was an "infeasible" row, exit 0)
    code, out, err = run_cli("compare", "--cluster", path, "--model", "gpt2-small", "--planners",
                             "heuristic,exhaustive", "--json")
    _one_line_error(code, out, err, f"exhaustive covers at most 8 devices and {path} has 10: leave exhaustive out "
                                    "of --planners")


def test_compare_refuses_inputs_plan_refuses(run_cli, tmp_path, demo_spec):
    # layer times measured for another model: every planner's row said the same "infeasible", exit 0
    spec = json.loads(json.dumps(demo_spec))
    spec["devices"][1]["layer_times"] = {"tiny-gpt": {"batch": 4, "forward_ms": [1, 2, 3], "backward_ms": [2, 4, 6]}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(spec))
    for command in (("plan", "--planner", "heuristic"), ("compare",)):
        code, out, err = run_cli(command[0], "--cluster", path, "--model", "tiny-gpt", *command[1:])
        _one_line_error(code, out, err, "layer_times['tiny-gpt'] has 3 layers but model 'tiny-gpt' has 8")


def test_compare_unknown_planner_exits_2(run_cli, cluster_file):
    code, out, err = run_cli("compare", "--cluster", cluster_file, "--model", "gpt2-small", "--planners", "ddp,x")
    _one_line_error(code, out, err, "unknown planner(s) x")


@pytest.mark.parametrize("planners", ["", " , "])
def test_compare_empty_planner_list_exits_2(run_cli, cluster_file, planners):
    # an empty --planners ran every planner
    code, out, err = run_cli("compare", "--cluster", cluster_file, "--model", "gpt2-small", "--planners", planners)
    _one_line_error(code, out, err, "--planners is empty: give planner names, comma-separated (available: ")
    assert "heuristic" in err


@pytest.mark.parametrize("args, needle", [
    # an option no compared planner takes is refused, as `plan` refuses it
    (["--planners", "heuristic", "--budget-s", "2"], "--budget-s is not an option of planner 'heuristic'"),
    (["--planners", "heuristic,ddp", "--policy", "CLUSTER"], "--policy is not an option of any of the planners "
                                                               "heuristic, ddp"),
    (["--planners", "heuristic,auto", "--policy", "CLUSTER"], "cluster.yaml is not a spantrain policy file"),
    (["--planners", "ppo", "--policy", "MISSING"], "missing.pt not found"),
    (["--budget-s", "nan"], "--budget-s must be a number of seconds in (0, 86400], got nan"),
])
def test_compare_bad_option_exits_2_with_one_line(run_cli, cluster_file, tmp_path, args, needle):
    paths = {"MISSING": tmp_path / "missing.pt", "CLUSTER": cluster_file}
    code, out, err = run_cli("compare", "--cluster", cluster_file, "--model", "gpt2-small",
                             *[paths.get(a, a) for a in args])
    _one_line_error(code, out, err, needle)


def _slow_planner(clock: list[float], *, load_s: float, plan_s: float):
    """The heuristic, on a fake clock: `prepare` takes `load_s`, `plan` takes `plan_s`."""
    from spantrain.policies.registry import get_planner

    real = get_planner("heuristic")

    class Slow:
        name = "slow"

        def prepare(self):
            clock[0] += load_s

        def plan(self, cluster, workload):
            clock[0] += plan_s
            return real.plan(cluster, workload)

    return Slow()


def test_run_planner_prepares_before_the_clock_starts(monkeypatch):
    # one-time loading (the policy, torch) is not planning: plan_s must not include it
    from spantrain.policies import compare
    from spantrain.profiler.topology import generate

    clock = [0.0]
    monkeypatch.setattr(compare.time, "perf_counter", lambda: clock[0])
    slow = _slow_planner(clock, load_s=100.0, plan_s=1.0)
    monkeypatch.setattr(compare, "get_planner", lambda name, **options: slow)
    result = compare.run_planner("slow", generate(4, 0, "cee"), Workload.from_preset("gpt2-small"))
    assert result.feasible and clock[0] == 101.0 and result.plan_s == 1.0  # prepared, untimed


def test_plan_times_loading_the_policy_apart_from_planning(run_cli, cluster_file, monkeypatch):
    # a fresh process pays seconds to load torch and the policy; `plan` must not call that planning
    # nor loading the cost model's compiled kernels (the first planning paid 0.3-0.5 s for it)
    from spantrain.cli import plan as plan_cli
    from spantrain.policies import compare, registry

    clock = [0.0]
    monkeypatch.setattr(plan_cli.time, "perf_counter", lambda: clock[0])
    slow = _slow_planner(clock, load_s=7.0, plan_s=0.25)
    monkeypatch.setattr(registry, "get_planner", lambda name, **options: slow)
    monkeypatch.setattr(compare, "warm_up", lambda: clock.__setitem__(0, clock[0] + 0.5))
    code, out, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-small", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert obj["plan_s"] == 0.25 and obj["load_s"] == 7.5
    code, out, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-small")
    assert code == 0, err
    assert "found in 0.25 s (+ 7.5 s one-time loading)" in out


def test_run_planner_reports_a_policy_that_cannot_load_and_auto_falls_back(tmp_path, monkeypatch):
    from spantrain.policies import ppo as ppo_module
    from spantrain.policies.compare import run_planner
    from spantrain.profiler.topology import generate

    cluster, workload = generate(4, 0, "cee"), Workload.from_preset("gpt2-small")
    missing = str(tmp_path / "missing.pt")
    ppo = run_planner("ppo", cluster, workload, policy=missing)
    assert not ppo.feasible and "not found" in ppo.reason
    # a policy file named explicitly must load; the fallback is for the shipped policy
    auto = run_planner("auto", cluster, workload, policy=missing)
    assert not auto.feasible and "not found" in auto.reason
    monkeypatch.setattr(ppo_module, "SHIPPED_POLICY", tmp_path / "shipped-missing.pt")
    auto = run_planner("auto", cluster, workload)
    heuristic = run_planner("heuristic", cluster, workload)
    assert auto.feasible and auto.plan == heuristic.plan


def test_a_policy_with_nan_weights_is_damaged_and_auto_falls_back(tmp_path, monkeypatch, capsys):
    # bytes overwritten inside the zip still loaded: every rollout then died in torch.multinomial
    # with a traceback, `auto` with the shipped file too
    import torch

    from spantrain.policies import ppo as ppo_module
    from spantrain.policies.compare import run_planner
    from spantrain.profiler.topology import generate

    blob = torch.load(ppo_module.SHIPPED_POLICY, map_location="cpu", weights_only=True)
    name = next(k for k, v in blob["state_dict"].items() if v.is_floating_point())
    blob["state_dict"][name].view(-1)[0] = float("nan")
    damaged = tmp_path / "damaged.pt"
    torch.save(blob, damaged)
    cluster, workload = generate(4, 0, "cee"), Workload.from_preset("gpt2-small")
    ppo = run_planner("ppo", cluster, workload, policy=str(damaged))
    assert not ppo.feasible and ppo.reason.endswith(
        f"--policy {damaged} is damaged (its weights hold NaN or infinite values): pass a policy file written by "
        "`spantrain train-policy` (a run's best-policy.pt, ppo-policy.pt or a checkpoint)"), ppo.reason
    monkeypatch.setattr(ppo_module, "SHIPPED_POLICY", damaged)
    auto = run_planner("auto", cluster, workload)
    assert auto.feasible and auto.plan == run_planner("heuristic", cluster, workload).plan
    assert "is damaged (its weights hold NaN" in capsys.readouterr().err


def test_a_policy_whose_outputs_overflow_is_a_one_line_error(monkeypatch):
    from spantrain.errors import PolicyError
    from spantrain.policies import ppo as ppo_module
    from spantrain.policies.compare import run_planner
    from spantrain.profiler.topology import generate

    real = ppo_module.load_policy

    def overflowing(*args, **kwargs):
        net, env, meta = real(*args, **kwargs)
        forward = net.forward
        net.forward = lambda batch: (forward(batch)[0] * math.inf, None)
        return net, env, meta

    monkeypatch.setattr(ppo_module, "load_policy", overflowing)
    cluster, workload = generate(4, 0, "cee"), Workload.from_preset("gpt2-small")
    with pytest.raises(PolicyError, match="the policy's outputs are not finite numbers on this cluster"):
        ppo_module.PPOPlanner().plan(cluster, workload)
    assert run_planner("auto", cluster, workload).feasible  # the shipped policy's failure: the heuristic plan


def test_beyond_the_devices_the_policy_plans_ppo_refuses_and_auto_plans_with_the_heuristic(monkeypatch, capsys):
    # at 4,096 devices the policy took 44 s and 18 GB, then torch.multinomial's traceback
    from spantrain.errors import PolicyError
    from spantrain.policies import adapt, ppo
    from spantrain.policies.compare import run_planner
    from spantrain.profiler.topology import generate

    monkeypatch.setattr(ppo, "MAX_POLICY_DEVICES", 8)
    cluster, workload = generate(12, 0, "cee"), Workload.from_preset("gpt2-small")
    with pytest.raises(PolicyError, match=r"^the policy plans clusters of up to 8 devices, this one has 12 .*: use "
                                          r"--planner heuristic$"):
        ppo.PPOPlanner().plan(cluster, workload)
    auto = run_planner("auto", cluster, workload)
    assert auto.feasible and auto.plan == run_planner("heuristic", cluster, workload).plan
    assert capsys.readouterr().err == ("spantrain: note: 12 devices, more than the policy plans (8): using the "
                                       "heuristic plan\n")  # called as a library: no command to name
    # adapting: the heuristic's options alone
    running = run_planner("heuristic", cluster, workload).plan
    a = adapt.adapt_plan(cluster, workload, running, planner="auto")
    assert "ppo" not in {o.name for o in a.options}
    assert "12 devices, more than the policy plans (8): adapting without it" in capsys.readouterr().err


def test_a_huge_speed_up_is_printed_with_its_magnitude(run_cli, tmp_path):
    # figures at the spec's limits made a 56-digit ratio whose "x" the table cut off
    spec = {"name": "huge", "devices": [{"id": "g", "count": 4, "region": r, "tflops": 1e30, "memory_gb": 1e30}
                                        for r in ("a", "b")],
            "network": {"regions": {"a": {"gbps": 1e30, "latency_ms": 1e-30}, "b": {"gbps": 1e30, "latency_ms": 1e-30}},
                        "default": {"gbps": 1e-30, "latency_ms": 1e30}}}
    for d, name in zip(spec["devices"], ("a", "b"), strict=True):
        d["id"] = name
    path = tmp_path / "huge.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run_cli("compare", "--cluster", path, "--model", "gpt2-medium", "--planners", "heuristic,ddp")
    assert code == 0, err
    (row,) = [line for line in out.splitlines() if line.startswith("│ heuristic")]
    speedup = row.split("│")[4].strip()
    assert speedup.endswith("x") and "e+" in speedup and len(speedup) <= 10, row


def test_running_out_of_memory_is_one_line(run_cli, cluster_file, monkeypatch):
    from spantrain.policies.heuristic import HeuristicPlanner

    def too_big(self, ev):
        raise MemoryError

    monkeypatch.setattr(HeuristicPlanner, "best_candidate", too_big)
    code, out, err = run_cli("plan", "--cluster", cluster_file, "--model", "gpt2-small", "--planner", "heuristic")
    assert code == 2 and out == "" and err == (
        "spantrain plan: error: ran out of memory: this cluster and model are too large to plan on this machine; "
        "use fewer devices or layers, or a machine with more memory\n")


def test_a_cluster_of_cpus_planned_with_the_gpu_constants_gets_a_note(run_cli, tmp_path, demo_spec):
    # `spantrain profile` labels CPUs "cpu"; plan silently used the GPU constants on them and picked a plan
    # for another executor (zb-h2 1x32 where the CPU profile picks gpipe 4x8, and measured 0.47 s, not 0.26 s)
    for d in demo_spec["devices"]:
        d.update(gpu="cpu", tflops=0.05, memory_gb=8)
    cpus = tmp_path / "cpus.yaml"
    cpus.write_text(yaml.safe_dump(demo_spec))
    code, _, err = run_cli("plan", "--cluster", cpus, "--model", "tiny-gpt", "--planner", "heuristic",
                           "-o", tmp_path / "p.json")
    assert code == 0, err
    hint = "the cluster's devices are CPUs and the built-in constants describe GPUs: pass --calibration emulated-cpu"
    assert f"spantrain plan: note: {hint}" in err, err
    for command in (["compare", "--planners", "heuristic"], ["simulate", "--plan", tmp_path / "p.json"]):
        code, _, err = run_cli(command[0], "--cluster", cpus, "--model", "tiny-gpt", *command[1:])
        assert code == 0 and f"spantrain {command[0]}: note: {hint}" in err, err
        code, _, err = run_cli(command[0], "--cluster", cpus, "--model", "tiny-gpt", *command[1:],
                               "--calibration", "emulated-cpu")
        assert code == 0 and hint not in err, err
    demo_spec["devices"][0]["gpu"] = "A100-40GB"  # not all CPUs: no note
    cpus.write_text(yaml.safe_dump(demo_spec))
    code, _, err = run_cli("plan", "--cluster", cpus, "--model", "tiny-gpt", "--planner", "heuristic")
    assert code == 0 and hint not in err, err
