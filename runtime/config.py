"""Everything a worker needs to run its part of a training run, as one JSON-able record.

The CLI builds it after checking every input; local workers read it from the run
directory, torchrun workers build it themselves from the same command line.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spantrain._spec import got, parse_json, read_text_file, shown
from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.errors import ExecutionError, join_problems
from spantrain.plan import Plan
from spantrain.workload import Workload, load_workload

__all__ = ["OptimConfig", "RunConfig", "INITIAL_LOSS_SCALE", "MAX_THREADS"]

INITIAL_LOSS_SCALE = 2.0**16
"""fp16's first loss scale, torch `GradScaler`'s: typical gradients neither underflow nor overflow."""


MAX_THREADS = 256
"""The most torch CPU threads a worker may ask for: 100,000 crashed the workers, and a few
thousand made an iteration take minutes."""


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW hyper-parameters (constant learning rate)."""

    lr: float = 1e-3
    """Learning rate (> 0)."""
    weight_decay: float = 0.1
    """Decoupled weight decay of matrices and embeddings (>= 0; times `lr` below 1, since AdamW
    shrinks those weights by `lr * weight_decay` each step)."""
    beta1: float = 0.9
    """Decay of the first-moment estimate, in [0, 1)."""
    beta2: float = 0.95
    """Decay of the second-moment estimate, in [0, 1)."""
    eps: float = 1e-8
    """Added to the second moment's square root (> 0)."""

    def __post_init__(self) -> None:
        # checked once each is a number (lr="0.1" was a TypeError), and every one at once
        checks = {"lr": lambda x: x > 0, "weight_decay": lambda x: x >= 0, "beta1": lambda x: 0 <= x < 1,
                  "beta2": lambda x: 0 <= x < 1, "eps": lambda x: x > 0}
        wrong = []
        for name, ok in checks.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not ok(value):
                wrong.append(f"optim.{name} is out of range: {value!r} (see OptimConfig.{name})")
        if wrong:
            raise ExecutionError("; ".join(wrong))
        if self.lr * self.weight_decay >= 1:
            raise ExecutionError(f"optim.weight_decay times optim.lr must be below 1, got {self.weight_decay:g} x "
                                 f"{self.lr:g}: AdamW would flip the weights' sign")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run: inputs, hyper-parameters and where things go."""

    cluster_spec: dict[str, Any]
    """The cluster spec as parsed (`Cluster.from_spec`), so every worker reads the same one."""
    model: str
    """Preset name or absolute path of a workload file."""
    global_batch: int | None
    """Overrides the workload's global batch (None: the workload's own)."""
    plan: dict[str, Any]
    """The plan to train on, as in its file (`Plan.from_dict`)."""
    steps: int
    """Train until this many iterations in total (a resumed run continues up to it)."""
    seed: int = 0
    """Seeds the model's initialization and the order of samples."""
    optim: OptimConfig = OptimConfig()
    """AdamW's settings."""
    data: str | None = None
    """A text file to train on (None: the built-in corpus)."""
    run_dir: str
    """Where the run writes its plan, result, logs and W&B files."""
    metrics_path: str
    """The per-iteration metrics file (JSON lines)."""
    checkpoint_dir: str | None = None
    """Where checkpoints go (None: no checkpoints)."""
    checkpoint_every: int = 0
    """Checkpoint every K iterations (0: only at the end and on a clean stop)."""
    keep_checkpoints: int = 2
    """How many of the newest checkpoints to keep."""
    resume: bool = False
    """Continue from the latest complete checkpoint in `checkpoint_dir`."""
    track: bool = False
    """Log to W&B (offline unless the user is logged in)."""
    wandb_id: str | None = None
    """The W&B run this launch logs to: the same for every launch of one job (its ``--adapt``
    plans, a ``--resume``), so W&B shows the job as one run; None: a new run."""
    planner: str | None = None
    """What made the plan (a planner's name, or ``file:PATH``), for W&B's config."""
    timeout_s: float = 300.0
    """Process-group timeout: a collective or transfer that waits longer fails the run."""
    rank_map: str | None = None
    """A file mapping plan devices to ranks (`spantrain.runtime.rankmap`; None: plan order)."""
    launcher_pid: int | None = None
    """Local runs: workers exit if this process disappears (no orphans)."""
    temp_dir: str | None = None
    """Local and emulated runs: the workers' ``TMPDIR``, which the launcher removes however the
    run ends (a worker killed outright left W&B's temporary directories in /tmp)."""
    zb_orders: list[list[list[list[Any]]]] | None = None
    """Zero-bubble schedules: per pipeline, per stage, the [op, micro-batch] order, computed once
    before launch (None: each worker computes it)."""
    zb_order_source: str | None = None
    """Where `zb_orders` came from, for the run's records."""
    job_id: str | None = None
    """This job's id, the same across its resumes: kept in ``RUN_DIR/job-id`` and in its
    checkpoints, so that a ``--resume`` finds the job's run directory (None under torchrun)."""
    threads: int | None = None
    """torch CPU threads per worker (None: the machine's cores divided among its workers)."""
    adaptation: dict[str, Any] | None = None
    """``--adapt``: the decision that started this plan (rank 0 logs it to W&B), None for the first."""
    measure_links: bool = False
    """Measure the plan's links in-band (`spantrain.runtime.linkprobe`) after the first iteration
    and whenever iterations drift, writing the links that changed into
    ``RUN_DIR/cluster-measured.json``. Emulated and torchrun runs only: a plain local run's
    workers share this machine's loopback, which says nothing of the spec's links."""
    precision: str = "fp32"
    """What the workers train in: ``fp32``; ``bf16`` mixed precision (fp32 weights and
    optimizer, bf16 compute and activations; `spantrain.runtime.models`), which a GPU without
    bf16 trains in fp32 (the result says so); or ``fp16`` mixed precision, the same with fp16
    and a dynamic loss scale all ranks agree on (`spantrain.runtime.loss_scale`)."""
    loss_scale: float = INITIAL_LOSS_SCALE
    """fp16: the loss scale to start from (halved on every overflow, doubled after 2000
    clean iterations; a resumed run continues from its checkpoint's)."""
    calibration: dict[str, Any] | None = None
    """Cost-model constants of the run's prediction (`Calibration` fields; None: the built-in ones)."""
    predicted_step_s: float | None = None
    """The cost model's seconds per iteration of `plan` (`spantrain.runtime.prediction`), logged
    beside the measured ones; None: not predicted."""
    prediction_calibration: str | None = None
    """How the run names the constants of `predicted_step_s` (a file's name, or the built-in ones)."""
    prediction_comparable: bool = False
    """Whether `predicted_step_s` holds against this run's measured times
    (`spantrain.runtime.prediction.comparable`): on a profiled spec, the drift watch then also
    reports a plan that is slow from its first iterations, which its own baseline cannot show."""

    def load(self) -> tuple[Cluster, Workload, Plan]:
        """The cluster, workload and plan this run trains."""
        cluster = Cluster.from_spec(self.cluster_spec, "cluster")
        workload = load_workload(self.model, global_batch=self.global_batch)
        plan = Plan.from_dict(self.plan, "plan")
        return cluster, workload, plan

    def cost_constants(self) -> Calibration | None:
        """`calibration` as the cost model takes it (None: the built-in constants)."""
        return Calibration.from_dict(self.calibration) if self.calibration is not None else None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json() + "\n")

    @classmethod
    def from_json(cls, text: str | bytes, source: str = "run config") -> RunConfig:
        """Parse `to_json`'s text: malformed JSON, or an object that is not a run's settings, is an
        `ExecutionError` naming `source` (it was a JSONDecodeError, KeyError or TypeError)."""
        raw = parse_json(text, source, ExecutionError)
        fix = "pass the run_config.json that spantrain run wrote in a run directory"
        if not isinstance(raw, dict):
            raise ExecutionError(f"{source}: expected a JSON object of a run's settings, got "
                                 f"{type(raw).__name__}; {fix}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        problems = [f"unknown key {shown(k)}" for k in raw if k not in fields]
        problems += [f"missing key {k!r}" for k, f in fields.items()
                     if k not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        optim = raw.get("optim", {})
        if not isinstance(optim, dict):
            problems.append(f"optim must be an object of OptimConfig's fields, {got(optim)}")
        else:
            known = {f.name for f in dataclasses.fields(OptimConfig)}
            problems += [f"optim: unknown key {shown(k)}" for k in optim if k not in known]
        if problems:
            raise ExecutionError(f"{source}: not a run's settings ({join_problems(problems)}); {fix}")
        try:
            return cls(**{**raw, "optim": OptimConfig(**optim)})
        except ExecutionError as e:
            raise ExecutionError(f"{source}: {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> RunConfig:
        """A run's settings file (`save`'s): a missing, unreadable or malformed one is an
        `ExecutionError` naming it."""
        return cls.from_json(read_text_file(path, ExecutionError), str(path))
