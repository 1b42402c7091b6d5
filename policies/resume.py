"""A training run's resumable state: what `spantrain train-policy --resume` continues from.

`train` writes ``OUT_DIR/resume.pt`` from PPO's start on: after every update, at every
evaluation, on Ctrl-C (SIGTERM and SIGHUP too, from `spantrain train-policy`) and when the
run ends. It holds what the policy files leave out and PPO needs to go on as
if never stopped: the whole actor-critic, Adam's moments and step counts, PPO's step and
update counters, torch's random state, the evaluation curve, the best policy so far, the
imitation summary, the time spent, the W&B run id and the run's configuration.

The step counter is that of the last PPO update: the steps of a rollout cut short by
Ctrl-C were never learned from, so a resumed run collects them again (from fresh
episodes: the environments' own state is not kept). Ctrl-C during an update leaves the
state saved before it (the update's half-changed weights and Adam moments are not saved).
A run interrupted before PPO began (during the heuristic starts or imitation) has no
state to resume; imitation is deterministic and the starts are cached, so starting anew
repeats only imitation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spantrain.errors import SpantrainError

__all__ = ["RESUME_FILE", "ResumeState", "RESUMABLE_CHANGES", "run_file"]

RESUME_FILE = "resume.pt"
"""The state's file name inside the run's output directory."""
_FORMAT = 1
_INSTEAD = ("start a new run from one of its policy files instead (TrainConfig.init_policy, in another "
            "TrainConfig.out_dir)")
RESUMABLE_CHANGES = frozenset({"timesteps", "eval_every", "workers", "track", "progress", "cache_dir", "extra",
                               "resume", "out_dir", "init_policy"})
"""Settings a resumed run may change: how long it trains, how often it evaluates, and how
it runs; every other one shapes what is learned and must stay as the run began."""


def run_file(out: Path, recorded: str) -> Path:
    """The file of a run in `out` that its state names (`ResumeState.best`'s policy): kept
    relative to the run's directory, so the run resumes from any working directory and
    after being moved. States written before named it as typed, relative to where that
    run was started: those are looked up in `out` by their place under it."""
    path = Path(recorded)
    if path.is_absolute():
        return path
    for found in (out / path, out / path.parent.name / path.name, out / path.name):
        if found.exists():
            return found
    return out / path


@dataclass(kw_only=True)
class ResumeState:
    """Everything `train` needs to continue a run (module docstring)."""

    config: dict[str, Any]
    """The run's `TrainConfig` as a dict (`TrainConfig.from_dict` rebuilds it)."""
    num_timesteps: int
    """PPO environment steps learned from (the last update's count)."""
    n_updates: int
    """PPO's gradient-step counter (SB3's ``_n_updates``)."""
    policy: dict[str, Any]
    """The actor-critic's state dict (`MaskableGraphPolicy`: encoder, heads, value head)."""
    optimizer: dict[str, Any]
    """Adam's state dict (moments and step counts)."""
    torch_rng: Any
    """`torch.get_rng_state()`: PPO samples its actions and minibatches from it."""
    curve: list[dict[str, float]] = field(default_factory=list)
    """The held-out evaluations so far."""
    best: dict[str, Any] = field(default_factory=dict)
    """The best evaluated policy so far: steps, geomean_ratio, policy (its file, relative to the run's
    directory: `run_file`)."""
    imitation: list[dict[str, Any]] = field(default_factory=list)
    """The imitation rounds' summaries."""
    starts_s: float = 0.0
    """Seconds spent on the heuristic starts."""
    wall_s: float = 0.0
    """Seconds the run has trained so far, starts included."""
    wandb_id: str | None = None
    """The W&B run's id, which a resumed run logs on (None: untracked)."""
    finished: bool = False
    """Whether the run had ended (a resumed one then trains further only with more timesteps)."""

    def save(self, out_dir: str | Path) -> Path:
        """Write ``OUT_DIR/resume.pt`` whole or not at all: Ctrl-C (or SIGTERM, SIGHUP) waits
        until the file is renamed into place, then takes effect."""
        import torch

        from spantrain._interrupt import STOP_SIGNALS
        from spantrain._spec import replace_file

        path = Path(out_dir) / RESUME_FILE
        blob = {"format": _FORMAT, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
        replace_file(path, lambda tmp: torch.save(blob, tmp), STOP_SIGNALS)
        return path

    @classmethod
    def from_dir(cls, out_dir: str | Path) -> ResumeState:
        """The state a run left in `out_dir`; `SpantrainError` in one line naming what is
        missing or wrong and what to do."""
        import torch

        if not str(out_dir):  # Path("") is the current directory
            raise SpantrainError("TrainConfig.out_dir is empty: pass a directory")
        out = Path(out_dir)
        path = out / RESUME_FILE
        if out.exists() and not out.is_dir():
            raise SpantrainError(f"TrainConfig.out_dir {out} is a file, not a directory: pass the directory of the "
                                 "run to resume")
        from spantrain.runtime.launcher import RUN_LOCK, refuse_held

        # a live run has no resume state until PPO starts: "nothing to resume ... remove it" would mislead
        refuse_held(out, "TrainConfig.out_dir", SpantrainError)
        if not path.is_file():
            fix = "start a run there without TrainConfig.resume"
            if not out.is_dir():
                why = "it does not exist"
            else:
                why = (f"it holds no {RESUME_FILE}, which a run writes from PPO's start on (one stopped during "
                       "its heuristic starts or imitation has none)")
                if any(p.name != RUN_LOCK for p in out.iterdir()):  # a lock file alone: a run that wrote nothing
                    fix = ("start anew without TrainConfig.resume, in another TrainConfig.out_dir or after "
                           "removing this one (the heuristic starts are cached)")
            raise SpantrainError(f"TrainConfig.resume: nothing to resume in {out}: {why}; {fix}")
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated by a full disk, or not ours
            from spantrain.policies.ppo import load_failure

            # torch's unpickler reads a text file's first byte as a key: "KeyError: 105" said nothing
            why = "not a torch file of tensors and plain data" if isinstance(e, KeyError) else load_failure(e, path)
            raise SpantrainError(f"TrainConfig.resume: {path} is damaged ({why}); {_INSTEAD}") from None
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(blob, dict) or blob.get("format") != _FORMAT or not names <= blob.keys():
            raise SpantrainError(f"TrainConfig.resume: {path} is not a resume state of this spantrain version; "
                                 f"{_INSTEAD}")
        # settings this version does not know (another version's state) failed later as "TrainConfig has no field X"
        from spantrain.policies.train_config import TrainConfig

        try:
            TrainConfig.from_dict(blob["config"])
        except (SpantrainError, TypeError, AttributeError) as e:
            raise SpantrainError(f"TrainConfig.resume: {path} is not a resume state of this spantrain version "
                                 f"(its settings: {e}); {_INSTEAD}") from None
        return cls(**{k: blob[k] for k in names})

    def restore(self, policy, path: Path) -> None:
        """Load the actor-critic's weights and Adam's state into `policy` (SB3's, built from
        this state's config); `SpantrainError` in one line when they do not fit it: a state
        another spantrain version wrote, whose network differs (was torch's many-line traceback)."""
        try:
            policy.load_state_dict(self.policy)
            policy.optimizer.load_state_dict(self.optimizer)
        except (RuntimeError, ValueError, KeyError, TypeError):
            raise SpantrainError(f"TrainConfig.resume: {path} holds weights that do not fit the network this "
                                 f"spantrain version builds from its settings; {_INSTEAD}") from None

    def check_config(self, config) -> None:
        """`SpantrainError` naming every setting of `config` (a `TrainConfig`) that differs from
        the run's and may not change (`RESUMABLE_CHANGES`), or a step budget already spent."""
        from spantrain.policies.train_config import TrainConfig

        run = TrainConfig.from_dict(self.config)
        changed = [f"TrainConfig.{f.name} {_shown(getattr(config, f.name))} (the run's: "
                   f"{_shown(getattr(run, f.name))})"
                   for f in dataclasses.fields(config)
                   if f.name not in RESUMABLE_CHANGES and getattr(config, f.name) != getattr(run, f.name)]
        if changed:
            raise SpantrainError(f"TrainConfig.resume: a resumed run keeps the settings it began with, and these "
                                 f"differ: {'; '.join(changed)}; drop them, or start a new run")
        if self.finished and config.timesteps <= self.num_timesteps:
            raise SpantrainError(f"TrainConfig.resume: the run finished at PPO step {self.num_timesteps:,}: pass "
                                 f"TrainConfig.timesteps above that to train it further")


def _shown(value: Any) -> str:
    """A setting as its flag is typed: a tuple as A,B,..., not Python's repr."""
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
