"""The graph encoder, the SB3 policy wiring, training smoke run, deployment planners."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from spantrain.env.evaluator import Evaluator
from spantrain.env.plan_env import EnvConfig, PlanEnv
from spantrain.policies.extractor import GraphPolicyNet, to_graph
from spantrain.profiler.topology import generate
from spantrain.workload import Workload

SMALL = EnvConfig(max_devices=8, min_devices=4, models=("gpt2-medium",), max_steps=4)


def _obs(seed: int = 0):
    env = PlanEnv(SMALL)
    obs, _ = env.reset(seed=seed)
    return env, {k: torch.as_tensor(v)[None] for k, v in obs.items()}


def _permute(obs, perm):
    return {"nodes": obs["nodes"][:, perm], "edges": obs["edges"][:, perm][:, :, perm], "mask": obs["mask"][:, perm],
            "globals": obs["globals"]}


def test_device_order_permutation_leaves_value_unchanged_and_permutes_logits():
    torch.manual_seed(0)
    net = GraphPolicyNet(hidden=32, layers=2).eval()
    _, obs = _obs(3)
    n = obs["nodes"].shape[1]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, value = net(obs)
        logits_p, value_p = net(_permute(obs, perm))
    assert torch.allclose(value, value_p, atol=1e-5)
    insert = logits[0, : n * n].reshape(n, n)
    insert_p = logits_p[0, : n * n].reshape(n, n)
    real = obs["mask"][0] > 0
    real_p = real[perm]
    assert torch.allclose(insert[perm][:, perm][real_p][:, real_p], insert_p[real_p][:, real_p], atol=1e-5)


def test_graph_batch_keeps_only_real_devices_and_fast_neighbours():
    _, obs = _obs(1)
    x, edge_index, edge_attr, batch, _ = to_graph(obs["nodes"], obs["edges"], obs["mask"], k=2)
    n_real = int(obs["mask"].sum())
    assert x.shape[0] == n_real and edge_index.max() < n_real and (batch == 0).all()
    assert edge_attr.shape[0] == edge_index.shape[1] >= n_real  # at least k per node, plus pipeline links


def test_one_network_serves_any_cluster_size():
    net = GraphPolicyNet(hidden=32, layers=2).eval()
    for n in (4, 40):
        env = PlanEnv(EnvConfig(max_devices=n, min_devices=n))
        obs, _ = env.reset(seed=0)
        with torch.no_grad():
            logits, _ = net({k: torch.as_tensor(v)[None] for k, v in obs.items()})
        assert logits.shape[1] == env.action_space.n


@pytest.mark.slow
def test_tiny_training_run_writes_a_policy_that_plans(tmp_path, monkeypatch, capsys, wandb_records):
    import tempfile

    from spantrain.policies.ppo import PPOPlanner, load_policy
    from spantrain.policies.training import TrainConfig, train
    from spantrain.tracking import Tracker

    logged: dict[str, list[int]] = {}
    real_log = Tracker.log

    def spy(self, metrics, step=None):
        for key in metrics:
            logged.setdefault(key, []).append(step)
        real_log(self, metrics, step=step)

    monkeypatch.setattr(Tracker, "log", spy)
    versions: list[tuple[str, list[str]]] = []
    real_artifact = Tracker.log_artifact

    def spy_artifact(self, path, *, name, type, aliases, metadata=None, copy=False):
        assert (name, type) == ("ppo-policy", "model") and Path(path).exists()
        versions.append((Path(path).name, aliases, copy))
        real_artifact(self, path, name=name, type=type, aliases=aliases, metadata=metadata, copy=copy)

    monkeypatch.setattr(Tracker, "log_artifact", spy_artifact)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    # 60 steps: PPO runs its one whole rollout of 2 x 48 steps
    summary = train(TrainConfig(timesteps=60, n_envs=2, n_steps=48, batch_size=48, n_epochs=1, max_devices=6,
                                min_devices=4, models=("gpt2-medium",), pool_size=4, eval_scenarios=2,
                                eval_every=48, hidden=16, layers=1, track=True, progress=False, workers=1,
                                imitation_episodes=2, imitation_rounds=2, imitation_epochs=1, start_kicks=2,
                                out_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache")))
    # imitation first (evaluated as step 0), then PPO's evaluation once its update has learned from
    # 48 steps or more: after the rollout of 96 (mid-rollout, the weights are still step 0's)
    assert (tmp_path / "run" / "ppo-policy.pt").exists() and [p["steps"] for p in summary["curve"]] == [0, 96]
    ckpt = tmp_path / "run" / "checkpoints"
    weights = {name: load_policy(path)[0].state_dict() for name, path in
               [("0", ckpt / "policy-0.pt"), ("96", ckpt / "policy-96.pt"), ("final", summary["policy"])]}
    assert all(torch.equal(v, weights["final"][k]) for k, v in weights["96"].items())
    assert not all(torch.equal(v, weights["0"][k]) for k, v in weights["96"].items())
    assert len(summary["imitation"]) == 2 and summary["imitation"][1]["samples"] > summary["imitation"][0]["samples"]
    assert summary["final"]["cases"] == 4  # two held-out scenarios, planned and adapted
    # best-policy.pt is the evaluated policy with the best held-out geomean (the final on a tie)
    best = summary["best"]
    top = max(p["geomean_ratio"] for p in [*summary["curve"], summary["final"]])
    assert best["geomean_ratio"] == top and best["policy"] == str(tmp_path / "run" / "best-policy.pt")
    assert best["steps"] in [p["steps"] for p in summary["curve"]]  # steps PPO ran, as the checkpoints say
    _, _, best_meta = load_policy(best["policy"])
    assert best_meta["selected_steps"] == best["steps"] and best_meta["curve"] == summary["curve"]
    assert any((tmp_path / "run" / "checkpoints").iterdir())
    assert list((tmp_path / "run" / "wandb").rglob("*.wandb")), "W&B offline run was not written"
    # what W&B kept, not only what was handed to it: the final table and curve came one step below
    # PPO's last losses, and W&B dropped them
    records = wandb_records(tmp_path / "run" / "wandb", b"table-file", b"image-file")
    assert b"table-file" in records and b"image-file" in records
    # the final table's numbers are numbers (as text, W&B sorted devices and seeds as words)
    (table,) = (tmp_path / "run" / "wandb").rglob("final_*.table.json")
    row = json.loads(table.read_text())["data"][0]
    assert [type(v) for v in row[:5]] == [str, int, int, str, int], row
    # every policy file is a version of one W&B model artifact: the checkpoints, the final, the best
    # (those two copied: a resumed part rewrites their files)
    assert versions == [(f"policy-{s}.pt", [f"step-{s}"], False) for s in (0, 96)] + [
        ("ppo-policy.pt", ["final"], True), ("best-policy.pt", ["best"], True)]
    assert (tmp_path / "run" / "final_eval.csv").read_text().count("\n") == 1 + summary["final"]["cases"]
    # wandb is silenced, so training says where its run is: at the start, and in the summary
    run_dir = next((tmp_path / "run" / "wandb" / "wandb").glob("offline-run-*"))
    assert summary["wandb"] == str(run_dir) and f"train-policy: W&B run {run_dir}\n" in capsys.readouterr().err
    # PPO's diagnostics of its one update (2 envs x 48 steps) reach W&B; SB3 made no log directory
    # the rollout's figures at its step; the last update's losses one step on (SB3 dumps an update's
    # losses with the next rollout's figures: at the last rollout's step they overwrote the update before)
    assert logged.get("ppo/fps") == [96]
    for key in ("ppo/approx_kl", "ppo/value_loss", "ppo/policy_gradient_loss", "ppo/entropy_loss"):
        assert logged.get(key) == [97], f"{key} logged at steps {logged.get(key)}"
    # not the step itself or counters of it (SB3's restart in a resumed part), nor constants
    assert not {"ppo/total_timesteps", "ppo/iterations", "ppo/n_updates", "ppo/time_elapsed", "ppo/learning_rate",
                "ppo/clip_range"} & set(logged)
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("SB3-")]
    _, env, meta = load_policy(summary["policy"])
    assert env["max_steps"] == 12 and meta["timesteps"] == 96
    cluster = generate(6, seed=5, profile="cee")
    workload = Workload.from_preset("gpt2-medium")
    planner = PPOPlanner(policy=summary["policy"], samples=2)
    ev = Evaluator(cluster, workload)
    from spantrain.policies.heuristic import HeuristicPlanner

    heuristic = HeuristicPlanner().best_candidate(ev)
    best = planner.best_candidate(ev, start=heuristic)
    assert best.time <= heuristic.time
    plan = planner.plan(cluster, workload)
    assert plan.problems(cluster, workload) == [] and plan.batch == workload.global_batch


def test_shipped_policy_loads_and_plans_beyond_training_sizes():
    from spantrain.policies.ppo import SHIPPED_POLICY, PPOPlanner, load_policy

    assert SHIPPED_POLICY.exists(), "the package ships no policy"
    assert SHIPPED_POLICY.stat().st_size < 5_000_000
    _, env, meta = load_policy()
    assert "train_s" in meta and env["max_devices"] >= 16
    cluster = generate(40, seed=123, profile="datacenter")
    workload = Workload.from_preset("gpt2-medium")
    plan = PPOPlanner(samples=1).plan(cluster, workload)
    assert plan.problems(cluster, workload) == []


def test_loading_the_policy_leaves_no_files_in_the_temp_directory(tmp_path):
    # PyG writes each conv class's rendered `propagate` to the temp directory once per
    # process and never deletes it; a fresh process shows whether the encoder cleans up
    code = "from spantrain.policies.ppo import load_policy; load_policy()"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TMPDIR": str(scratch)})
    # torch's compile cache is one fixed directory per user, reused, so it may stay
    left = sorted(p.name for p in scratch.iterdir() if not p.name.startswith("torchinductor_"))
    assert left == []


def test_auto_falls_back_to_the_heuristic_without_a_policy(tmp_path, capsys, monkeypatch):
    from spantrain.errors import PolicyError
    from spantrain.policies import ppo
    from spantrain.policies.heuristic import HeuristicPlanner

    cluster = generate(6, seed=2, profile="geo")
    workload = Workload.from_preset("gpt2-medium")
    monkeypatch.setattr(ppo, "SHIPPED_POLICY", tmp_path / "shipped-missing.pt")
    plan = ppo.AutoPlanner().plan(cluster, workload)
    assert plan == HeuristicPlanner().plan(cluster, workload)
    err = capsys.readouterr().err
    assert "using the heuristic plan" in err and "use --planner heuristic" in err
    # the fallback is for the shipped policy: a file the user names must load
    with pytest.raises(PolicyError, match=r"missing\.pt not found"):
        ppo.AutoPlanner(policy=str(tmp_path / "missing.pt")).plan(cluster, workload)
    with pytest.raises(PolicyError, match=r"missing\.pt not found"):
        ppo.AutoPlanner(policy=str(tmp_path / "missing.pt")).prepare()


def test_a_policy_file_that_cannot_be_read_says_so(tmp_path, monkeypatch):
    # was "is not a spantrain policy file": the file may be one, only not readable by this user
    import torch

    from spantrain.errors import PolicyError
    from spantrain.policies.ppo import SHIPPED_POLICY, load_policy

    def no_permission(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(torch, "load", no_permission)
    with pytest.raises(PolicyError, match=r"^--policy \S+ppo-policy\.pt cannot be read \(Permission denied\)$"):
        load_policy(str(SHIPPED_POLICY))


FIX = "pass a policy file written by `spantrain train-policy` (a run's best-policy.pt, ppo-policy.pt or a checkpoint)"


@pytest.mark.parametrize("content, reason", [
    (b"not a policy", "is not a spantrain policy file (not a torch file of tensors)"),
    (b"i am text\n", "is not a spantrain policy file (not a torch file of tensors)"),  # was "(KeyError: 105)"
    (b"name: cluster\ndevices: []\n", "is not a spantrain policy file (not a torch file of tensors)"),  # a spec
    (b"", "is damaged or truncated"),
    ("TRUNCATED", "is damaged or truncated"),  # was torch's PytorchStreamReader message
    ("CUT_END", "is damaged or truncated"),  # only the zip's end record lost: torch raises OSError EINVAL
    ("FOREIGN_ZIP", "is not a spantrain policy file (not a torch file of tensors)"),
    ("TENSOR", "is not a spantrain policy file (it holds a Tensor)"),
    ("DICT", "is not a spantrain policy file (it holds a dict without a 'format' key)"),
    ("DIR", "is a directory, not a policy file"),
])
def test_a_file_that_is_not_a_policy_is_a_one_line_error(tmp_path, content, reason):
    import torch

    from spantrain.errors import PolicyError
    from spantrain.policies.ppo import SHIPPED_POLICY, load_policy

    bad = tmp_path / "bad.pt"
    if content == "TENSOR":
        torch.save(torch.zeros(2), bad)
    elif content == "DICT":
        torch.save({"state_dict": {}}, bad)
    elif content == "DIR":
        bad.mkdir()
    elif content == "TRUNCATED":
        whole = SHIPPED_POLICY.read_bytes()
        bad.write_bytes(whole[:len(whole) // 2])
    elif content == "CUT_END":  # a small file: torch seeks before its start and raises OSError
        torch.save({"format": 1, "state_dict": {"w": torch.zeros(1000)}}, bad)
        bad.write_bytes(bad.read_bytes()[:-30])
    elif content == "FOREIGN_ZIP":
        import zipfile
        with zipfile.ZipFile(bad, "w") as z:
            z.writestr("notes/readme.txt", "a zip, but not torch's")
    else:
        bad.write_bytes(content)
    with pytest.raises(PolicyError) as e:
        load_policy(bad)
    # torch's own message runs to many lines about weights_only and arbitrary code execution
    assert str(e.value) == f"--policy {bad} {reason}: {FIX}"
    with pytest.raises(PolicyError) as e:
        load_policy(bad, option="--init-policy")
    assert str(e.value) == f"--init-policy {bad} {reason}: {FIX}"


@pytest.mark.timeout(60)
def test_a_pipe_as_the_policy_file_is_refused_not_waited_on(tmp_path, run_cli):
    from spantrain.errors import PolicyError
    from spantrain.policies.ppo import load_policy

    root = Path(__file__).resolve().parents[2]

    fifo = tmp_path / "policy.pt"
    os.mkfifo(fifo)  # torch.load waited for a writer that never came
    with pytest.raises(PolicyError, match=r"^--policy .*policy\.pt is not a regular file \(a pipe or a device\): "
                                          "pass a policy file written by `spantrain train-policy`"):
        load_policy(fifo)
    code, out, err = run_cli("plan", "--cluster", root / "examples" / "cee-demo.yaml", "--model", "tiny-gpt",
                             "--planner", "ppo", "--policy", fifo)
    assert code == 2 and out == "" and "is not a regular file" in err and len(err.strip().splitlines()) == 1, err


def test_a_training_runs_directory_names_the_policy_file_in_it(tmp_path):
    # was "is a directory, not a policy file: pass a policy file written by `spantrain train-policy` (...)"
    import shutil

    from spantrain.errors import PolicyError
    from spantrain.policies.ppo import SHIPPED_POLICY, load_policy

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copyfile(SHIPPED_POLICY, run / "interrupted-policy.pt")
    with pytest.raises(PolicyError) as e:
        load_policy(run)
    assert str(e.value) == f"--policy {run} is a directory, not a policy file: pass its policy file " \
                           f"{run / 'interrupted-policy.pt'}"
    shutil.copyfile(SHIPPED_POLICY, run / "best-policy.pt")
    with pytest.raises(PolicyError, match=r"pass its policy file \S+best-policy\.pt$"):
        load_policy(run)


def test_a_runs_resume_state_is_not_taken_for_a_policy(tmp_path):
    import dataclasses

    import torch

    from spantrain.errors import PolicyError
    from spantrain.policies.ppo import load_policy
    from spantrain.policies.resume import ResumeState
    from spantrain.policies.train_config import TrainConfig

    path = ResumeState(config=dataclasses.asdict(TrainConfig()), num_timesteps=48, n_updates=1, policy={},
                       optimizer={}, torch_rng=torch.get_rng_state()).save(tmp_path)
    with pytest.raises(PolicyError) as e:  # was "is unusable (KeyError: 'net'); retrain it"
        load_policy(path, resume_fix="continue that run with --resume --out-dir RUN")
    assert str(e.value) == (f"--policy {path} is a training run's resume state, not a policy file: continue that "
                            "run with --resume --out-dir RUN; or pass the run's best-policy.pt or ppo-policy.pt from "
                            "the same directory (written when it ends)")
    (tmp_path / "best-policy.pt").write_bytes(b"")
    with pytest.raises(PolicyError) as e:
        load_policy(path)
    assert str(e.value).endswith(f"not a policy file: pass its policy file {tmp_path / 'best-policy.pt'}")


def test_a_policy_whose_network_does_not_build_is_unusable(tmp_path):
    import torch

    from spantrain.errors import PolicyError
    from spantrain.policies.ppo import load_policy

    bad = tmp_path / "bad.pt"
    torch.save({"format": 1, "net": {"bogus": 1}, "state_dict": {}}, bad)
    with pytest.raises(PolicyError, match=r"unusable .*bogus.*; retrain it with `spantrain train-policy`$") as e:
        load_policy(bad)
    assert "\n" not in str(e.value) and "--planner heuristic" not in str(e.value)


@pytest.mark.parametrize("change, reason", [
    ({"format": 2}, "has format 2, this spantrain version reads format 1"),  # was "..., expected 1": no fix
    # deployment's rollout length: was a ValueError traceback from int() mid-plan
    ({"env": {"max_steps": "x", "horizon": 500}}, "has unusable settings (max_steps 'x'; each must be a positive "
                                                  "integer)"),
    ({"env": {"max_steps": 12, "horizon": 0}}, "has unusable settings (horizon 0; each must be a positive integer)"),
    ({"env": [12]}, "has unusable settings (env [12]; each must be a positive integer)"),
])
def test_a_policy_file_of_another_version_is_one_line_naming_the_fix(tmp_path, change, reason):
    import torch

    from spantrain.errors import PolicyError
    from spantrain.policies import ppo

    blob = torch.load(ppo.SHIPPED_POLICY, map_location="cpu", weights_only=True)
    other = tmp_path / "other.pt"
    torch.save({**blob, **change}, other)
    with pytest.raises(PolicyError) as e:
        ppo.PPOPlanner(policy=str(other)).plan(generate(8, seed=4, profile="geo"),
                                               Workload.from_preset("gpt2-medium"))
    assert str(e.value) == (f"--policy {other} {reason}: retrain it with this version's `spantrain train-policy`, "
                            "or use the spantrain version that wrote it")


def test_sampled_rollouts_shrink_beyond_training_sizes(monkeypatch):
    from spantrain.policies import ppo

    assert [ppo.default_samples(n) for n in (4, 32, 33, 64, 128, 1024)] == [4, 4, 1, 1, 1, 1]
    seen = []
    real = ppo.improve

    def spy(net, scenario, **kw):
        seen.append((len(scenario.cluster), kw["samples"]))
        return real(net, scenario, **kw)

    monkeypatch.setattr(ppo, "improve", spy)
    workload = Workload.from_preset("gpt2-medium")
    for n in (8, 64):
        ppo.PPOPlanner().plan(generate(n, seed=4, profile="geo"), workload)
    ppo.PPOPlanner(samples=3).plan(generate(8, seed=4, profile="geo"), workload)
    assert seen == [(8, 4), (64, 1), (8, 3)]


@pytest.mark.slow
def test_train_policy_cli_ships_the_best_evaluated_policy(run_cli, tmp_path, monkeypatch):
    from spantrain.policies import ppo

    shipped = tmp_path / "assets" / "ppo-policy.pt"
    monkeypatch.setattr(ppo, "SHIPPED_POLICY", shipped)  # never overwrite the package's policy

    def train(out_dir, *extra):
        return run_cli("train-policy", "--timesteps", "0", "--imitation-episodes", "2", "--imitation-rounds",
                       "1", "--imitation-epochs", "1", "--max-devices", "6", "--min-devices", "4", "--models",
                       "gpt2-medium", "--pool-size", "3", "--eval-scenarios", "2", "--hidden", "16", "--layers",
                       "1", "--no-track", "--no-progress", "--workers", "1", "--out-dir", tmp_path / out_dir,
                       "--cache-dir", tmp_path / "cache", "--ship", *extra)

    # the human summary is on one stream: stdout, or stderr beside --json's one object on stdout
    code, out, err = train("run")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 4 and lines[0].startswith("trained in ") and lines[1].startswith("held-out "), out
    assert re.match(r"trained in \d+\.\d s \(", lines[0]), lines[0]  # a smoke run's time was "0.0 min"
    assert lines[2].startswith("best held-out evaluation at step 0"), out
    assert lines[3] == f"shipped it to {shipped}, which `ppo` and `auto` load", out  # there was none before
    assert "trained in" not in err and "held-out" not in err, err
    # untracked, the final evaluation's cases are still kept: one row each, named in the summary
    rows = tmp_path / "run" / "final_eval.csv"
    assert lines[1].endswith(f" cases (one row each in {rows})")
    header, *cases = rows.read_text().splitlines()
    assert header.startswith("profile,devices,seed,model,") and f" of {len(cases)} cases " in lines[1]
    assert shipped.read_bytes() == (tmp_path / "run" / "best-policy.pt").read_bytes()
    ppo.load_policy(shipped)

    code, out, err = train("run-json", "--json")
    assert code == 0, err
    summary = json.loads(out)  # exactly one JSON object, nothing else on stdout
    assert out.count("\n") == 1 and summary["shipped"] == str(shipped)
    # the policy it replaced is kept beside it: in a pip install nothing else had it
    previous = shipped.with_name("ppo-policy.prev.pt")
    assert summary["shipped_previous"] == str(previous)
    assert previous.read_bytes() == (tmp_path / "run" / "best-policy.pt").read_bytes()
    human = [x for x in err.splitlines() if x.startswith(("trained in ", "held-out ", "best held-out ", "shipped "))]
    assert len(human) == 4 and human[3] == (f"shipped it to {shipped}, which `ppo` and `auto` load; the policy it "
                                            f"replaced is kept as {previous}"), err


@pytest.mark.slow
def test_interrupted_training_keeps_its_weights_and_continues_from_them(run_cli, tmp_path, monkeypatch):
    from spantrain.policies.ppo import load_policy, load_value_head

    tiny = ["--n-envs", "2", "--n-steps", "24", "--batch-size", "24", "--n-epochs", "1", "--max-devices", "6",
            "--min-devices", "4", "--models", "gpt2-medium", "--pool-size", "3", "--eval-scenarios", "2",
            "--eval-every", "48", "--hidden", "16", "--layers", "1", "--no-track", "--no-progress", "--workers", "1",
            "--cache-dir", tmp_path / "cache"]
    from sb3_contrib import MaskablePPO

    from spantrain.tracking import Tracker

    real_step, real_log, real_train = PlanEnv.step, Tracker.log, MaskablePPO.train
    updated = {"n": 0}
    logged: dict[str, list[int]] = {}

    def update(self):
        real_train(self)
        updated["n"] += 1

    def ctrl_c_in_the_second_rollout(self, action):
        if updated["n"]:  # the first step after the first update
            raise KeyboardInterrupt
        return real_step(self, action)

    def spy(self, metrics, step=None):
        for key in metrics:
            logged.setdefault(key, []).append(step)
        real_log(self, metrics, step=step)

    with monkeypatch.context() as m:
        m.setattr(PlanEnv, "step", ctrl_c_in_the_second_rollout)
        m.setattr(MaskablePPO, "train", update)
        m.setattr(Tracker, "log", spy)
        code, _, err = run_cli("train-policy", "--timesteps", "96", "--imitation-episodes", "0",
                               "--out-dir", tmp_path / "first", *tiny)
    saved = tmp_path / "first" / "interrupted-policy.pt"
    assert code == 130 and "interrupted during PPO step" in err and f"--resume --out-dir {tmp_path / 'first'}" in err
    # the update before the stop has its losses logged (they waited for the next rollout's dump)
    assert len(logged.get("ppo/approx_kl", [])) == 1, logged
    first, _, meta = load_policy(saved)
    assert meta["interrupted"] == "ppo" and 0 < meta["steps"] < 96
    assert load_value_head(saved) is not None  # the critic too, so PPO picks up where it stopped

    # continuing skips imitation; the step-0 checkpoint is the saved policy, critic included
    code, _, err = run_cli("train-policy", "--timesteps", "48", "--init-policy", saved,
                           "--out-dir", tmp_path / "second", *tiny)
    assert code == 0, err
    start = tmp_path / "second" / "checkpoints" / "policy-0.pt"
    again, _, _ = load_policy(start)
    for key, value in first.state_dict().items():
        assert torch.equal(again.state_dict()[key], value)
    for key, value in load_value_head(saved).items():
        assert torch.equal(load_value_head(start)[key], value)

    code, _, err = run_cli("train-policy", "--timesteps", "48", "--init-policy", saved,
                           "--out-dir", tmp_path / "third", *[a if a != "16" else "32" for a in tiny])
    assert code == 2 and "--hidden" in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_after_training_says_the_policies_are_saved(run_cli, tmp_path, monkeypatch):
    from spantrain.policies import training

    def ctrl_c(*args, **kwargs):  # while the plot, then the W&B run, are finished
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "_plot_curve", ctrl_c)
    run = tmp_path / "run"
    code, out, err = run_cli("train-policy", "--timesteps", "48", "--n-envs", "2", "--n-steps", "24", "--batch-size",
                             "24", "--n-epochs", "1", "--max-devices", "6", "--min-devices", "4", "--models",
                             "gpt2-medium", "--pool-size", "2", "--eval-scenarios", "1", "--hidden", "16", "--layers",
                             "1", "--imitation-episodes", "0", "--no-track", "--no-progress", "--workers", "1",
                             "--out-dir", run, "--cache-dir", tmp_path / "cache")
    assert code == 130 and out == ""
    assert err.strip().splitlines() == [f"spantrain train-policy: interrupted after training, while finishing its "
                                        f"plot and W&B run; the best policy is in {run / 'best-policy.pt'}, the "
                                        f"summary in {run / 'summary.json'}"], err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"]["policy"] == str(run / "best-policy.pt") and (run / "ppo-policy.pt").exists()


def test_a_training_run_that_fails_ends_its_wandb_run(run_cli, tmp_path, monkeypatch):
    """A full disk, say: the W&B run stayed open, and WANDB_DATA_DIR set in the calling process."""
    import os

    from spantrain.policies import training

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device", str(tmp_path / "run" / "final_eval.csv"))

    monkeypatch.setattr(training, "_write_rows", full_disk)
    monkeypatch.delenv("WANDB_DATA_DIR", raising=False)
    code, out, err = run_cli("train-policy", "--timesteps", "48", "--n-envs", "2", "--n-steps", "24", "--batch-size",
                             "24", "--n-epochs", "1", "--max-devices", "6", "--min-devices", "4", "--models",
                             "gpt2-medium", "--pool-size", "2", "--eval-scenarios", "1", "--hidden", "16", "--layers",
                             "1", "--imitation-episodes", "0", "--track", "--no-progress", "--workers", "1",
                             "--out-dir", tmp_path / "run", "--cache-dir", tmp_path / "cache")
    assert code == 2 and out == "" and "No space left on device" in err, err
    import wandb

    assert wandb.run is None and "WANDB_DATA_DIR" not in os.environ
    (log,) = (tmp_path / "run" / "wandb" / "wandb").glob("offline-run-*/logs/debug.log")
    assert "got exitcode: 1" in log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["starts", "imitation", "ppo", "ppo --ship", "starts --ship"])
def test_ctrl_c_line_starts_below_the_progress_bar(run_cli, tmp_path, monkeypatch, phase):
    from spantrain.policies import ppo, starts

    ship = phase.endswith("--ship")
    phase = phase.split()[0]
    monkeypatch.setattr(ppo, "SHIPPED_POLICY", tmp_path / "assets" / "ppo-policy.pt")  # never the package's

    def ctrl_c_on_call(owner, name, n):
        real, calls = getattr(owner, name), []

        def wrapper(*args, **kwargs):
            calls.append(1)
            if len(calls) == n:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    if phase == "starts":
        ctrl_c_on_call(starts, "_plan_one", 2)
    else:
        ctrl_c_on_call(PlanEnv, "step", 3 if phase == "imitation" else 30)
    code, out, err = run_cli("train-policy", "--timesteps", "96", "--n-envs", "2", "--n-steps", "24", "--batch-size",
                             "24", "--n-epochs", "1", "--max-devices", "6", "--min-devices", "4", "--models",
                             "gpt2-medium", "--pool-size", "2", "--eval-scenarios", "1", "--hidden", "16", "--layers",
                             "1", "--imitation-episodes", "0" if phase == "ppo" else "2", "--imitation-rounds", "1",
                             "--no-track", "--workers", "1", "--out-dir", tmp_path / "run", "--cache-dir",
                             tmp_path / "cache", *(["--ship"] if ship else []))
    assert code == 130 and out == ""
    # the bar is closed first (its last state, then a newline), not left for the message to run onto
    bar = {"starts": "heuristic starts:", "imitation": "imitation:", "ppo": "train-policy:"}[phase]
    lines = [line for line in err.split("\n") if line]
    assert lines[-1].startswith("spantrain train-policy: interrupted") and bar in lines[-2], err
    if ship and phase == "ppo":  # --ship is not saved with the run: the --resume the line suggests would not ship
        assert lines[-1].endswith("; nothing was shipped: add --ship to the command that continues it"), err
    elif ship:  # no policy yet: it did not say that nothing was shipped
        assert lines[-1].endswith("; nothing was shipped"), err
    if phase == "imitation":  # within its first round: the weights are the random ones, no policy to start from
        assert "before it learned anything: nothing to keep; the same command starts again" in lines[-1], err
        assert not (tmp_path / "run" / "interrupted-policy.pt").exists()


@pytest.mark.parametrize(("options", "field"), [
    ({"seed": float("nan")}, "seed"),   # was a RuntimeError from torch.manual_seed
    ({"seed": "x"}, "seed"),
    ({"policy": 5}, "policy"),          # was a TypeError from Path()
    ({"steps": True}, "steps"),
])
def test_ppo_planner_options_name_a_bad_one(options, field):
    from spantrain.errors import SpantrainError
    from spantrain.policies.registry import get_planner
    with pytest.raises(SpantrainError, match=f"ppo: {field}"):
        get_planner("ppo", **options)


def test_load_policy_given_no_path_names_it():
    # load_policy(5) was a TypeError from Path()
    from spantrain.errors import PolicyError
    from spantrain.policies.ppo import load_policy
    with pytest.raises(PolicyError, match="--policy must be the path of a policy file, got 5"):
        load_policy(5)


@pytest.mark.parametrize(("sizes", "reason"), [
    ({"hidden": 30}, r"hidden \(30\) must be a multiple of heads \(4\)"),  # was a ValueError
    ({"hidden": 0}, "hidden must be an integer >= 1, got 0"),  # built a network that learned nothing
    ({"layers": -1}, "layers must be an integer >= 1, got -1"),
    ({"heads": 0}, "heads must be an integer >= 1, got 0"),  # a ZeroDivisionError
    ({"hidden": "64"}, "hidden must be an integer >= 1, got '64'"),  # a TypeError
])
def test_bad_network_sizes_are_one_line_errors(sizes, reason):
    from spantrain.errors import SpantrainError
    from spantrain.policies.extractor import GraphFeaturesExtractor

    with pytest.raises(SpantrainError, match=reason):
        GraphPolicyNet(**sizes)
    with pytest.raises(SpantrainError, match=reason):
        GraphFeaturesExtractor(PlanEnv(SMALL).observation_space, **sizes)


def test_the_graph_policy_names_what_it_cannot_take():
    import gymnasium as gym
    from gymnasium.wrappers import FlattenObservation
    from sb3_contrib import MaskablePPO
    from stable_baselines3 import PPO

    from spantrain.errors import SpantrainError
    from spantrain.policies.extractor import GraphFeaturesExtractor, MaskableGraphPolicy

    env = PlanEnv(SMALL)
    with pytest.raises(SpantrainError, match="unknown argument 'hiden': it takes hidden, layers and heads"):
        GraphFeaturesExtractor(env.observation_space, hiden=64)  # a TypeError from inside SB3
    # a flattened or foreign observation space was a TypeError or KeyError from inside SB3
    with pytest.raises(SpantrainError, match=r"a Box of shape \(\d+,\), not a Dict.*do not flatten"):
        MaskablePPO(MaskableGraphPolicy, FlattenObservation(env), n_steps=16, batch_size=16)
    with pytest.raises(SpantrainError, match="lacks nodes, edges, mask, globals"):
        GraphFeaturesExtractor(gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (3,))}))
    with pytest.raises(SpantrainError, match="for sb3_contrib's MaskablePPO"):  # a TypeError about use_sde
        PPO(MaskableGraphPolicy, env, n_steps=16, batch_size=16)
    net = GraphPolicyNet(hidden=16, layers=1)
    obs, _ = env.reset(seed=0)
    # one observation as the environment gives it was a ValueError from inside
    with pytest.raises(SpantrainError, match=r"nodes must be a 3-dim float32 tensor \(a batch\), got a ndarray"):
        net(obs)
    with pytest.raises(SpantrainError, match=r"got a 2-dim torch\.float32 tensor"):
        net({k: torch.as_tensor(v) for k, v in obs.items()})
    logits, _ = net({k: torch.as_tensor(v)[None] for k, v in obs.items()})
    assert logits.shape == (1, env.action_space.n)


def test_a_maskable_ppo_model_file_names_how_to_make_a_policy_of_it(tmp_path):
    # MaskablePPO.save's zip was "not a spantrain policy file (not a torch file of tensors)"
    from sb3_contrib import MaskablePPO

    from spantrain.errors import PolicyError
    from spantrain.policies.extractor import MaskableGraphPolicy
    from spantrain.policies.ppo import PPOPlanner, load_policy, save_policy

    model = MaskablePPO(MaskableGraphPolicy, PlanEnv(SMALL), n_steps=16, batch_size=16, seed=0, device="cpu",
                        policy_kwargs={"features_extractor_kwargs": {"hidden": 16, "layers": 1}})
    model.save(tmp_path / "model.zip")
    with pytest.raises(PolicyError, match=r"is a stable-baselines3 model file \(MaskablePPO.save\).*"
                                          r"save_policy\(model, PATH\)"):
        load_policy(tmp_path / "model.zip")
    # what the message says to do gives a policy the planner uses
    model = MaskablePPO.load(tmp_path / "model.zip")
    save_policy(model, tmp_path / "policy.pt")
    cluster = generate(6, seed=1, profile="datacenter")
    workload = Workload.from_preset("gpt2-medium")
    plan = PPOPlanner(policy=str(tmp_path / "policy.pt"), samples=1).plan(cluster, workload)
    assert plan.problems(cluster, workload) == []


def test_improve_takes_a_maskable_ppo_model_or_its_policy():
    # a model was "'MaskablePPO' object is not callable", its policy a shape error from inside torch
    from sb3_contrib import MaskablePPO

    from spantrain.env.plan_env import Scenario, simple_start
    from spantrain.errors import PolicyError
    from spantrain.policies.extractor import MaskableGraphPolicy
    from spantrain.policies.ppo import improve

    model = MaskablePPO(MaskableGraphPolicy, PlanEnv(SMALL), n_steps=16, batch_size=16, seed=0, device="cpu",
                        policy_kwargs={"features_extractor_kwargs": {"hidden": 16, "layers": 1}})
    cluster = generate(6, seed=1, profile="datacenter")
    workload = Workload.from_preset("gpt2-medium")
    ev = Evaluator(cluster, workload)
    scenario = Scenario(key=("mine",), cluster=cluster, workload=workload, evaluator=ev,
                        start=simple_start(("mine",), ev))
    plans = [improve(net, scenario, steps=4, samples=1, seed=0) for net in
             (model.policy.graph_net, model.policy, model)]
    assert plans[0].feasible and plans[0].time <= scenario.start.time
    assert plans[1].layout == plans[0].layout == plans[2].layout
    with pytest.raises(PolicyError, match=r"must be a GraphPolicyNet .*got str"):
        improve("policy.pt", scenario, steps=4, samples=1, seed=0)
    # the graph extractor under SB3's own policy: its logits are not that policy's actions
    from spantrain.policies.extractor import GraphFeaturesExtractor

    other = MaskablePPO("MultiInputPolicy", PlanEnv(SMALL), n_steps=16, batch_size=16, device="cpu",
                        policy_kwargs={"features_extractor_class": GraphFeaturesExtractor})
    with pytest.raises(PolicyError, match="got MaskablePPO"):
        improve(other, scenario, steps=4, samples=1, seed=0)


def test_save_policy_takes_a_maskable_ppo_model_and_an_env_config(tmp_path):
    # a model or its policy was "has no attribute 'config'", an EnvConfig "'EnvConfig' object is not iterable"
    from sb3_contrib import MaskablePPO

    from spantrain.errors import PolicyError
    from spantrain.policies.extractor import MaskableGraphPolicy
    from spantrain.policies.ppo import load_policy, load_value_head, save_policy

    model = MaskablePPO(MaskableGraphPolicy, PlanEnv(SMALL), n_steps=16, batch_size=16, seed=0, device="cpu",
                        policy_kwargs={"features_extractor_kwargs": {"hidden": 16, "layers": 1}})
    for i, net in enumerate((model, model.policy)):
        path = save_policy(net, tmp_path / f"p{i}.pt", env=SMALL)
        loaded, env, _ = load_policy(path)
        assert env["max_steps"] == SMALL.max_steps and loaded.config == model.policy.graph_net.config
        want = model.policy.graph_net.state_dict()
        assert all(torch.equal(v, want[k]) for k, v in loaded.state_dict().items())
        assert load_value_head(path).keys() == model.policy.value_net.state_dict().keys()  # can go on training
    with pytest.raises(PolicyError, match="env must be a dict"):
        save_policy(model, tmp_path / "p.pt", env=12)
