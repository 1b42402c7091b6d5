"""Everything a worker needs to run its part of a training run, as one JSON-able record.

The CLI builds it after checking every input; local workers read it from the run
directory, torchrun workers build it themselves from the same command line.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.plan import Plan
from spantrain.workload import Workload, load_workload

__all__ = ["OptimConfig", "RunConfig", "INITIAL_LOSS_SCALE"]

INITIAL_LOSS_SCALE = 2.0**16
"""fp16's first loss scale, torch `GradScaler`'s: typical gradients neither underflow nor overflow."""


@dataclass(frozen=True)
class OptimConfig:
    """AdamW hyper-parameters (constant learning rate)."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One training run: inputs, hyper-parameters and where things go."""

    cluster_spec: dict[str, Any]
    model: str
    """Preset name or absolute path of a workload file."""
    global_batch: int | None
    plan: dict[str, Any]
    steps: int
    """Train until this many iterations in total (a resumed run continues up to it)."""
    seed: int = 0
    optim: OptimConfig = OptimConfig()
    data: str | None = None
    run_dir: str
    metrics_path: str
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    """Checkpoint every K iterations (0: only at the end and on a clean stop)."""
    keep_checkpoints: int = 2
    resume: bool = False
    track: bool = False
    wandb_id: str | None = None
    """The W&B run this launch logs to: the same for every launch of one job (its ``--adapt``
    plans, a ``--resume``), so W&B shows the job as one run; None: a new run."""
    planner: str | None = None
    """What made the plan (a planner's name, or ``file:PATH``), for W&B's config."""
    timeout_s: float = 300.0
    """Process-group timeout: a collective or transfer that waits longer fails the run."""
    rank_map: str | None = None
    launcher_pid: int | None = None
    """Local runs: workers exit if this process disappears (no orphans)."""
    zb_orders: list[list[list[list[Any]]]] | None = None
    """Zero-bubble schedules: per pipeline, per stage, the [op, micro-batch] order, computed once
    before launch (None: each worker computes it)."""
    zb_order_source: str | None = None
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
    def from_json(cls, text: str) -> RunConfig:
        raw = json.loads(text)
        raw["optim"] = OptimConfig(**raw["optim"])
        return cls(**raw)

    @classmethod
    def from_file(cls, path: str | Path) -> RunConfig:
        return cls.from_json(Path(path).read_text())
