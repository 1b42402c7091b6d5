"""The training job's configuration: every bad field named in its error."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from spantrain.errors import SpantrainError
from spantrain.policies.train_config import LIMITS, TrainConfig
from spantrain.workload import PRESETS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("field,value", [("timesteps", -1), ("start_kicks", -2), ("imitation_episodes", 1.5),
                                         ("imitation_rounds", 0), ("imitation_epochs", 0), ("n_envs", 0),
                                         ("hidden", 30)])
def test_bad_field_is_named(field, value):
    with pytest.raises(SpantrainError, match=field):
        TrainConfig(**{field: value})


def test_nothing_to_train_is_an_error_but_imitation_alone_is_fine():
    with pytest.raises(SpantrainError, match="nothing to train"):
        TrainConfig(timesteps=0, imitation_episodes=0)
    config = TrainConfig(timesteps=0, imitation_episodes=10, start_kicks=3)
    assert config.env_config().start_kicks == 3


def test_init_policy_must_be_a_path_and_leave_ppo_steps_to_run():
    with pytest.raises(SpantrainError, match="init_policy"):
        TrainConfig(init_policy="")
    # a starting policy replaces imitation, so PPO steps are all there is to train
    with pytest.raises(SpantrainError, match="nothing to train"):
        TrainConfig(init_policy="runs/policy/interrupted-policy.pt", timesteps=0, imitation_episodes=10)
    assert TrainConfig(init_policy="p.pt", timesteps=10).init_policy == "p.pt"


def test_paths_as_pathlib_gives_them_make_a_run_whose_files_load(tmp_path):
    """`out_dir=Path(...)`, as Python code writes it: the settings in the run's files held a
    PosixPath, which weights-only loading refuses: the run failed at its end loading its own
    ppo-policy.pt ("not a spantrain policy file"), and its resume.pt was "damaged"."""
    import numpy as np

    from spantrain.policies.ppo import load_policy
    from spantrain.policies.resume import ResumeState
    from spantrain.policies.training import train

    config = TrainConfig(timesteps=48, n_envs=2, n_steps=24, batch_size=24, n_epochs=1, max_devices=6,
                         min_devices=4, models=("gpt2-medium",), pool_size=3, eval_scenarios=2, eval_every=48,
                         hidden=16, layers=1, imitation_episodes=0, workers=1, track=False, progress=False,
                         out_dir=tmp_path / "run", cache_dir=tmp_path / "cache")
    summary = train(config)
    load_policy(summary["best"]["policy"])
    assert ResumeState.from_dir(tmp_path / "run").finished
    assert (config.out_dir, config.cache_dir) == (str(tmp_path / "run"), str(tmp_path / "cache"))
    assert TrainConfig(init_policy=tmp_path / "p.pt", timesteps=1).init_policy == str(tmp_path / "p.pt")
    # free-form notes go into the same files: what they cannot hold is named at once
    with pytest.raises(SpantrainError, match=r"^TrainConfig\.extra must hold plain data .*got a float64 at "
                                             r"\['loss'\]\[1\]$"):
        TrainConfig(extra={"loss": [1.0, np.float64(2.0)]})
    with pytest.raises(SpantrainError, match=r"^TrainConfig\.out_dir must be a directory path, got 5$"):
        TrainConfig(out_dir=5)


def test_missing_init_policy_fails_before_any_work(tmp_path):
    from spantrain.policies.training import train

    with pytest.raises(SpantrainError, match=r"init_policy: .*missing\.pt not found"):
        train(TrainConfig(init_policy=str(tmp_path / "missing.pt"), out_dir=str(tmp_path / "run"),
                          cache_dir=str(tmp_path / "cache"), track=False, progress=False))
    assert not (tmp_path / "cache").exists()  # no heuristic starts were computed


def test_an_init_policy_that_is_a_directory_is_named_so(run_cli, tmp_path):
    code, out, err = run_cli("train-policy", "--init-policy", tmp_path, "--out-dir", tmp_path / "run", "--cache-dir",
                             tmp_path / "cache", "--no-track", "--no-progress")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"spantrain train-policy: error: --init-policy {tmp_path} is a directory, not "
                                        f"a policy file: {POLICY_FIX}"], err  # not "not found"
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("field,value,needle", [
    ("seed", -1, "seed must be an integer from 0 to 4294967295, got -1"),
    ("learning_rate", float("nan"), "learning_rate must be a finite number in (0, 1], got nan"),
    ("learning_rate", float("inf"), "learning_rate must be a finite number in (0, 1], got inf"),
    ("ent_coef", float("nan"), "ent_coef must be a finite number in [0, 1], got nan"),
    ("ent_coef", float("inf"), "ent_coef must be a finite number in [0, 1], got inf"),
    ("gamma", 0.0, "gamma must be a finite number in (0, 1], got 0.0"),
    ("max_devices", 100_000, "max_devices must be at most 4096 (the largest generated cluster), got 100000"),
    ("models", ("gpt2-medium", "tiny-custom.yaml"), "models: tiny-custom.yaml: training draws its workloads from "
                                                    "presets only (tiny-gpt, "),
    ("models", (), "models is empty: name at least one preset (tiny-gpt, "),
    ("learning_rate", 100.0, "learning_rate must be a finite number in (0, 1], got 100.0"),
    ("ent_coef", 1e300, "ent_coef must be a finite number in [0, 1], got 1e+300"),
    ("out_dir", "", "out_dir is empty: pass a directory"),
    ("out_dir", None, "out_dir must be a directory path, got None"),  # a TypeError once train() began
    ("cache_dir", "", "cache_dir is empty: pass a directory"),
    ("workers", 100_000, "workers must be at most 256 (each is a process with its own cost model"),
])
def test_bad_value_is_named_with_the_value(field, value, needle):
    with pytest.raises(SpantrainError) as e:
        TrainConfig(**{field: value})
    assert str(e.value).startswith(f"TrainConfig.{needle}"), str(e.value)


@pytest.mark.parametrize("args,error", [
    (["--learning-rate", "-1"], "--learning-rate must be a finite number in (0, 1], got -1.0"),
    (["--learning-rate", "nan"], "--learning-rate must be a finite number in (0, 1], got nan"),
    (["--gamma", "0"], "--gamma must be a finite number in (0, 1], got 0.0"),
    (["--ent-coef", "inf"], "--ent-coef must be a finite number in [0, 1], got inf"),
    (["--seed", "-1"], "--seed must be an integer from 0 to 4294967295, got -1"),
    (["--n-envs", "0"], "--n-envs must be a positive integer, got 0"),
    (["--batch-size", "1"], "--batch-size 1 leaves a minibatch of one sample from each rollout of --n-steps x "
                            "--n-envs = 512 steps (its normalized advantages are NaN): pick a batch size of 2 or "
                            "more that divides 512"),
    (["--n-steps", "24", "--n-envs", "2", "--batch-size", "47"], "--batch-size 47 leaves a minibatch of one sample"),
    (["--n-steps", "1", "--n-envs", "1"], "--n-steps x --n-envs must be at least 2 (PPO's advantages over a "
                                          "one-step rollout are NaN), got 1 x 1"),
    (["--max-devices", "100000"], "--max-devices must be at most 4096 (the largest generated cluster), got 100000"),
    (["--min-devices", "40"], "--min-devices (40) is above --max-devices (32): raise --max-devices or lower "
                              "--min-devices"),
    # it blamed --min-devices, which the user had not given
    (["--max-devices", "1"], "--min-devices (4) is above --max-devices (1)"),
    (["--min-devices", "1"], "--min-devices must be at least 2, got 1"),
    (["--workers", "5000"], "--workers must be at most 256"),
    (["--models", ","], "--models is empty: name at least one preset"),
    (["--models", ""], "--models is empty: name at least one preset"),
    # each ran out of memory with a traceback, diverged to NaN, or would never have ended
    (["--learning-rate", "100"], "--learning-rate must be a finite number in (0, 1], got 100.0"),
    (["--n-steps", "99999999999"], "--n-steps must be at most 100000 (PPO keeps every step of a rollout in "
                                   "memory), got 99999999999"),
    (["--n-steps", "1000", "--n-envs", "200"], "--n-steps x --n-envs must be at most 100000 (PPO keeps every step "
                                               "of a rollout in memory), got 1000 x 200"),
    (["--hidden", "100000"], "--hidden must be at most 1024 ("),
    (["--n-envs", "100000"], "--n-envs must be at most 256 ("),
    (["--layers", "99999999999"], "--layers must be at most 32 ("),
    (["--start-kicks", "99999999999"], "--start-kicks must be at most 100 ("),
    (["--pool-size", "99999999999"], "--pool-size must be at most 100000 ("),
    (["--eval-scenarios", "99999999999"], "--eval-scenarios must be at most 10000 ("),
    (["--timesteps", "99999999999"], "--timesteps must be at most 1000000000 ("),
    (["--eval-every", "99999999999"], "--eval-every must be at most 1000000000 (the largest --timesteps)"),
    (["--out-dir", ""], "--out-dir is empty: pass a directory"),
    (["--cache-dir", ""], "--cache-dir is empty: pass a directory"),
    (["--models", "FILE"], "--models: FILE: training draws its workloads from presets only"),
    (["--timesteps", "0", "--imitation-episodes", "0"], "--timesteps and --imitation-episodes are both 0"),
    (["--out-dir", "FILE"], "--out-dir FILE is a file, not a directory"),
    (["--cache-dir", "FILE"], "--cache-dir FILE is a file, not a directory"),
])
def test_train_policy_errors_name_the_flag(run_cli, tmp_path, monkeypatch, args, error):
    from spantrain.policies import training

    def no_training(config):
        raise AssertionError("the bad flag passed: training started")

    monkeypatch.setattr(training, "train", no_training)
    workload = tmp_path / "tiny-custom.yaml"  # an existing file: a workload, not a directory
    workload.write_text((ROOT / "examples" / "tiny-custom.yaml").read_text())
    code, out, err = run_cli("train-policy", "--no-track", "--no-progress",
                             *[str(workload) if a == "FILE" else a for a in args])
    assert code == 2 and out == ""
    assert err.strip().startswith(f"spantrain train-policy: error: {error.replace('FILE', str(workload))}"), err
    assert "TrainConfig" not in err and "EnvConfig" not in err and len(err.strip().splitlines()) == 1


POLICY_FIX = ("pass a policy file written by `spantrain train-policy` (a run's best-policy.pt, ppo-policy.pt or a "
              "checkpoint)")


@pytest.mark.parametrize("case", ["spec", "text", "truncated", "resume state"])
def test_init_policy_that_is_not_a_policy_is_one_line_without_planner_advice(run_cli, tmp_path, case):
    import dataclasses

    import torch

    from spantrain.policies.ppo import SHIPPED_POLICY
    from spantrain.policies.resume import ResumeState

    bad = tmp_path / "bad.pt"
    if case == "spec":
        bad = ROOT / "examples" / "cee-demo.yaml"
    elif case == "text":
        bad.write_text("i am text\n")  # was "not a spantrain policy file (KeyError: 105)"
    elif case == "truncated":  # was torch's PytorchStreamReader message
        bad.write_bytes(SHIPPED_POLICY.read_bytes()[:1000])
    else:  # was "is unusable (KeyError: 'net'); retrain it with `spantrain train-policy`"
        (tmp_path / "run1").mkdir()
        bad = ResumeState(config=dataclasses.asdict(TrainConfig()), num_timesteps=48, n_updates=1, policy={},
                          optimizer={}, torch_rng=torch.get_rng_state()).save(tmp_path / "run1")
    code, out, err = run_cli("train-policy", "--init-policy", bad, "--out-dir", tmp_path / "run", "--cache-dir",
                             tmp_path / "cache", "--no-track", "--no-progress")
    assert code == 2 and out == ""
    expected = {"spec": f"is not a spantrain policy file (not a torch file of tensors): {POLICY_FIX}",
                "text": f"is not a spantrain policy file (not a torch file of tensors): {POLICY_FIX}",
                "truncated": f"is damaged or truncated: {POLICY_FIX}",
                "resume state": f"is a training run's resume state, not a policy file: continue that run with "
                                f"--resume --out-dir {tmp_path / 'run1'}; or pass the run's best-policy.pt or "
                                "ppo-policy.pt from the same directory (written when it ends)"}[case]
    assert err.strip().splitlines() == [f"spantrain train-policy: error: --init-policy {bad} {expected}"], err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()  # nothing was started


TINY = ["--timesteps", "48", "--n-envs", "2", "--n-steps", "24", "--batch-size", "24", "--n-epochs", "1",
        "--max-devices", "6", "--min-devices", "4", "--models", "gpt2-medium", "--pool-size", "2", "--eval-scenarios",
        "1", "--eval-every", "48", "--hidden", "16", "--layers", "1", "--imitation-episodes", "1",
        "--imitation-rounds", "1", "--imitation-epochs", "1", "--workers", "1", "--no-progress"]
"""A training run of seconds (should a check under test let it start)."""


def _unwritable(path: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=path):
            return False
    except OSError:
        return True


@pytest.fixture
def unwritable_dir(tmp_path):
    """An existing directory no file can be created in (root ignores modes: /sys then)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if _unwritable(ro):
            yield ro
        elif Path("/sys").is_dir() and _unwritable(Path("/sys")):
            yield Path("/sys")
        else:
            pytest.skip("no unwritable directory here")
    finally:
        ro.chmod(0o700)


def test_an_out_dir_that_cannot_be_written_fails_before_any_work(run_cli, tmp_path, unwritable_dir):
    code, out, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", unwritable_dir,
                             "--cache-dir", tmp_path / "cache")
    assert code == 2 and out == ""
    assert err.strip().startswith(f"spantrain train-policy: error: --out-dir {unwritable_dir} cannot be written ("), err
    assert err.strip().endswith("): pass a directory this run can write") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "cache").exists()  # no heuristic starts were computed


@pytest.mark.parametrize("previous", ["best-policy.pt", "interrupted-policy.pt", "checkpoints/policy-0.pt"])
@pytest.mark.parametrize("resumable", [True, False])
def test_an_out_dir_holding_another_run_is_refused_before_any_work(run_cli, tmp_path, previous, resumable):
    run = tmp_path / "run"
    (run / previous).parent.mkdir(parents=True)
    (run / previous).write_bytes(b"a previous run's policy")
    if resumable:
        (run / "resume.pt").write_bytes(b"its state")
    code, out, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", run, "--cache-dir", tmp_path / "cache")
    assert code == 2 and out == ""
    # --resume only where it would find something: a run stopped before PPO has no resume.pt
    fix = ("continue it with --resume, pass another directory, or remove that one to start anew" if resumable else
           f"stopped before PPO began, with nothing to resume: pass another directory (with --init-policy "
           f"{run / previous} to start from its weights), or remove that one to start anew")
    assert err.strip().splitlines() == [f"spantrain train-policy: error: --out-dir {run} already holds a training run "
                                        f"({run / previous}){':' if resumable else ''} {fix}"], err
    assert (run / previous).read_bytes() == b"a previous run's policy"
    assert sorted(p for p in run.rglob("*") if p.is_file()) == sorted(
        [run / previous] + ([run / "resume.pt"] if resumable else []))  # nothing written beside it
    assert not (tmp_path / "cache").exists()  # no heuristic starts were computed


def test_a_cache_dir_that_cannot_be_made_fails_before_anything_is_created(run_cli, tmp_path, unwritable_dir):
    cache = unwritable_dir / "nope"
    code, out, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", tmp_path / "run", "--cache-dir", cache)
    assert code == 2 and out == ""
    # was "error: /proc/nope: No such file or directory", after the out-dir was made
    assert err.strip().startswith(f"spantrain train-policy: error: --cache-dir {cache} cannot be written ("), err
    assert err.strip().endswith("): pass a directory this run can write") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists() and not cache.exists()


def test_a_second_run_in_the_same_out_dir_is_refused_while_the_first_runs(run_cli, tmp_path):
    import os

    from spantrain.runtime.launcher import run_dir_lock

    run = tmp_path / "run"
    with run_dir_lock(run):  # the first run, which has written no policy file yet
        code, out, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", run, "--cache-dir",
                                 tmp_path / "cache")
        assert code == 2 and out == ""
        assert err.strip().splitlines() == [f"spantrain train-policy: error: --out-dir {run} is in use by another "
                                            f"spantrain run (pid {os.getpid()}): wait for it to finish, or pass "
                                            "another --out-dir"], err
        # the first run has no resume.pt yet: "nothing to resume ... remove it" would send the user astray
        code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--no-track")
        assert code == 2 and err.strip().splitlines() == [
            f"spantrain train-policy: error: --out-dir {run} is in use by another spantrain run (pid {os.getpid()}): "
            "wait for it to finish, or pass another --out-dir"], err
        # from PPO's start on the live run has policy files: still "in use", not "resume it or remove it"
        (run / "checkpoints").mkdir()
        for name in ("resume.pt", "checkpoints/policy-0.pt"):
            (run / name).write_bytes(b"live")
        code, _, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", run, "--cache-dir",
                               tmp_path / "cache")
        assert code == 2 and "is in use by another spantrain run" in err, err
    assert not (tmp_path / "cache").exists()
    for name in ("resume.pt", "checkpoints/policy-0.pt"):
        (run / name).unlink()
    (run / "checkpoints").rmdir()
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--no-track")
    assert code == 2 and "nothing to resume" in err  # once it is gone, its lock file alone is no previous run
    assert "start a run there without --resume" in err


def test_init_policy_of_another_shape_names_the_flags_to_pass(run_cli, tmp_path):
    from spantrain.policies.ppo import SHIPPED_POLICY

    code, out, err = run_cli("train-policy", "--init-policy", SHIPPED_POLICY, "--hidden", "32", "--out-dir",
                             tmp_path / "run", "--cache-dir", tmp_path / "cache", "--no-track", "--no-progress")
    assert code == 2 and out == ""
    # was "has {'hidden': 64, 'layers': 3}, this run {'hidden': 32, ...}; pass the file's --hidden and --layers"
    assert err.strip().splitlines() == [f"spantrain train-policy: error: --init-policy: {SHIPPED_POLICY} has hidden 64 "
                                        "and layers 3, this run hidden 32 and layers 3; pass --hidden 64 --layers 3"]


def test_ship_into_a_package_that_cannot_be_written_fails_before_any_work(run_cli, tmp_path, monkeypatch,
                                                                          unwritable_dir):
    from spantrain.policies import ppo

    shipped = unwritable_dir / "ppo-policy.pt"
    monkeypatch.setattr(ppo, "SHIPPED_POLICY", shipped)
    code, out, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", tmp_path / "run", "--cache-dir",
                             tmp_path / "cache", "--ship")
    assert code == 2 and out == ""
    assert err.strip().startswith(f"spantrain train-policy: error: --ship: the package's policy directory "
                                  f"{unwritable_dir} cannot be written ("), err
    assert err.strip().endswith(f"): train without --ship, then copy best-policy.pt to {shipped} as a user who can")
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()  # nothing was trained


def test_a_wandb_mode_wandb_does_not_know_fails_before_any_work(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "ofline")
    code, out, err = run_cli("train-policy", *TINY, "--out-dir", tmp_path / "run", "--cache-dir", tmp_path / "cache")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["spantrain train-policy: error: WANDB_MODE=ofline is not a W&B mode: set it "
                                        "to online, offline or disabled, or unset it"], err
    assert not (tmp_path / "cache").exists()  # no heuristic starts were computed
    code, _, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", tmp_path / "run", "--cache-dir",
                           tmp_path / "cache")
    assert code == 0, err  # untracked, W&B's settings do not matter


@pytest.mark.parametrize("field", sorted(LIMITS))
def test_every_limit_is_enforced_and_shown_in_the_help(run_cli, field):
    most, _ = LIMITS[field]
    with pytest.raises(SpantrainError, match=rf"^TrainConfig\.{field} must be at most {most} \("):
        TrainConfig(**{field: most + 1})
    code, out, _ = run_cli("train-policy", "--help")
    flag = "--" + field.replace("_", "-")
    text = " ".join(out.split())
    text = text[text.index("options:"):]  # past the usage lines
    entry = text[text.index(flag + " "):]
    assert code == 0 and f"at most {most:,}" in entry[:entry.find(" --", len(flag))], (flag, entry[:300])


def test_help_says_what_a_user_needs(run_cli):
    from spantrain.policies.train_config import ATTENTION_HEADS, MAX_WORKERS

    code, out, _ = run_cli("train-policy", "--help")
    text = " ".join(out.split())
    assert code == 0 and f"a multiple of {ATTENTION_HEADS}, its attention heads" in text  # not a constant's name
    assert f"at most {MAX_WORKERS};" in text and "learning rate of PPO (fine-tuning the imitation result: small " \
        "steps; above 0, at most 1)" in text
    # plain words and numbers, no names of the code
    assert "`MAX_" not in text and "EnvConfig" not in text and "spantrain.policies" not in text
    # what --out-dir holds
    assert "summary.json, the final evaluation's rows (final_eval.csv), the evaluation plot and the W&B run go " \
           "here" in text


def test_a_rollout_that_does_not_fit_in_memory_is_one_line(run_cli, tmp_path, monkeypatch):
    from sb3_contrib import MaskablePPO

    def out_of_memory(self, *args, **kwargs):
        # what NumPy's rollout buffer raised for --n-envs 100000 (`_ArrayMemoryError` is one)
        raise MemoryError("Unable to allocate 171. GiB for an array")

    monkeypatch.setattr(MaskablePPO, "__init__", out_of_memory)
    code, out, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", tmp_path / "run", "--cache-dir",
                             tmp_path / "cache")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == ["spantrain train-policy: error: PPO's rollout buffer and network do not fit in "
                                        "memory (--n-steps x --n-envs = 48 steps padded to --max-devices 6, --hidden "
                                        "16, --layers 1): lower one of them"], err


def test_ctrl_c_during_the_heuristic_starts_says_what_is_kept(run_cli, tmp_path, monkeypatch):
    from spantrain.policies.starts import HeuristicStarts

    def interrupted(self, keys, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(HeuristicStarts, "prepare", interrupted)
    code, out, err = run_cli("train-policy", *TINY, "--no-track", "--out-dir", tmp_path / "run", "--cache-dir",
                             tmp_path / "cache")
    # was "spantrain train-policy: interrupted", and the README promised more
    assert code == 130 and out == "" and err.strip().splitlines() == [
        "spantrain train-policy: interrupted during the heuristic starts, before any training; the starts computed so "
        f"far stay cached in {tmp_path / 'cache'}: the same command again continues from them"], err


def test_a_pool_whose_models_fit_none_of_its_clusters_says_what_to_widen(run_cli, tmp_path):
    # it said "could not draw a scenario with a feasible starting plan in 50 tries", and no more
    args = [a if a != "gpt2-medium" else "llama2-7b" for a in TINY]
    code, out, err = run_cli("train-policy", *args, "--no-track", "--out-dir", tmp_path / "run", "--cache-dir",
                             tmp_path / "cache")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    # and then named the fields, where every other message names the flags
    assert err.strip().endswith("the models (llama2-7b) fit none of the clusters of --min-devices (4) to "
                                "--max-devices (6) devices drawn; allow larger clusters (--max-devices) or smaller "
                                "models (--models)"), err


def test_a_stop_inside_a_compiled_kernels_first_call_stops_the_run_as_any_stop(run_cli, tmp_path, monkeypatch):
    """SIGHUP landed while numba loaded a kernel: "SystemError: ... returned a result with an exception
    set" ended the run with a traceback (exit 1), its state unsaved."""
    from spantrain.env.plan_env import PlanEnv
    from spantrain.runtime.stop_signals import Terminated

    real_step = PlanEnv.step
    calls = {"n": 0}

    def wrapped_stop(self, action):
        calls["n"] += 1
        if calls["n"] == 10:
            try:
                raise Terminated("by SIGHUP")
            except Terminated as e:
                raise SystemError("CPUDispatcher(...) returned a result with an exception set") from e
        return real_step(self, action)

    monkeypatch.setattr(PlanEnv, "step", wrapped_stop)
    code, _, err = run_cli("train-policy", *TINY, "--imitation-episodes",
                             "0", "--no-track", "--out-dir", tmp_path / "run", "--cache-dir", tmp_path / "cache")
    assert code == 130 and "Traceback" not in err and "interrupted by SIGHUP during PPO step" in err, err


def test_every_bad_field_is_named_at_once():
    # it stopped at the first: fixing a config took a run per field
    with pytest.raises(SpantrainError) as e:
        TrainConfig(n_envs=0, hidden=30, seed=-1, gamma=2.0, models=5, out_dir="")
    assert str(e.value) == ("TrainConfig.n_envs must be a positive integer, got 0; "
                            "TrainConfig.seed must be an integer from 0 to 4294967295, got -1; "
                            "TrainConfig.hidden must be a multiple of 4 (the encoder's attention heads), got 30; "
                            "TrainConfig.models must be a tuple of preset names (" + ", ".join(PRESETS) + "), got 5; "
                            "TrainConfig.gamma must be a finite number in (0, 1], got 2.0; "
                            "TrainConfig.out_dir is empty: pass a directory")
    # a rule between fields is left out while a field it reads is bad: n_envs=0 says so, not also the rollout
    assert TrainConfig(n_steps=2, n_envs=1, batch_size=2).problems() == []
    assert [p.split(" ")[0] for p in TrainConfig.problems(_unchecked(n_steps=1, n_envs=0, batch_size=1))] == [
        "TrainConfig.n_envs"]


def _unchecked(**fields):
    """A TrainConfig whose fields are set without validation (to call `problems` on bad ones)."""
    config = TrainConfig()
    for name, value in fields.items():
        object.__setattr__(config, name, value)  # frozen
    return config


def test_train_policy_names_every_bad_flag_at_once(run_cli):
    code, out, err = run_cli("train-policy", "--no-track", "--n-envs", "0", "--seed", "5000000000", "--gamma", "2")
    assert code == 2 and out == ""
    assert err == ("spantrain train-policy: error: --n-envs must be a positive integer, got 0; --seed must be an "
                   "integer from 0 to 4294967295, got 5000000000; --gamma must be a finite number in (0, 1], got 2.0\n")


def test_train_takes_a_dict_of_fields_and_names_a_wrong_argument(tmp_path):
    from spantrain.policies.training import train

    # were AttributeErrors ('dict' object has no attribute 'cache_dir'); a dict's fields are checked as TrainConfig's
    with pytest.raises(SpantrainError, match="train: unknown TrainConfig field 'timestep'"):
        train({"timestep": 10, "out_dir": str(tmp_path)})
    with pytest.raises(SpantrainError, match=r"TrainConfig\.timesteps must be an integer >= 0"):
        train({"timesteps": -1, "out_dir": str(tmp_path)})
    with pytest.raises(SpantrainError, match=r"train takes a TrainConfig .*got None"):
        train(None)
    assert not any(tmp_path.iterdir())
