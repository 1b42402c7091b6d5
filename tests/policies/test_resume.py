"""`spantrain train-policy --resume`: an interrupted or finished run continues from its state."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from spantrain.env.plan_env import PlanEnv
from spantrain.errors import SpantrainError
from spantrain.policies.resume import RESUME_FILE, ResumeState
from spantrain.policies.train_config import TrainConfig

TINY = ["--n-envs", "2", "--n-steps", "24", "--batch-size", "24", "--n-epochs", "1", "--max-devices", "6",
        "--min-devices", "4", "--models", "gpt2-medium", "--pool-size", "3", "--eval-scenarios", "2",
        "--eval-every", "48", "--hidden", "16", "--layers", "1", "--imitation-episodes", "0", "--no-progress",
        "--workers", "1"]
"""PPO from a random policy: rollouts of 2 x 24 steps, an evaluation every 48."""


def _state(**changes) -> ResumeState:
    config = TrainConfig(timesteps=96, hidden=16, layers=1)
    values = {"config": dataclasses.asdict(config), "num_timesteps": 48, "n_updates": 1,
              "policy": {"w": torch.ones(2)}, "optimizer": {"state": {}},
              "torch_rng": torch.get_rng_state(), "curve": [{"steps": 48, "geomean_ratio": 1.0}], **changes}
    assert TrainConfig.from_dict(values["config"]) == config
    return ResumeState(**values)


def test_state_round_trips_through_its_file_and_leaves_no_temporary(tmp_path):
    state = _state(best={"steps": 48, "geomean_ratio": 1.0, "policy": "p.pt"}, wandb_id="abc")
    path = state.save(tmp_path)
    assert path == tmp_path / RESUME_FILE and [p.name for p in tmp_path.iterdir()] == [RESUME_FILE]
    again = ResumeState.from_dir(tmp_path)
    assert again.config == state.config and again.curve == state.curve and again.wandb_id == "abc"
    assert torch.equal(again.policy["w"], state.policy["w"]) and torch.equal(again.torch_rng, state.torch_rng)


def test_config_from_its_dict_rebuilds_tuples_and_names_unknown_keys():
    config = TrainConfig(models=("gpt2-xl",), timesteps=10)
    as_json = json.loads(json.dumps(dataclasses.asdict(config)))
    assert TrainConfig.from_dict(as_json) == config
    with pytest.raises(SpantrainError, match="TrainConfig has no field colour"):
        TrainConfig.from_dict({**as_json, "colour": 1})


def test_only_how_long_and_how_a_run_trains_may_change(tmp_path):
    state = _state()
    run = TrainConfig.from_dict(state.config)
    state.check_config(TrainConfig.from_dict({**state.config, "timesteps": 500, "workers": 2, "track": False,
                                              "resume": True, "eval_every": 7}))
    with pytest.raises(SpantrainError) as e:
        state.check_config(TrainConfig.from_dict({**state.config, "learning_rate": 0.5, "gamma": 0.5}))
    assert ("TrainConfig.learning_rate 0.5 (the run's: 0.0001); TrainConfig.gamma 0.5 (the run's: 0.95)"
            in str(e.value))
    with pytest.raises(SpantrainError) as e:  # as typed, not "('gpt2-xl',) (the run's: ('gpt2-medium', ...))"
        state.check_config(TrainConfig.from_dict({**state.config, "models": ("gpt2-xl",)}))
    assert "TrainConfig.models gpt2-xl (the run's: gpt2-medium,gpt2-xl,llama2-7b); drop them" in str(e.value)
    _state(finished=True).check_config(run)  # 48 of 96 steps: the rest is trained
    with pytest.raises(SpantrainError, match=r"finished at PPO step 96: pass TrainConfig\.timesteps above that"):
        _state(finished=True, num_timesteps=96).check_config(run)
    with pytest.raises(SpantrainError, match=r"TrainConfig\.init_policy and TrainConfig\.resume"):
        TrainConfig(resume=True, init_policy="p.pt")


@pytest.mark.parametrize("case", ["missing", "empty", "imitation only", "damaged", "text", "foreign", "a file",
                                  "empty name"])
def test_nothing_to_resume_is_one_line_naming_the_fix(run_cli, tmp_path, case):
    run = tmp_path / "run"
    if case == "a file":
        run.write_text("not a directory")
    elif case not in ("missing", "empty name"):
        run.mkdir()
    if case == "imitation only":
        (run / "interrupted-policy.pt").write_bytes(b"weights")
    if case == "damaged":
        (run / RESUME_FILE).write_bytes(b"\x80\x02 half a file")
    if case == "text":  # was "is damaged (KeyError: 105)"
        (run / RESUME_FILE).write_text("hi\n")  # a short text: torch raises KeyError
    if case == "foreign":
        torch.save({"format": 99}, run / RESUME_FILE)
    code, out, err = run_cli("train-policy", "--resume", "--out-dir", "" if case == "empty name" else run,
                             "--no-track")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    expected = {"missing": f"nothing to resume in {run}: it does not exist; start a run there without --resume",
                "empty": f"it holds no {RESUME_FILE}, which a run writes from PPO's start on",
                "imitation only": "start anew without --resume, in another --out-dir or after removing this one",
                "damaged": f"{run / RESUME_FILE} is damaged (",
                "text": f"{run / RESUME_FILE} is damaged (not a torch file of tensors and plain data); start a new "
                        "run from one of its policy files instead",
                "foreign": "is not a resume state of this spantrain version; start a new run from one of its "
                           "policy files instead (--init-policy, in another --out-dir)",
                # was "nothing to resume in ...: it does not exist"
                "a file": f"--out-dir {run} is a file, not a directory: pass the directory of the run to resume",
                "empty name": "error: --out-dir is empty: pass a directory"}[case]
    assert expected in err and "Traceback" not in err, err


def test_a_state_of_another_version_is_one_line_and_left_as_it_was(run_cli, tmp_path):
    """Settings this version does not know, or weights its network does not take: one line
    naming the file and what to do, not "TrainConfig has no field" or torch's traceback."""
    run = tmp_path / "run"
    code, _, err = run_cli("train-policy", "--timesteps", "48", "--out-dir", run, "--cache-dir",
                           tmp_path / "cache", "--no-track", *TINY)
    assert code == 0, err
    state = ResumeState.from_dir(run)
    for case in ("unknown setting", "other network"):
        config = ({**state.config, "colour": 1} if case == "unknown setting" else
                  {**state.config, "hidden": 32})  # the weights are hidden 16's
        dataclasses.replace(state, config=config).save(run)
        before = (run / RESUME_FILE).read_bytes()
        code, out, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "96")
        assert code == 2 and out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"--resume: {run / RESUME_FILE} " in err and "start a new run from one of its policy files" in err, err
        assert (run / RESUME_FILE).read_bytes() == before


def test_a_run_whose_best_policy_was_moved_away_resumes_to_its_end(run_cli, tmp_path):
    """A finished run's best-policy.pt copied away, then trained further: the end of the run
    loaded the missing file and failed after all the training, on every resume."""
    run = tmp_path / "run"
    code, _, err = run_cli("train-policy", "--timesteps", "48", "--out-dir", run, "--cache-dir",
                           tmp_path / "cache", "--no-track", *TINY)
    assert code == 0, err
    state = ResumeState.from_dir(run)
    assert state.best["policy"] == "best-policy.pt"
    # a best the later evaluations do not reach, as a run's best often is
    dataclasses.replace(state, best={**state.best, "geomean_ratio": 99.0}).save(run)
    (run / "best-policy.pt").rename(tmp_path / "kept.pt")
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "96")
    assert code == 0, err
    assert (f"note: the run's best policy so far (step 48, best-policy.pt) is no longer in {run}: the best is "
            "chosen from the evaluations from here on") in err, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best"]["steps"] == 96 and (run / "best-policy.pt").is_file()
    assert ResumeState.from_dir(run).finished


@pytest.mark.parametrize("where", [".", "checkpoints"])
def test_a_run_whose_directory_cannot_be_written_is_refused_before_any_work(run_cli, tmp_path, where):
    """A new run's --out-dir is checked before any work; a resumed one's failed at its first save,
    with torch's traceback ("open file failed with strerror: ...")."""
    run = tmp_path / "run"
    code, _, err = run_cli("train-policy", "--timesteps", "48", "--out-dir", run, "--cache-dir",
                           tmp_path / "cache", "--no-track", *TINY)
    assert code == 0, err
    locked = run / where
    before = (run / RESUME_FILE).read_bytes()
    locked.chmod(0o500)
    immutable = False
    try:
        try:
            with open(locked / "probe", "w"):  # root ignores modes: the immutable flag holds it too
                pass
        except OSError:
            pass
        else:
            (locked / "probe").unlink()
            immutable = subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode == 0
            if not immutable:
                pytest.skip("no unwritable directory here")
        code, out, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "96")
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        locked.chmod(0o700)
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith(
        f"spantrain train-policy: error: --out-dir {locked} cannot be written ("), err
    assert err.strip().endswith("): pass a directory this run can write"), err
    assert (run / RESUME_FILE).read_bytes() == before


def test_the_last_update_is_a_checkpoint_on_the_curve_between_evaluations(run_cli, tmp_path):
    """A run that ends between two --eval-every steps (here before the first): its final
    evaluation was on neither the curve nor its plot, and no checkpoint held its last update."""
    run = tmp_path / "run"
    code, _, err = run_cli("train-policy", "--timesteps", "96", "--out-dir", run, "--cache-dir",
                           tmp_path / "cache", "--no-track", *TINY, "--eval-every", "1000")
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert [p["steps"] for p in summary["curve"]] == [96]
    assert summary["curve"][0]["geomean_ratio"] == summary["final"]["geomean_ratio"]
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["policy-96.pt"]
    assert (run / "sample_efficiency.png").is_file()
    # trained further: the next part's last update joins the same curve
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "144")
    assert code == 0, err
    assert [p["steps"] for p in json.loads((run / "summary.json").read_text())["curve"]] == [96, 144]


def _ctrl_c_in_the_second_rollout(patch) -> None:
    """Ctrl-C at the 20th step of PPO's second rollout (the 10th of 2 environments: after PPO step
    66), not in a held-out evaluation's (at a rollout's start); `patch`: a monkeypatch."""
    from sb3_contrib import MaskablePPO

    real_step, real_collect = PlanEnv.step, MaskablePPO.collect_rollouts
    calls = {"rollouts": 0, "steps": 0}
    training_envs: set[int] = set()

    def count_rollouts(self, *args, **kwargs):
        calls["rollouts"] += 1
        training_envs.update(id(e.unwrapped) for e in self.env.envs)
        return real_collect(self, *args, **kwargs)

    def ctrl_c(self, action):
        if calls["rollouts"] == 2 and id(self) in training_envs:
            calls["steps"] += 1
            if calls["steps"] == 20:
                raise KeyboardInterrupt
        return real_step(self, action)

    patch.setattr(PlanEnv, "step", ctrl_c)
    patch.setattr(MaskablePPO, "collect_rollouts", count_rollouts)


@pytest.mark.slow
def test_an_interrupted_run_resumes_where_its_last_update_left_it(run_cli, tmp_path, monkeypatch, wandb_records):
    from sb3_contrib import MaskablePPO

    run = tmp_path / "run"
    with monkeypatch.context() as m:
        _ctrl_c_in_the_second_rollout(m)
        code, _, err = run_cli("train-policy", "--timesteps", "144", "--out-dir", run, "--cache-dir",
                               tmp_path / "cache", *TINY)
    assert code == 130 and "during PPO step 66 of 144" in err, err
    assert f"(continue the run with --resume --out-dir {run})" in err, err
    saved = ResumeState.from_dir(run)
    # the state is that of the last update; the cut rollout's steps were not learned from
    assert not saved.finished and saved.num_timesteps == 48 and saved.n_updates == 1
    assert [p["steps"] for p in saved.curve] == [48]
    first_id = saved.wandb_id
    assert first_id

    # the command needs no other flag: the run's own settings come back, Adam's moments with them
    seen = {}
    real_learn = MaskablePPO.learn

    def spy(self, *args, **kwargs):
        seen.update(optimizer=copy.deepcopy(self.policy.optimizer.state_dict()), steps=self.num_timesteps,
                    policy={k: v.clone() for k, v in self.policy.state_dict().items()})
        return real_learn(self, *args, **kwargs)

    monkeypatch.setattr(MaskablePPO, "learn", spy)
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run)
    assert code == 0, err
    assert f"train-policy: resuming {run} at PPO step {saved.num_timesteps} (its last update), W&B run {first_id}" \
        in err, err
    assert seen["steps"] == saved.num_timesteps
    for key, value in saved.policy.items():
        assert torch.equal(seen["policy"][key], value), key
    moments = [s["exp_avg"] for s in seen["optimizer"]["state"].values()]
    assert moments and all(torch.equal(a, s["exp_avg"]) for a, s in
                           zip(moments, saved.optimizer["state"].values(), strict=True))
    summary = json.loads((run / "summary.json").read_text())
    # one curve over both parts: every evaluation once, up to the step budget
    assert [p["steps"] for p in summary["curve"]] == [48, 96, 144]
    assert summary["final"]["cases"] == 4 and (run / "best-policy.pt").exists()
    # both parts log to one W&B run: offline, two directories under its id
    parts = sorted((run / "wandb" / "wandb").glob("offline-run-*"))
    assert len(parts) == 2 and all(p.name.split("-")[-1 if p.name.endswith(first_id) else -2] == first_id
                                   for p in parts), parts
    # the finished run's summary no longer says it was interrupted (W&B keeps a resumed run's summary)
    key = b"\x0a\x0binterrupted\x82\x01"
    first, second = (wandb_records(p, key) for p in parts)
    assert key in first and key + b"\x05false" not in first  # the phase it was stopped in
    assert key + b"\x05false" in second

    # a finished run trains further only when asked for more steps, with its own settings
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run)
    assert code == 2 and "finished at PPO step 144: pass --timesteps above that" in err, err
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "192", "--learning-rate",
                           "0.5")
    assert code == 2 and "--learning-rate 0.5 (the run's: 0.0001)" in err and "Traceback" not in err, err
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "192", "--no-track")
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert [p["steps"] for p in summary["curve"]] == [48, 96, 144, 192] and ResumeState.from_dir(run).finished


@pytest.mark.slow
def test_ctrl_c_in_a_last_rollout_past_timesteps_counts_the_steps_ppo_runs(run_cli, tmp_path, monkeypatch):
    # PPO runs whole rollouts (2 x 24 steps here): "PPO step 66 of 60" read as a miscount
    _ctrl_c_in_the_second_rollout(monkeypatch)
    code, _, err = run_cli("train-policy", "--timesteps", "60", "--out-dir", tmp_path / "run", "--cache-dir",
                           tmp_path / "cache", "--no-track", *TINY)
    assert code == 130, err
    assert "during PPO step 66 of 96 (--timesteps 60 rounded up to whole rollouts of 48 steps);" in err, err


def test_an_evaluation_cut_off_by_ctrl_c_is_made_when_the_run_resumes(run_cli, tmp_path, monkeypatch):
    # the resumed run counted its own step as evaluated: the curve had a gap there for good
    import spantrain.policies.training as training

    run, real = tmp_path / "run", training.evaluate_policy

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "evaluate_policy", ctrl_c)  # the first evaluation is step 48's
    code, _, err = run_cli("train-policy", "--timesteps", "96", "--out-dir", run, "--cache-dir", tmp_path / "cache",
                           "--no-track", *TINY)
    assert code == 130, err
    saved = ResumeState.from_dir(run)
    assert saved.num_timesteps == 48 and saved.curve == []
    monkeypatch.setattr(training, "evaluate_policy", real)
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--no-track")
    assert code == 0, err
    assert [p["steps"] for p in json.loads((run / "summary.json").read_text())["curve"]] == [48, 96]
    assert (run / "checkpoints" / "policy-48.pt").exists()


@pytest.mark.slow
def test_ctrl_c_during_an_update_keeps_the_state_of_the_update_before(run_cli, tmp_path, monkeypatch):
    """PPO updates the weights and Adam in place: a state saved mid-update would pair half an
    update with the previous one's counters."""
    from sb3_contrib import MaskablePPO

    run = tmp_path / "run"
    real_train = MaskablePPO.train
    seen = {"calls": 0}

    def half_an_update_then_ctrl_c(self):
        seen["calls"] += 1
        if seen["calls"] == 2:  # the second update: its first gradient steps are done, then Ctrl-C
            seen["before"] = {k: v.clone() for k, v in self.policy.state_dict().items()}
            with torch.no_grad():
                for p in self.policy.parameters():
                    p.add_(1.0)
            raise KeyboardInterrupt
        return real_train(self)

    monkeypatch.setattr(MaskablePPO, "train", half_an_update_then_ctrl_c)
    code, _, err = run_cli("train-policy", "--timesteps", "144", "--out-dir", run, "--cache-dir",
                           tmp_path / "cache", "--no-track", *TINY)
    assert code == 130 and f"--resume --out-dir {run}" in err, err
    saved = ResumeState.from_dir(run)
    assert saved.num_timesteps == 48 and saved.n_updates == 1
    for key, value in seen["before"].items():
        assert torch.equal(saved.policy[key], value), key
    # asked for no more than it trained, the resumed run says so and finishes as it is (it ended silently)
    monkeypatch.setattr(MaskablePPO, "train", real_train)
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "40", "--no-track")
    assert code == 0, err
    assert ("spantrain train-policy: note: --timesteps 40 is not above the 48 steps the run has trained, so no "
            "PPO step follows: this finishes the run as it is") in err, err
    assert ResumeState.from_dir(run).finished and (run / "summary.json").exists()


@pytest.mark.slow
def test_a_part_resumed_untracked_keeps_the_w_and_b_run_for_the_next(run_cli, tmp_path):
    run = tmp_path / "run"
    code, _, err = run_cli("train-policy", "--timesteps", "48", "--out-dir", run, "--cache-dir",
                           tmp_path / "cache", *TINY)
    assert code == 0, err
    first_id = ResumeState.from_dir(run).wandb_id
    assert first_id
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "96", "--no-track")
    assert code == 0, err
    assert ResumeState.from_dir(run).wandb_id == first_id
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "144", "--track")
    assert code == 0 and f"W&B run {first_id}" in err, err


@pytest.mark.slow
def test_a_copied_run_resumes_into_a_w_and_b_run_of_its_own(run_cli, tmp_path):
    # `cp -r R R2; train-policy --resume --out-dir R2` logged into R's W&B run
    import shutil

    run, copy = tmp_path / "run", tmp_path / "copy"
    code, _, err = run_cli("train-policy", "--timesteps", "48", "--out-dir", run, "--cache-dir",
                           tmp_path / "cache", *TINY)
    assert code == 0, err
    first_id = ResumeState.from_dir(run).wandb_id
    shutil.copytree(run, copy)
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", copy, "--timesteps", "96")
    assert code == 0, err
    assert f"{copy / 'wandb'} was copied or moved from {run.resolve() / 'wandb'}" in err, err
    copy_id = ResumeState.from_dir(copy).wandb_id
    assert copy_id and copy_id != first_id and "(its last update), W&B run" not in err, err
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run, "--timesteps", "96")
    assert code == 0 and f"W&B run {first_id}" in err and "was copied or moved" not in err, err


@pytest.mark.parametrize("recorded", ["as this version writes it", "as typed where the run began"])
def test_a_run_resumes_from_another_directory_and_after_being_moved(run_cli, tmp_path, monkeypatch, recorded):
    from spantrain.policies.ppo import load_policy

    began = tmp_path / "began"
    began.mkdir()
    monkeypatch.chdir(began)
    code, _, err = run_cli("train-policy", "--timesteps", "48", "--out-dir", "run", "--cache-dir", "cache",
                           "--no-track", *TINY)
    assert code == 0, err
    state = ResumeState.from_dir(began / "run")
    assert state.best["policy"] == "best-policy.pt"  # relative to the run's directory
    # the cache as a path from anywhere: a resume from elsewhere made a new ./cache and computed the starts again
    assert state.config["cache_dir"] == str(began / "cache")
    # its best stays the step-48 checkpoint (as a run's best often is an earlier one): the final
    # steps load it by the name the state gives
    typed = {"as this version writes it": "checkpoints/policy-48.pt",
             "as typed where the run began": "run/checkpoints/policy-48.pt"}[recorded]
    dataclasses.replace(state, best={"steps": 48, "geomean_ratio": 99.0, "policy": typed}).save(began / "run")
    moved = tmp_path / "moved" / "run"
    moved.parent.mkdir()
    (began / "run").rename(moved)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", moved, "--timesteps", "96")
    assert code == 0, err
    assert not (elsewhere / "cache").exists()
    summary = json.loads((moved / "summary.json").read_text())
    assert summary["best"] == {"steps": 48, "geomean_ratio": 99.0, "policy": str(moved / "best-policy.pt")}
    chosen, _, _ = load_policy(moved / "best-policy.pt")
    kept, _, _ = load_policy(moved / "checkpoints" / "policy-48.pt")
    assert all(torch.equal(v, kept.state_dict()[k]) for k, v in chosen.state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_training_as_ctrl_c_does(tmp_path, signum):
    """A scheduler's `kill` or a closed terminal: the run saves its state and can resume."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", "train-policy", "--timesteps", "100000",
                             "--out-dir", str(run), "--cache-dir", str(tmp_path / "cache"), "--no-track", *TINY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + 120
        while not (run / RESUME_FILE).exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (run / RESUME_FILE).exists(), proc.communicate()
        time.sleep(1.0)  # into PPO's rollouts
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith(f"spantrain train-policy: interrupted by {signum.name} during PPO "
                                                   "step "), err
    assert "Traceback" not in err and f"--resume --out-dir {run}" in err, err
    state = ResumeState.from_dir(run)
    assert not state.finished and state.num_timesteps % 48 == 0 and state.n_updates == state.num_timesteps // 48


def test_a_second_ctrl_c_while_the_first_is_saved_is_dropped(run_cli, tmp_path, monkeypatch):
    from spantrain.policies import ppo

    real_step, real_save = PlanEnv.step, ppo.save_policy
    steps = {"n": 0}

    def ctrl_c_in_the_first_rollout(self, action):
        steps["n"] += 1
        if steps["n"] == 60:  # in the second rollout: after the first update
            raise KeyboardInterrupt
        return real_step(self, action)

    def save_with_ctrl_c_again(net, path, **kwargs):
        if path.name == "interrupted-policy.pt":
            signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C again while it saves
        return real_save(net, path, **kwargs)

    monkeypatch.setattr(PlanEnv, "step", ctrl_c_in_the_first_rollout)
    monkeypatch.setattr(ppo, "save_policy", save_with_ctrl_c_again)
    run = tmp_path / "run"
    code, _, err = run_cli("train-policy", "--timesteps", "144", "--out-dir", run, "--cache-dir", tmp_path / "cache",
                           "--no-track", *TINY)
    assert code == 130 and err.strip().splitlines()[-1].startswith(
        "spantrain train-policy: interrupted during PPO step "), err
    assert (run / "interrupted-policy.pt").exists() and ResumeState.from_dir(run).num_timesteps == 48
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back


def test_training_whose_stderr_reader_left_runs_to_its_end(tmp_path):
    """`train-policy ... 2>&1 | less`, quit: the progress bar's next write met a closed pipe, and
    the command ended there, unsaved, with exit code 0."""
    run = tmp_path / "run"
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first line
    try:
        result = subprocess.run([sys.executable, "-m", "spantrain", "train-policy", "--timesteps", "96",
                                 "--out-dir", str(run), "--cache-dir", str(tmp_path / "cache"), "--no-track",
                                 *[a for a in TINY if a != "--no-progress"]],
                                stdout=subprocess.PIPE, stderr=write_end, text=True, preexec_fn=_default_signals)
    finally:
        os.close(write_end)
    assert result.returncode == 0
    assert ResumeState.from_dir(run).finished and json.loads((run / "summary.json").read_text())["curve"]


def _default_signals() -> None:
    """A suite started under ``nohup`` (or as a background job) passes SIGHUP (SIGINT) ignored to its
    children, and an ignored signal stays ignored, as it should; a user's terminal does neither."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_a_run_stopped_while_evaluating_its_imitation_result_evaluates_it_on_resume(run_cli, tmp_path, monkeypatch):
    from spantrain.policies import training

    real, calls = training.evaluate_policy, []

    def ctrl_c_at_the_first_evaluation(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    run = tmp_path / "run"
    flags = [a for a in TINY if a not in ("--imitation-episodes", "0")]
    with monkeypatch.context() as m:
        m.setattr(training, "evaluate_policy", ctrl_c_at_the_first_evaluation)
        code, _, err = run_cli("train-policy", "--timesteps", "48", "--imitation-episodes", "2", "--imitation-rounds",
                               "1", "--out-dir", run, "--cache-dir", tmp_path / "cache", "--no-track", *flags)
    assert code == 130 and f"--resume --out-dir {run}" in err, err
    state = ResumeState.from_dir(run)
    assert state.curve == [] and state.imitation and state.num_timesteps == 0
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert [p["steps"] for p in summary["curve"]] == [0, 48]  # the imitation result is a candidate for best again


def test_sigterm_during_ppo_is_named_and_a_finished_resume_removes_the_stale_interrupted_policy(run_cli, tmp_path,
                                                                                               monkeypatch):
    from sb3_contrib import MaskablePPO

    from spantrain.runtime.stop_signals import Terminated

    run = tmp_path / "run"
    real_step, real_collect = PlanEnv.step, MaskablePPO.collect_rollouts
    calls = {"rollouts": 0}

    def count_rollouts(self, *args, **kwargs):
        calls["rollouts"] += 1
        return real_collect(self, *args, **kwargs)

    def sigterm_in_the_second_rollout(self, action):
        if calls["rollouts"] == 2:
            raise Terminated("by SIGTERM")  # what `stop_signals` raises on `kill`
        return real_step(self, action)

    with monkeypatch.context() as m:
        m.setattr(PlanEnv, "step", sigterm_in_the_second_rollout)
        m.setattr(MaskablePPO, "collect_rollouts", count_rollouts)
        code, out, err = run_cli("train-policy", "--timesteps", "96", "--eval-every", "96", "--out-dir", run,
                                 "--cache-dir", tmp_path / "cache", "--no-track", "--json", *TINY)
    # was "interrupted during PPO step 48 of 96", not naming the signal
    assert code == 130 and err.strip().splitlines()[-1].startswith(
        "spantrain train-policy: interrupted by SIGTERM during PPO step 48 of 96; "), err
    assert (run / "interrupted-policy.pt").exists()
    # --json: stdout still holds one object, saying what was kept (it was empty)
    report = json.loads(out)
    assert report["interrupted"] and report["phase"] == "ppo" and report["steps"] == 48 and report["resumable"]
    assert report["policy"] == str(run / "interrupted-policy.pt") and report["out_dir"] == str(run)
    code, _, err = run_cli("train-policy", "--resume", "--out-dir", run)
    assert code == 0, err
    # the weights of step 48 would sit beside the final ones, looking newest
    assert not (run / "interrupted-policy.pt").exists()
    assert (f"train-policy: removed {run / 'interrupted-policy.pt'} (the weights where this run was stopped; its "
            "policies are now ppo-policy.pt and best-policy.pt)") in err, err


def test_ppo_that_diverges_stops_in_one_line_keeping_the_last_finite_state(run_cli, tmp_path, monkeypatch):
    from sb3_contrib import MaskablePPO

    real_train = MaskablePPO.train

    def update_to_nan(self):
        real_train(self)
        with torch.no_grad():
            for p in self.policy.parameters():
                p.fill_(float("nan"))

    monkeypatch.setattr(MaskablePPO, "train", update_to_nan)
    run = tmp_path / "run"
    code, out, err = run_cli("train-policy", "--timesteps", "144", "--out-dir", run, "--cache-dir",
                             tmp_path / "cache", "--track", *TINY)
    # was a traceback: "ValueError: Expected parameter logits ... found invalid values: tensor([[nan, ..."
    assert code == 2 and out == "" and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "spantrain train-policy: error: PPO diverged after step 48 (its weights became NaN) with --learning-rate "
        "0.0001: pass a smaller one; no evaluated policy was kept"), err  # step 48's evaluation found them NaN
    # W&B marks the run failed, as the command is (it said exit code 0)
    (log,) = (run / "wandb" / "wandb").glob("offline-run-*/logs/debug.log")
    assert "got exitcode: 1" in log.read_text()
    # the first update broke the weights: the state before it stands, not NaN weights
    state = ResumeState.from_dir(run)
    assert state.num_timesteps == 0 and all(bool(torch.isfinite(v).all()) for v in state.policy.values())


def test_ctrl_c_before_anything_was_saved_still_says_so_in_the_json(run_cli, tmp_path, monkeypatch):
    from spantrain.policies import training

    def interrupted_at_once(config):
        raise KeyboardInterrupt  # Ctrl-C while the starts were still being computed

    monkeypatch.setattr(training, "train", interrupted_at_once)
    code, out, _ = run_cli("train-policy", "--timesteps", "96", "--out-dir", tmp_path / "run", "--cache-dir",
                           tmp_path / "cache", "--no-track", "--json", *TINY)
    assert code == 130
    assert json.loads(out) == {"interrupted": True, "policy": None,
                               "message": "interrupted before any policy was saved"}  # the message was ""
