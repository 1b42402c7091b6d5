"""The training job's configuration (light: the CLI builds its flags from it at startup)."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from spantrain.errors import SpantrainError, join_problems

__all__ = ["TrainConfig", "ATTENTION_HEADS", "MAX_SEED", "MAX_WORKERS", "LIMITS"]

ATTENTION_HEADS = 4
"""Attention heads of every encoder layer (`GraphPolicyNet`'s default), which split `hidden`."""
MAX_SEED = 2**32 - 1
"""Largest seed (NumPy's legacy seeding, which SB3 uses, takes 32 bits)."""
MAX_WORKERS = 256
"""Most processes for the heuristic starts: each holds its own Python, NumPy and cost
model, so thousands would exhaust memory long before they helped."""
MAX_ROLLOUT = 100_000
"""Most steps of one PPO rollout (n_steps x n_envs): SB3 keeps every step's padded
observation (27 KB at 32 devices), so 100,000 already take 2.7 GB."""

LIMITS: dict[str, tuple[int, str]] = {
    "timesteps": (1_000_000_000, "months of PPO on a 2-core machine"),
    "n_envs": (256, "one process steps them all; more only lengthen each rollout"),
    "pool_size": (100_000, "each scenario's heuristic start is computed before training: 800 took 112 s"),
    "max_steps": (1_000, "the policy stops long before: episodes are meant to be short"),
    "n_steps": (MAX_ROLLOUT, "PPO keeps every step of a rollout in memory"),
    "batch_size": (MAX_ROLLOUT, "the largest rollout"),
    "n_epochs": (1_000, "passes over one rollout; a few suffice"),
    "hidden": (1024, "wider networks need gigabytes for the weights and Adam's moments"),
    "layers": (32, "each adds weights and Adam's moments; the default is 3"),
    "start_kicks": (100, "random moves before each episode, which is 12 moves by default"),
    "imitation_episodes": (100_000, "each is labelled by the expert trying every move"),
    "imitation_rounds": (100, "DAgger converges in a few"),
    "imitation_epochs": (1_000, "passes over the labels after each round"),
    "eval_every": (1_000_000_000, "the largest TrainConfig.timesteps"),
    "eval_scenarios": (10_000, "each evaluation plans and adapts every one of them"),
}
"""Largest value of each integer field, with why: beyond, a run ran out of memory with a
traceback or would not end (the CLI's --help shows the numbers)."""


def _not_plain(value: Any, where: str = "") -> str | None:
    """What in `value` is not plain data a weights-only `torch.load` takes back, or None."""
    if value is None or type(value) in (str, int, float, bool):  # not NumPy's float64, a float torch refuses
        return None
    if type(value) in (list, tuple):
        return next((p for i, v in enumerate(value) if (p := _not_plain(v, f"{where}[{i}]"))), None)
    if type(value) is dict:
        for k, v in value.items():
            if type(k) is not str:
                return f"got the key {k!r:.40} at {where or 'the top'}"
            if p := _not_plain(v, f"{where}[{k!r}]"):
                return p
        return None
    return f"got a {type(value).__name__} at {where or 'the top'}"


def _check_number(name: str, value: Any, rule: str, ok: Callable[[float], bool], problems: list[str]) -> None:
    """A finite real number that passes `ok`, or a problem naming the field, the rule and the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        problems.append(f"TrainConfig.{name} must be a finite number {rule}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """Everything a training run needs; `spantrain train-policy` exposes each field as a flag."""

    timesteps: int = 25_000
    """PPO environment steps in total (over all environments), after imitation; PPO runs
    whole rollouts (n_steps x n_envs), so the last one may pass this (at most 1,000,000,000)."""
    n_envs: int = 8
    """Environments stepped together (one process; env steps are cheap next to the network;
    at most 256, and n_steps x n_envs at most 100,000)."""
    min_devices: int = 4
    """Smallest training cluster."""
    max_devices: int = 32
    """Largest training cluster (also the padding size of training observations; at most 4,096)."""
    models: tuple[str, ...] = ("gpt2-medium", "gpt2-xl", "llama2-7b")
    """Workload presets episodes draw from."""
    pool_size: int = 800
    """Training scenarios (their heuristic starts are computed once and cached; at most 100,000)."""
    adapt_prob: float = 0.5
    """Share of episodes that adapt a running plan to a network change."""
    max_steps: int = 12
    """Moves per episode (at most 1,000)."""
    seed: int = 0
    """Seed of the pool, the environments and the network initialization."""
    learning_rate: float = 1e-4
    """Adam learning rate of PPO (fine-tuning the imitation result: small steps; above 0, at most 1)."""
    n_steps: int = 64
    """Steps per environment per PPO rollout (at most 100,000)."""
    batch_size: int = 128
    """PPO minibatch size (2 or more; no minibatch of one sample may remain of a rollout of
    n_steps x n_envs steps: a divisor of it is best; at most 100,000)."""
    n_epochs: int = 4
    """PPO epochs per rollout (at most 1,000)."""
    gamma: float = 0.95
    """Discount (episodes are short; improvements should come early)."""
    ent_coef: float = 0.01
    """Entropy bonus (keeps exploring moves instead of stopping at once; from 0 to 1)."""
    hidden: int = 64
    """Width of the graph encoder (a multiple of 4, its attention heads; at most 1,024)."""
    layers: int = 3
    """Message-passing layers (at most 32)."""
    start_kicks: int = 4
    """Up to this many random moves applied to each episode's starting plan, so there is
    something to repair (at most 100)."""
    imitation_episodes: int = 250
    """Episodes per DAgger round of imitating the one-step lookahead expert before PPO
    (0: PPO from a random policy; at most 100,000)."""
    imitation_rounds: int = 3
    """DAgger rounds (the first follows the expert, the others the policy; at most 100)."""
    imitation_epochs: int = 8
    """Passes over all labels so far after each round (at most 1,000)."""
    init_policy: str | None = None
    """Start from this policy file's weights instead of imitation: a checkpoint, an
    interrupted run's `interrupted-policy.pt`, or the shipped policy (its hidden and
    layers must match this run's)."""
    resume: bool = False
    """Continue the run in out_dir from the state it saved after its last PPO update, or at
    Ctrl-C, SIGTERM or its end (out_dir/resume.pt): weights, Adam's moments, step counters, curve, best
    policy, W&B run. Its settings are kept; only timesteps (raise it to train a finished run
    further), eval_every, workers, track, progress and cache_dir may change."""
    eval_every: int = 25_000
    """Steps between evaluations against the heuristic (at most 1,000,000,000)."""
    eval_scenarios: int = 24
    """Held-out scenarios per evaluation (at most 10,000)."""
    out_dir: str = "runs/policy"
    """Checkpoints, the final and the best policy file, summary.json, the final evaluation's
    rows (final_eval.csv), the evaluation plot and the W&B run go here (a directory of this
    run's own)."""
    workers: int = 2
    """Processes computing the heuristic starts of the pool (at most 256; more than this
    machine's cores gains nothing)."""
    track: bool = True
    """Log to W&B (offline unless logged in)."""
    progress: bool = True
    """Progress bar on stderr."""
    cache_dir: str | None = None
    """Where heuristic starts are cached (default $SPANTRAIN_CACHE/starts if set, else ~/.cache/spantrain/starts)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form notes recorded with the run."""

    def __post_init__(self) -> None:
        # kept as text: the run's resume state and policy files hold its settings as plain data, and
        # torch's weights-only loading refused a Path there (the run's own ppo-policy.pt, at its end)
        for name in ("out_dir", "cache_dir", "init_policy"):
            if isinstance(getattr(self, name), os.PathLike):
                object.__setattr__(self, name, os.fspath(getattr(self, name)))
        self.validate()

    def validate(self) -> None:
        """One `SpantrainError` naming every bad field at once (each fix took a run of its own).
        Messages name a field ``TrainConfig.<field>``; `spantrain train-policy` shows its flag instead."""
        problems = self.problems()
        if problems:
            raise SpantrainError(join_problems(problems))

    def problems(self) -> list[str]:
        """What is wrong with the fields, each a message; a rule between fields is checked only
        once the fields it reads are valid (a bad n_steps says so, not also a bad rollout)."""
        from spantrain.cluster import MAX_DEVICES

        problems: list[str] = []
        ok: set[str] = set()  # integer fields whose own rules hold
        for name in ("out_dir", "cache_dir"):
            v = getattr(self, name)
            # out_dir=None was a TypeError from Path() once train() began; cache_dir=None is the default cache
            if (v is not None or name == "out_dir") and not isinstance(v, str):
                problems.append(f"TrainConfig.{name} must be a directory path, got {v!r:.80}")
        if problem := _not_plain(self.extra):
            problems.append("TrainConfig.extra must hold plain data (text, numbers, booleans, None, and lists and "
                            f"dicts of them), {problem}")
        for name in ("timesteps", "start_kicks", "imitation_episodes"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                problems.append(f"TrainConfig.{name} must be an integer >= 0, got {v!r}")
            else:
                ok.add(name)
        positive = ("n_envs", "min_devices", "max_devices", "pool_size", "max_steps", "n_steps",
                    "batch_size", "n_epochs", "hidden", "layers", "eval_every", "eval_scenarios", "workers",
                    "imitation_rounds", "imitation_epochs")
        for name in positive:
            v = getattr(self, name)
            if not _is_int(v) or v < 1:
                problems.append(f"TrainConfig.{name} must be a positive integer, got {v!r}")
            else:
                ok.add(name)
        for name, (most, why) in LIMITS.items():
            if name in ok and getattr(self, name) > most:
                problems.append(f"TrainConfig.{name} must be at most {most} ({why}), got {getattr(self, name)}")
                ok.discard(name)
        if "workers" in ok and self.workers > MAX_WORKERS:
            problems.append(f"TrainConfig.workers must be at most {MAX_WORKERS} (each is a process with its own "
                            f"cost model; more than this machine's cores gains nothing), got {self.workers}")
        if {"timesteps", "imitation_episodes"} <= ok and self.timesteps == 0 and self.imitation_episodes == 0:
            problems.append("TrainConfig.timesteps and TrainConfig.imitation_episodes are both 0: nothing to train")
        if self.init_policy is not None and (not isinstance(self.init_policy, str) or not self.init_policy):
            problems.append(f"TrainConfig.init_policy must be a policy file path, got {self.init_policy!r}")
        if self.init_policy and self.resume:
            problems.append("TrainConfig.init_policy and TrainConfig.resume: a resumed run continues from its own "
                            "state; pass one of them")
        if self.init_policy and "timesteps" in ok and self.timesteps == 0:
            problems.append("TrainConfig.init_policy replaces imitation and TrainConfig.timesteps is 0: nothing to "
                            "train")
        # PPO normalizes advantages over each minibatch: one sample normalizes to NaN, and the
        # NaN weights then end the run with a torch traceback after imitation
        if {"n_steps", "n_envs"} <= ok:
            rollout = self.n_steps * self.n_envs
            if rollout > MAX_ROLLOUT:
                problems.append(f"TrainConfig.n_steps x TrainConfig.n_envs must be at most {MAX_ROLLOUT} (PPO keeps "
                                f"every step of a rollout in memory), got {self.n_steps} x {self.n_envs}")
            elif rollout < 2:
                problems.append(f"TrainConfig.n_steps x TrainConfig.n_envs must be at least 2 (PPO's advantages "
                                f"over a one-step rollout are NaN), got {self.n_steps} x {self.n_envs}")
            elif "batch_size" in ok and (self.batch_size < 2 or rollout % self.batch_size == 1):
                problems.append(f"TrainConfig.batch_size {self.batch_size} leaves a minibatch of one sample from "
                                f"each rollout of TrainConfig.n_steps x TrainConfig.n_envs = {rollout} steps (its "
                                f"normalized advantages are NaN): pick a batch size of 2 or more that divides "
                                f"{rollout}")
        if not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED:
            problems.append(f"TrainConfig.seed must be an integer from 0 to {MAX_SEED}, got {self.seed!r}")
        if "hidden" in ok and self.hidden % ATTENTION_HEADS:
            problems.append(f"TrainConfig.hidden must be a multiple of {ATTENTION_HEADS} (the encoder's attention "
                            f"heads), got {self.hidden}")
        if "max_devices" in ok and self.max_devices > MAX_DEVICES:
            problems.append(f"TrainConfig.max_devices must be at most {MAX_DEVICES} (the largest generated "
                            f"cluster), got {self.max_devices}")
            ok.discard("max_devices")
        if "min_devices" in ok and self.min_devices < 2:
            problems.append(f"TrainConfig.min_devices must be at least 2, got {self.min_devices}")
        elif {"min_devices", "max_devices"} <= ok and self.min_devices > self.max_devices:
            # either may be the one the user gave
            problems.append(f"TrainConfig.min_devices ({self.min_devices}) is above TrainConfig.max_devices "
                            f"({self.max_devices}): raise TrainConfig.max_devices or lower TrainConfig.min_devices")
        self._check_models(problems)
        _check_number("adapt_prob", self.adapt_prob, "in [0, 1]", lambda v: 0 <= v <= 1, problems)
        _check_number("gamma", self.gamma, "in (0, 1]", lambda v: 0 < v <= 1, problems)
        # Adam steps of more than 1 blow PPO's logits up to NaN within an update or two
        _check_number("learning_rate", self.learning_rate, "in (0, 1]", lambda v: 0 < v <= 1, problems)
        _check_number("ent_coef", self.ent_coef, "in [0, 1]", lambda v: 0 <= v <= 1, problems)
        for name in ("out_dir", "cache_dir"):
            # "" is the current directory to pathlib: a run's files all over it, or the user cache
            if getattr(self, name) == "":
                problems.append(f"TrainConfig.{name} is empty: pass a directory")
        return problems

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        """A config from `dataclasses.asdict` output (a resume state's, or JSON's: lists
        become the tuples they were); unknown keys are an error naming them."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise SpantrainError(f"TrainConfig has no field {', '.join(unknown)}")
        return cls(**{k: tuple(v) if isinstance(fields[k].default, tuple) and isinstance(v, list) else v
                      for k, v in values.items()})

    def _check_models(self, problems: list[str]) -> None:
        from spantrain.workload import PRESETS

        if isinstance(self.models, str) or not isinstance(self.models, tuple | list):
            problems.append(f"TrainConfig.models must be a tuple of preset names ({', '.join(PRESETS)}), got "
                            f"{'the string ' if isinstance(self.models, str) else ''}{self.models!r}")
        elif not self.models:
            problems.append(f"TrainConfig.models is empty: name at least one preset ({', '.join(PRESETS)})")
        elif unknown := [m for m in self.models if m not in PRESETS]:
            problems.append(f"TrainConfig.models: {', '.join(map(str, unknown))}: training draws its workloads from "
                            f"presets only ({', '.join(PRESETS)}), not workload files or other names")

    def env_config(self):
        """The training environment's `EnvConfig`."""
        from spantrain.env.plan_env import EnvConfig

        return EnvConfig(max_devices=self.max_devices, min_devices=self.min_devices, models=self.models,
                         max_steps=self.max_steps, adapt_prob=self.adapt_prob, pool_size=self.pool_size,
                         pool_seed=self.seed, start_kicks=self.start_kicks)
