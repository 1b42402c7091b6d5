"""Training the scheduling policy with masked PPO in `PlanEnv`.

`train(TrainConfig(...))` prepares the heuristic starts of a scenario pool (cached on
disk, computed in parallel), runs sb3-contrib's `MaskablePPO` with the graph policy over
vectorized environments, evaluates against the heuristic on held-out scenarios (cluster
seeds training never draws) every `eval_every` steps, writes a policy file at every
evaluation and at the end, plus `best-policy.pt`: the one with the best held-out geomean
(the final one on a tie; PPO fine-tuning can drift below the imitation it starts from),
and tracks config, reward and evaluation curves, PPO's diagnostics and the final
evaluation table in W&B (offline unless the user is logged in), with every policy file as a
version of the W&B model artifact `ppo-policy`; the final evaluation's rows also go to
`final_eval.csv`. From PPO's start on, every update, evaluation, Ctrl-C and the run's end
write the whole training state (`spantrain.policies.resume`), which `resume` continues from
exactly where PPO's last update left it. Ctrl-C also saves the weights so far as
`interrupted-policy.pt` (`TrainingInterrupted`); `init_policy` starts a new run from such a
file, or any policy file, instead of imitating.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from spantrain._interrupt import SignalsHeld
from spantrain._say import note
from spantrain.env.plan_env import EnvConfig, PlanEnv, Scenario, scenario_pool, scenario_workload
from spantrain.errors import DiskFull, SpantrainError
from spantrain.policies.train_config import TrainConfig
from spantrain.profiler.topology import generate

__all__ = ["TrainConfig", "TrainingInterrupted", "train", "evaluate_policy", "held_out_config", "FINAL_EVAL_COLUMNS",
           "POLICY_ARTIFACT"]


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training, after the weights so far were saved to `path` (the message
    says where and how to continue; `report` says it as data, for `train-policy --json`)."""

    def __init__(self, message: str, path: Path | None, report: dict | None = None):
        super().__init__(message)
        self.path = path
        self.report = {"interrupted": True, "policy": str(path) if path else None, "message": message,
                       **(report or {})}


FINAL_EVAL_COLUMNS = ("profile", "devices", "seed", "model", "batch_scale", "kind", "start_s", "ppo_s", "ratio",
                      "plan_s")
"""Columns of the final evaluation's rows (`evaluate_policy`'s ``rows``): the scenario key,
plan or adapt, the start's and the policy's predicted iteration seconds, their effective
throughput ratio and the policy's planning seconds."""
POLICY_ARTIFACT = "ppo-policy"
"""The W&B artifact (type model) whose versions are a run's policy files: the checkpoints
tagged ``step-<N>``, the final policy ``final``, the best ``best``."""

EVAL_SEED_RANGE = (1_000_000, 2_000_000)
"""Cluster seeds of held-out evaluation scenarios (training draws from EnvConfig.seed_range)."""


def held_out_config(config: TrainConfig) -> EnvConfig:
    """Evaluation scenarios: same sizes and models, seeds training never draws."""
    return EnvConfig(max_devices=config.max_devices, min_devices=config.min_devices, models=config.models,
                     max_steps=config.max_steps, adapt_prob=0.0, pool_size=config.eval_scenarios,
                     pool_seed=config.seed + 10_000, seed_range=EVAL_SEED_RANGE)


def _scenarios(keys: list[tuple], starts) -> list[Scenario]:
    from spantrain.env.evaluator import Evaluator

    out = []
    for key in keys:
        profile, n, seed, model, scale = key
        ev = Evaluator(generate(n, seed=seed, profile=profile), scenario_workload(model, scale))
        try:
            start = starts(key, ev)
        except SpantrainError:
            continue
        out.append(Scenario(key=key, cluster=ev.cluster, workload=ev.workload, evaluator=ev, start=start))
    return out


def _adaptation_scenarios(keys: list[tuple], starts, config: EnvConfig) -> list[Scenario]:
    """Held-out adaptation scenarios: each key's heuristic plan running when its network
    changes (changes drawn from a fixed seed)."""
    env = PlanEnv(dataclasses.replace(config, adapt_prob=1.0, start_kicks=0), start=starts)
    env.reset(seed=config.pool_seed)
    out = []
    for key in keys:
        try:
            out.append(env._build(key, adapt=True))
        except SpantrainError:
            continue
    return out


def evaluate_policy(net, scenarios: list[Scenario], *, steps: int, samples: int = 4, seed: int = 0,
                    horizon: int = 500) -> dict:
    """Ratios of the policy's plan to the start (the heuristic's plan, or in adaptation
    scenarios the running one) in effective throughput (migration included) over scenarios."""
    from spantrain.policies.ppo import improve

    ratios = []
    adapt = []
    rows = []
    for sc in scenarios:
        t = time.perf_counter()
        best = improve(net, sc, steps=steps, samples=samples, seed=seed, horizon=horizon)
        env = PlanEnv(EnvConfig(max_devices=max(len(sc.cluster), 2), min_devices=2, horizon=horizon))
        env.load(sc)
        ratio = env._effective(best) / env._effective(sc.start)
        ratios.append(ratio)
        adapt.append(bool(sc.running))
        # the key's own types: as text, W&B sorted and plotted devices and seeds as words
        key = [k.item() if isinstance(k, np.generic) else k for k in sc.key]
        rows.append([*key, "adapt" if sc.running else "plan", round(sc.start.time, 5),
                     round(best.time, 5), round(ratio, 4), round(time.perf_counter() - t, 3)])
    r = np.array(ratios) if ratios else np.array([1.0])
    a = np.array(adapt, dtype=bool) if ratios else np.array([False])

    def geomean(x: np.ndarray) -> float:
        return float(np.exp(np.mean(np.log(x)))) if len(x) else float("nan")

    return {"median_ratio": float(np.median(r)), "geomean_ratio": geomean(r),
            "better_1pct": float(np.mean(r >= 1.01)), "planning_geomean": geomean(r[~a]),
            "adaptation_geomean": geomean(r[a]), "cases": len(ratios), "rows": rows}


def _check_out_dir(out: Path, held) -> None:
    """Make the output directory, lock it for this run (in `held`) and check this run can
    write it, now: else the heuristic starts, and without tracking imitation too, ran before
    the first file written there failed. One that holds another run's policy files is refused:
    this run would overwrite them (best-policy.pt among them) and mix its checkpoints with that
    run's; one that another run holds too (its files may not be written yet)."""
    from spantrain._spec import require_writable_dir
    from spantrain.runtime.launcher import refuse_held, run_dir_lock

    # first: a live run's files would be named as a previous run's, to resume or remove
    refuse_held(out, "TrainConfig.out_dir", SpantrainError)
    _check_previous_run(out)  # before the lock, which leaves its file: a finished run's directory stays as it was
    held.enter_context(run_dir_lock(out, "TrainConfig.out_dir"))
    _check_previous_run(out)  # again: a run that wrote its files between the first look and the lock
    require_writable_dir(out, "TrainConfig.out_dir", SpantrainError)


def _check_previous_run(out: Path) -> None:
    from spantrain.policies.resume import RESUME_FILE

    previous = [p for p in (out / "best-policy.pt", out / "ppo-policy.pt", out / "interrupted-policy.pt")
                if p.exists()] + sorted((out / "checkpoints").glob("policy-*.pt"))
    if previous and (out / RESUME_FILE).exists():
        raise SpantrainError(f"TrainConfig.out_dir {out} already holds a training run ({previous[0]}): continue "
                             "it with TrainConfig.resume, pass another directory, or remove that one to start anew")
    if previous:  # stopped before PPO began: --resume would find nothing, so do not offer it
        raise SpantrainError(f"TrainConfig.out_dir {out} already holds a training run ({previous[0]}) stopped before "
                             f"PPO began, with nothing to resume: pass another directory (with TrainConfig.init_policy "
                             f"{previous[0]} to start from its weights), or remove that one to start anew")


def _check_can_create(path: str | None, field: str) -> None:
    """A directory the run will make: refused now, creating nothing, when the nearest existing
    directory above it cannot be written (else the run made its other directories first)."""
    from spantrain._spec import cannot_create

    problem = cannot_create(path) if path else None
    if problem is not None:
        raise SpantrainError(f"TrainConfig.{field} {path} cannot be written ({problem[1]}): pass a directory this "
                             "run can write")


def train(config: TrainConfig) -> dict[str, Any]:
    """Run a training job; returns a summary (paths, timings, final evaluation). The run owns
    `config.out_dir` while it runs: a second run started there fails at once, naming this one."""
    if isinstance(config, Mapping):  # train({"timesteps": ...}) was an AttributeError ('dict' has no cache_dir)
        unknown = sorted(set(config) - {f.name for f in dataclasses.fields(TrainConfig)})
        if unknown:
            raise SpantrainError(f"train: unknown TrainConfig field{'s' * (len(unknown) > 1)} "
                                 f"{', '.join(map(repr, unknown))}")
        config = TrainConfig(**config)
    elif not isinstance(config, TrainConfig):
        raise SpantrainError(f"train takes a TrainConfig (or a dict of its fields), got {config!r:.80}")
    if config.cache_dir:  # as the run's saved settings name it: a resume from elsewhere computed the starts anew
        config = dataclasses.replace(config, cache_dir=os.path.abspath(config.cache_dir))
    with contextlib.ExitStack() as held:
        return _train(config, held)


def _train(config: TrainConfig, held) -> dict[str, Any]:
    """`train`, holding the out_dir's lock in `held` (an ExitStack) once taken."""
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv

    from spantrain.policies.extractor import MaskableGraphPolicy
    from spantrain.policies.ppo import load_policy, load_value_head, save_policy
    from spantrain.policies.resume import ResumeState, run_file
    from spantrain.policies.starts import HeuristicStarts
    from spantrain.tracking import Tracker, check_environment, continued_run_id

    t_start = time.perf_counter()
    out = Path(config.out_dir)
    resumed = None
    if config.resume:  # first: a run that cannot resume should fail in seconds
        from spantrain.runtime.launcher import run_dir_lock

        resumed = ResumeState.from_dir(out)
        resumed.check_config(config)
        held.enter_context(run_dir_lock(out, "TrainConfig.out_dir"))
        # as a new run's is checked (`_check_out_dir`): else the first save failed, torch's traceback
        # after the heuristic starts (a run directory copied read-only, or another user's)
        from spantrain._spec import require_writable_dir

        for where in (out, out / "checkpoints"):
            require_writable_dir(where, "TrainConfig.out_dir", SpantrainError)
    prior_s = resumed.wall_s if resumed else 0.0

    def elapsed() -> float:
        """Seconds this run has trained, the parts before a resume included."""
        return prior_s + time.perf_counter() - t_start

    init = None
    if config.init_policy:  # before the heuristic starts: a wrong file should fail in seconds
        if not Path(config.init_policy).exists():  # a directory: load_policy says so
            raise SpantrainError(f"TrainConfig.init_policy: {config.init_policy} not found (pass a policy file: "
                                 "a checkpoint, or interrupted-policy.pt or best-policy.pt of a training run)")
        init, _, _ = load_policy(config.init_policy, option="TrainConfig.init_policy",
                                 resume_fix="continue that run with TrainConfig.resume TrainConfig.out_dir "
                                            f"{Path(config.init_policy).parent}")
        have = (init.config.get("hidden"), init.config.get("layers"))
        if have != (config.hidden, config.layers):
            raise SpantrainError(f"TrainConfig.init_policy: {config.init_policy} has hidden {have[0]} and layers "
                                 f"{have[1]}, this run hidden {config.hidden} and layers {config.layers}; pass "
                                 f"TrainConfig.hidden {have[0]} TrainConfig.layers {have[1]}")
    if config.track:
        check_environment()  # a WANDB_* value wandb refuses fails now, not after the heuristic starts
    # one intra-op thread: the graphs are small, and a second thread fighting for the same
    # two cores made the forward pass ~8x slower here
    torch.set_num_threads(1)
    # neither directory is made before both are known to be writable
    _check_can_create(config.cache_dir, "cache_dir")
    if resumed is None:
        _check_can_create(config.out_dir, "out_dir")
        _check_out_dir(out, held)
    torch.manual_seed(config.seed)
    env_cfg = config.env_config()
    eval_cfg = held_out_config(config)
    starts = HeuristicStarts(config.cache_dir)
    try:
        missing = starts.prepare(scenario_pool(env_cfg) + scenario_pool(eval_cfg), workers=config.workers,
                                 progress=config.progress)
    except KeyboardInterrupt as stop:  # nothing trained yet: say what is kept and how to go on
        raise KeyboardInterrupt(f"{_by(stop)}during the heuristic starts, before any training; the starts computed "
                                f"so far stay cached in {starts.cache_dir}: the same command again continues from "
                                "them") from None
    t_starts = (resumed.starts_s if resumed else 0.0) + time.perf_counter() - t_start
    eval_keys = scenario_pool(eval_cfg)
    eval_scenarios = _scenarios(eval_keys, starts) + _adaptation_scenarios(eval_keys, starts, eval_cfg)
    if not eval_scenarios:
        raise SpantrainError("no held-out scenario has a feasible heuristic plan; widen models or sizes")

    def make(rank: int):
        def thunk():
            env = PlanEnv(env_cfg, start=starts)
            env.reset(seed=config.seed * 1000 + rank)
            return env
        return thunk

    venv = DummyVecEnv([make(k) for k in range(config.n_envs)])
    try:
        model = MaskablePPO(MaskableGraphPolicy, venv, learning_rate=config.learning_rate, n_steps=config.n_steps,
                            batch_size=config.batch_size, n_epochs=config.n_epochs, gamma=config.gamma,
                            ent_coef=config.ent_coef, seed=config.seed, verbose=0, device="cpu",
                            policy_kwargs={"features_extractor_kwargs": {"hidden": config.hidden,
                                                                         "layers": config.layers}})
    except (MemoryError, RuntimeError) as e:
        # within the flags' limits a rollout padded to thousands of devices can still exceed
        # memory (observations grow with the square of max_devices): NumPy's or torch's refusal
        if not isinstance(e, MemoryError) and "allocate" not in str(e):
            raise
        raise SpantrainError(f"PPO's rollout buffer and network do not fit in memory (TrainConfig.n_steps x "
                             f"TrainConfig.n_envs = {config.n_steps * config.n_envs} steps padded to "
                             f"TrainConfig.max_devices {config.max_devices}, TrainConfig.hidden {config.hidden}, "
                             f"TrainConfig.layers {config.layers}): lower one of them") from None
    net = model.policy.graph_net
    if init is not None:
        net.load_state_dict(init.state_dict())
        value = load_value_head(config.init_policy)
        if value is not None:
            model.policy.value_net.load_state_dict(value)
    if resumed is not None:
        _restore(model, resumed, out)
    env_settings = {"max_steps": config.max_steps, "horizon": env_cfg.horizon, "max_devices": config.max_devices}
    tracker = Tracker(job_type="train-policy", config=asdict(config), enabled=config.track,
                      name=out.resolve().name or None, dir=out / "wandb",
                      # a copy of a run's directory logs to a run of its own, not into the original's
                      run_id=continued_run_id(out / "wandb", resumed.wandb_id) if resumed and config.track else None)
    # ended on every path (a full disk, a bug): an open run kept WANDB_DATA_DIR set in the caller
    held.push(lambda exc_type, *_: tracker.finish(exit_code=1 if exc_type else None))
    wandb_run = tracker.url_or_dir
    if resumed is not None:
        print(f"train-policy: resuming {out} at PPO step {resumed.num_timesteps:,} (its last update)"
              + (f", W&B run {resumed.wandb_id}" if tracker.run_id and tracker.run_id == resumed.wandb_id else ""),
              file=sys.stderr)
        if config.timesteps <= resumed.num_timesteps:  # (a finished run was refused: nothing would change)
            note(f"--timesteps {config.timesteps:,} is not above the {resumed.num_timesteps:,} steps the run has "
                 "trained, so no PPO step follows: this finishes the run as it is (final evaluation and policy "
                 "files); pass --timesteps above that to train it further")
    if wandb_run:  # wandb itself is silenced: say where to follow the run
        print(f"train-policy: W&B run {wandb_run}", file=sys.stderr)
    # PPO's own diagnostics (losses, KL, clip fraction, fps) go to W&B; SB3's default
    # logger would instead leave an empty SB3-<time> directory in /tmp on every run
    model.set_logger(Logger(folder=None, output_formats=[_tracker_writer(tracker)]))
    curve: list[dict[str, float]] = list(resumed.curve) if resumed else []
    # the evaluated policy with the best held-out geomean so far
    best: dict[str, Any] = dict(resumed.best) if resumed else {}
    if best and not run_file(out, best["policy"]).is_file():
        # moved or removed since (a finished run's best-policy.pt, copied away): the run's end loads the
        # best to write best-policy.pt, and failed there after all the training, on every resume
        print(f"train-policy: note: the run's best policy so far (step {best['steps']:,}, {best['policy']}) is no "
              f"longer in {out}: the best is chosen from the evaluations from here on and the final policy",
              file=sys.stderr)
        best = {}
    imitation: list[dict[str, Any]] = list(resumed.imitation) if resumed else []
    learned = {"steps": model.num_timesteps}  # PPO steps the last update learned from
    # between a rollout's end and the next one's start PPO updates the weights and Adam in
    # place: a state saved then would hold a half-done update under the last one's counters
    updating = {"now": False}
    # where PPO stops: after the rollout that reaches config.timesteps, so often past it
    rollout = config.n_steps * config.n_envs
    planned_steps = max(model.num_timesteps + -(-(config.timesteps - model.num_timesteps) // rollout) * rollout,
                        model.num_timesteps)

    def save_state(*, finished: bool = False) -> None:
        if _diverged(model.policy):  # keep the last state PPO had not yet broken
            return
        ResumeState(config=asdict(config), num_timesteps=learned["steps"], n_updates=model._n_updates,
                    policy=model.policy.state_dict(), optimizer=model.policy.optimizer.state_dict(),
                    torch_rng=torch.get_rng_state(), curve=curve, best=best, imitation=imitation,
                    starts_s=t_starts, wall_s=elapsed(), finished=finished,
                    # a part run untracked keeps the run's id for the next part that is tracked
                    wandb_id=tracker.run_id or (resumed.wandb_id if resumed else None)).save(out)

    def checkpoint(steps: int) -> dict[str, Any]:
        """Held-out evaluation, logged, and a policy file; returns the evaluation."""
        if _diverged(model.policy):  # the update before broke the weights: stop as PPO's next step would
            raise RuntimeError("PPO diverged")
        net.eval()
        result = evaluate_policy(net, eval_scenarios, steps=config.max_steps, horizon=env_cfg.horizon)
        net.train()
        point = {"steps": steps, **{k: result[k] for k in ("median_ratio", "geomean_ratio", "better_1pct",
                                                             "planning_geomean", "adaptation_geomean")},
                 "wall_s": elapsed()}
        curve.append(point)
        tracker.log({f"eval/{k}": v for k, v in point.items() if k != "steps"}, step=steps)
        path = save_policy(net, out / "checkpoints" / f"policy-{steps}.pt", env=env_settings, meta=point,
                           value=model.policy.value_net)
        tracker.log_artifact(path, name=POLICY_ARTIFACT, type="model", aliases=[f"step-{steps}"], metadata=point)
        if not best or point["geomean_ratio"] > best["geomean_ratio"]:
            best.update(steps=steps, geomean_ratio=point["geomean_ratio"], policy=str(path.relative_to(out)))
        save_state()
        return result

    class Hooks(BaseCallback):
        """Progress bar, episode stats, periodic held-out evaluation and checkpoints."""

        def _on_training_start(self) -> None:
            from tqdm import tqdm

            first = self.num_timesteps
            self.bar = tqdm(total=planned_steps, initial=first, desc="train-policy", unit="step",
                            disable=not config.progress)
            # the next multiple of eval_every the curve has not reached (a resumed run's may have); not
            # past the resumed step itself: an evaluation cut off there by the stop was skipped for good
            done = max(p["steps"] for p in curve) if curve else max(first - 1, 0)
            self.next_eval = (done // config.eval_every + 1) * config.eval_every
            self.returns: list[float] = []
            self.gains: list[float] = []
            self.running = np.zeros(config.n_envs)

        def _on_rollout_start(self) -> None:
            learned["steps"] = self.num_timesteps  # the previous rollout's update is done
            updating["now"] = False
            # milliseconds a rollout of seconds: a run killed outright loses one rollout at most
            save_state()
            self.evaluate_if_due()

        def evaluate_if_due(self) -> dict[str, Any] | None:
            """A checkpoint once the weights have learned from `next_eval` steps: between updates,
            so a checkpoint's steps are those its weights learned from."""
            if learned["steps"] < self.next_eval:
                return None
            self.next_eval = (learned["steps"] // config.eval_every + 1) * config.eval_every
            return checkpoint(learned["steps"])

        def _on_step(self) -> bool:
            self.bar.update(config.n_envs)
            self.running += self.locals["rewards"]
            for k, done in enumerate(self.locals["dones"]):
                if done:
                    self.returns.append(float(self.running[k]))
                    self.gains.append(float(self.locals["infos"][k].get("improvement", 1.0)))
                    self.running[k] = 0.0
            return True

        def _on_rollout_end(self) -> None:
            updating["now"] = True  # PPO's update follows
            if self.returns:
                tracker.log({"train/episode_return": float(np.mean(self.returns)),
                             "train/episode_gain": float(np.mean(self.gains)), "train/episodes": len(self.returns)},
                            step=self.num_timesteps)
                self.bar.set_postfix(ret=f"{np.mean(self.returns):.3f}", gain=f"{np.mean(self.gains):.3f}")
                self.returns, self.gains = [], []

        def close(self) -> None:
            if hasattr(self, "bar"):
                self.bar.close()

    phase = "imitation"
    rounds_done: list = []  # imitation's statistics, round by round
    try:
        with interrupts_unwrapped():  # a stop signal inside a compiled kernel comes out as SystemError
            if config.imitation_episodes and init is None and resumed is None:
                from spantrain.policies.imitation import clone

                expert_env = PlanEnv(env_cfg, start=starts)
                expert_env.reset(seed=config.seed + 7)
                clone(model.policy, expert_env, episodes=config.imitation_episodes, rounds=config.imitation_rounds,
                      epochs=config.imitation_epochs, gamma=config.gamma, seed=config.seed, progress=config.progress,
                      stats=rounds_done)
                imitation = [asdict(s) for s in rounds_done]
                tracker.log({"imitation/" + k: v for k, v in imitation[-1].items()}, step=0)
            phase = "ppo"
            # the starting policy (imitation's, or --init-policy's) is evaluated as step 0, also by a
            # resumed run that was stopped during that evaluation
            started_from = imitation or init is not None or (resumed is not None and resumed.config.get("init_policy"))
            if started_from and model.num_timesteps == 0 and not any(p["steps"] == 0 for p in curve):
                checkpoint(0)
            due = None
            if config.timesteps > model.num_timesteps:
                hooks = Hooks()
                try:
                    model.learn(total_timesteps=config.timesteps - model.num_timesteps, callback=hooks,
                                reset_num_timesteps=resumed is None)
                finally:  # on Ctrl-C too: the interrupted line then starts on a line of its own
                    hooks.close()
                learned["steps"] = model.num_timesteps
                updating["now"] = False
                due = hooks.evaluate_if_due()  # the last update's checkpoint: no rollout starts after it
                # SB3 dumps an update's losses with the next rollout's figures: the last update's are left,
                # and one step on (the last rollout's step already holds the update before: W&B merged the two)
                model.logger.dump(step=model.num_timesteps + 1)
            t_train = elapsed()
            phase = "final evaluation"
            if due is None and not any(p["steps"] == model.num_timesteps for p in curve):
                # the last update is a checkpoint as well, on the curve and its plot: a run that ended
                # between two --eval-every steps (or before the first) had its final evaluation on neither
                due = checkpoint(model.num_timesteps)
            net.eval()
            # the last update's checkpoint evaluated these very weights (a deterministic evaluation)
            final = due or evaluate_policy(net, eval_scenarios, steps=config.max_steps, horizon=env_cfg.horizon)
            phase = "saving the policies"
            # PPO runs whole rollouts, so it may pass config.timesteps: the steps it ran name the
            # final policy (as they name the checkpoints)
            meta = {"timesteps": model.num_timesteps, "train_s": round(t_train, 1), "starts_s": round(t_starts, 1),
                    "starts_computed": missing, "final_eval": {k: v for k, v in final.items() if k != "rows"},
                    "curve": curve, "imitation": imitation, "config": asdict(config)}
            policy_path = save_policy(net, out / "ppo-policy.pt", env=env_settings, meta=meta,
                                      value=model.policy.value_net)
            if not best or final["geomean_ratio"] >= best["geomean_ratio"]:
                best.update(steps=model.num_timesteps, geomean_ratio=final["geomean_ratio"],
                            policy=str(policy_path.relative_to(out)))
            # the chosen weights with the whole run's metadata (a checkpoint's file has only its point)
            chosen_path = run_file(out, best["policy"])
            chosen, _, _ = load_policy(chosen_path)
            best_path = save_policy(chosen, out / "best-policy.pt", env=env_settings,
                                    meta={**meta, "selected_steps": best["steps"]}, value=load_value_head(chosen_path))
            best["policy"] = best_path.name
            rows_path = _write_rows(out / "final_eval.csv", final["rows"])
            summary = {"policy": str(policy_path), "best": {**best, "policy": str(best_path)}, "train_s": t_train,
                       "starts_s": t_starts,
                       "curve": curve, "imitation": imitation, "final": meta["final_eval"],
                       "final_rows": str(rows_path), "wandb": wandb_run}
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            save_state(finished=True)
            stale = out / "interrupted-policy.pt"
            if resumed is not None and stale.exists():
                # the weights where the run was stopped, now older than every policy beside them
                stale.unlink()
                print(f"train-policy: removed {stale} (the weights where this run was stopped; its policies are now "
                      f"{policy_path.name} and {best_path.name})", file=sys.stderr)
    except DiskFull as e:  # the last resume.pt is whole (written beside, renamed into place)
        with contextlib.suppress(Exception):  # W&B's files are on that disk too
            tracker.finish(exit_code=1)
        from spantrain.policies.resume import RESUME_FILE

        state = out / RESUME_FILE
        raise DiskFull(f"{e}" + (f"; the run's last state is in {state}: continue with spantrain train-policy --resume "
                                 f"--out-dir {out} once there is room" if state.exists() else "")) from None
    except (ValueError, RuntimeError):
        # PPO diverged: NaN weights fail the next forward pass (torch's distribution or sampling)
        if phase == "imitation" or not _diverged(model.policy):
            raise
        tracker.summary({"diverged_steps": learned["steps"]})
        tracker.finish(exit_code=1)  # failed: the command ends in an error
        kept = (f"the best policy so far is {run_file(out, best['policy'])} (start from it with "
                f"TrainConfig.init_policy in another TrainConfig.out_dir)" if best else "no evaluated policy was kept")
        raise SpantrainError(f"PPO diverged after step {learned['steps']:,} (its weights became NaN) with "
                             f"TrainConfig.learning_rate {config.learning_rate}: pass a smaller one; {kept}") from None
    except KeyboardInterrupt as stop:
        # a second Ctrl-C (or SIGTERM) would cut this saving, and W&B's ending, in half: held and dropped
        with SignalsHeld(deliver=False):
            # keep what was learned: the weights as they are, with how far the run got
            steps = model.num_timesteps
            resumable = phase != "imitation"
            if phase == "imitation":
                imitation = [asdict(s) for s in rounds_done]
                if not rounds_done:  # the weights are the random ones: a policy PPO learns to stop from at once
                    tracker.summary({"interrupted": phase, "interrupted_steps": 0})
                    tracker.finish()
                    raise TrainingInterrupted(
                        f"{_by(stop)}during imitation round 1 of {config.imitation_rounds}, before it learned "
                        f"anything: nothing to keep; the same command starts again (the heuristic starts stay cached "
                        f"in {starts.cache_dir})", None, {"phase": phase, "steps": 0, "resumable": False,
                                                          "out_dir": str(out)}) from None
                tracker.log({"imitation/" + k: v for k, v in imitation[-1].items()}, step=0)
            if resumable and not updating["now"]:  # else the state saved at the rollout's start stands
                save_state()
            if phase == "ppo":  # the last update's losses wait for the next rollout's dump, which will not come
                with contextlib.suppress(Exception):
                    model.logger.dump(step=steps + 1)
            path = save_policy(net, out / "interrupted-policy.pt", env=env_settings, value=model.policy.value_net,
                               meta={"interrupted": phase, "steps": steps, "curve": curve, "imitation": imitation,
                                     "config": asdict(config)})
            tracker.summary({"interrupted": phase, "interrupted_steps": steps})
            tracker.finish()
            where = phase
            if phase == "ppo":  # of the steps PPO will run: "step 6,008 of 6,000" read as a miscount
                where = f"PPO step {steps:,} of {planned_steps:,}"
                if planned_steps != config.timesteps:
                    where += f" (--timesteps {config.timesteps:,} rounded up to whole rollouts of {rollout:,} steps)"
            how = (f"continue the run with --resume --out-dir {out}" if resumable else
                   f"start from them with --init-policy {path} and another --out-dir")
            report = {"phase": phase, "steps": steps, "resumable": resumable, "out_dir": str(out)}
            raise TrainingInterrupted(f"{_by(stop)}during {where}; the weights so far are in {path} ({how})", path,
                                      report) from None
    # the policies and summary.json are written: Ctrl-C from here (the plot, W&B's last
    # uploads) loses only those, and says so
    try:
        # at the run's last step (the tracker moves it past what an earlier part of the run logged)
        tracker.log_table("eval/final", list(FINAL_EVAL_COLUMNS), final["rows"], step=model.num_timesteps)
        # copied: a resumed part rewrites both files, and its first part's versions must keep theirs
        tracker.log_artifact(policy_path, name=POLICY_ARTIFACT, type="model",
                             aliases=["final"], metadata=meta["final_eval"], copy=True)
        tracker.log_artifact(best_path, name=POLICY_ARTIFACT, type="model", aliases=["best"],
                             metadata={"selected_steps": best["steps"], "geomean_ratio": best["geomean_ratio"]},
                             copy=True)
        plot = _plot_curve(curve, out / "sample_efficiency.png")
        if plot:
            tracker.log_image("eval/curve", plot, step=model.num_timesteps)
        tracker.summary({"final/" + k: v for k, v in meta["final_eval"].items()})
        if resumed is not None:  # a resumed W&B run keeps its summary: the stop's marks outlived the finish
            tracker.summary({"interrupted": False, "interrupted_steps": None})
        tracker.finish()
    except KeyboardInterrupt as stop:
        raise TrainingInterrupted(f"{_by(stop)}after training, while finishing its plot and W&B run; the best policy "
                                  f"is in {best_path}, the summary in {out / 'summary.json'}",
                                  best_path, {"phase": "finishing", "summary": summary}) from None
    return summary


@contextlib.contextmanager
def interrupts_unwrapped():
    """Ctrl-C (or SIGTERM/SIGHUP) raised while numba loads a compiled kernel on its first call
    reaches the caller as ``SystemError: ... returned a result with an exception set``: give
    the stop back as what it is, so the run saves its state as on any stop."""
    try:
        yield
    except SystemError as e:
        if isinstance(e.__cause__, KeyboardInterrupt):
            raise e.__cause__ from None
        raise


def _by(stop: KeyboardInterrupt) -> str:
    """"by SIGTERM " for a stop signal other than Ctrl-C (`stop_signals.Terminated` says which)."""
    from spantrain.runtime.stop_signals import Terminated

    return f"{stop} " if isinstance(stop, Terminated) and str(stop) else ""


def _diverged(policy) -> bool:
    """Whether any weight of the actor-critic is NaN or infinite."""
    import torch

    return not all(bool(torch.isfinite(p).all()) for p in policy.parameters())


def _restore(model, state, out: Path) -> None:
    """Put a resumed run's PPO back as it was: weights, Adam, counters, random state; its
    environments start fresh episodes from a seed of their own (the first part's would
    replay its opening episodes)."""
    import torch

    from spantrain.policies.resume import RESUME_FILE

    state.restore(model.policy, out / RESUME_FILE)
    model.num_timesteps = state.num_timesteps
    model._n_updates = state.n_updates
    torch.set_rng_state(state.torch_rng)
    seed = int(np.random.SeedSequence([state.config["seed"], state.num_timesteps]).generate_state(1)[0])
    model.env.seed(seed)  # used by the reset that starts `learn`


def _write_rows(path: Path, rows: list[list[Any]]) -> Path:
    """The final evaluation's rows as CSV (written whether or not W&B tracks the run)."""
    import csv
    import io

    from spantrain._spec import write_text_atomic

    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(FINAL_EVAL_COLUMNS)
    writer.writerows(rows)
    write_text_atomic(path, text.getvalue())
    return path


_SB3_NOT_LOGGED = frozenset({"total_timesteps", "iterations", "n_updates", "time_elapsed", "learning_rate",
                             "clip_range"})
"""SB3's values that are the W&B step itself or counters of it, restart on a resumed part (SB3
counts iterations and time per `learn` call), or are constants already in the run's config."""


def _tracker_writer(tracker):
    """An SB3 logger output that forwards numeric values to the W&B run as ``ppo/<name>``
    (made here: SB3 is imported only when training)."""
    from stable_baselines3.common.logger import KVWriter

    class TrackerWriter(KVWriter):
        def write(self, key_values: dict[str, Any], key_excluded: dict[str, tuple[str, ...]],
                  step: int = 0) -> None:
            metrics = {"ppo/" + name: float(value) for key, value in key_values.items()
                       if (name := key.rsplit("/", 1)[-1]) not in _SB3_NOT_LOGGED
                       and isinstance(value, (int, float, np.number)) and not isinstance(value, bool)}
            if metrics:
                tracker.log(metrics, step=step)

        def close(self) -> None:
            pass

    return TrackerWriter()


def _plot_curve(curve: list[dict[str, float]], path: Path) -> Path | None:
    if not curve:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p["steps"] for p in curve]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, [p["geomean_ratio"] for p in curve], marker="o", label="geomean ratio to the start")
    ax.plot(steps, [p["median_ratio"] for p in curve], marker="s", label="median ratio to the start")
    ax2 = ax.twinx()
    ax2.plot(steps, [p["better_1pct"] for p in curve], color="tab:green", ls="--", marker="^",
             label="share >= 1% better")
    ax2.set_ylim(0, 1)
    ax2.set_ylabel("share of held-out cases")
    ax.set_xlabel("environment steps")
    # the start is the heuristic's plan, or in adaptation cases the running one
    ax.set_ylabel("effective throughput / the start's")
    ax.axhline(1.0, color="0.6", lw=0.8)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], fontsize=8, loc="lower right")
    ax.set_title("held-out evaluation during training")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
