"""What the cost model predicts for a plan (filled by `spantrain.env.costmodel`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Estimate", "memory_reason", "fmt_memory", "fmt_gb"]


def fmt_memory(n_bytes: float) -> str:
    """Bytes for a message: GB to one decimal, below 0.1 GB in MB to three digits (1.2 MB, not
    0.0 GB, so tiny figures stay apart), beyond a trillion GB to three digits."""
    if abs(n_bytes) >= 1e21:  # what a spec's huge figures make: 2e+21 GB, not twenty digits
        return f"{n_bytes / 1e9:.3g} GB"
    if n_bytes == 0 or abs(n_bytes) >= 1e8:
        return f"{n_bytes / 1e9:.1f} GB"
    return f"{n_bytes / 1e6:.3g} MB"


def fmt_gb(gb: float) -> str:
    """GB for a table column: one decimal, below 0.1 GB two digits (a 12 MB stage read "0.0")."""
    return f"{gb:.1f}" if gb == 0 or abs(gb) >= 0.1 else f"{gb:.2g}"


def memory_reason(device: str, need_bytes: float, have_bytes: float) -> str:
    """Why a device cannot hold its stage: an `Estimate.reasons` entry."""
    need, have = fmt_memory(need_bytes), fmt_memory(have_bytes)
    if need == have:  # "needs 1.4 GB, has 1.4 GB (short 91.6 MB)": digits enough to tell them apart
        need, have = (f"{x / 1e9:.4g} GB" if abs(x) >= 1e8 else f"{x / 1e6:.5g} MB" for x in (need_bytes, have_bytes))
    return f"{device} needs {need}, has {have} (short {fmt_memory(need_bytes - have_bytes)})"


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """Prediction for one training iteration of a plan."""

    iteration_s: float
    """Seconds per iteration: slowest pipeline + exposed sync + optimizer step."""
    samples_per_s: float
    """Iteration batch / iteration seconds (0 when infeasible)."""
    feasible: bool
    """False when the plan cannot run (memory); `reasons` says why."""
    reasons: tuple[str, ...] = ()
    """Why the plan is infeasible, naming the device and the shortfall."""
    peak_memory_gb: dict[str, float] = field(default_factory=dict)
    """Peak memory per used device id, GB."""
    bubble_fraction: tuple[float, ...] = ()
    """Per pipeline: idle fraction of its stages' time during the pipelined phase
    (1 - busy / (stages x `pipeline_period_s`))."""
    pipeline_s: tuple[float, ...] = ()
    """Per pipeline: seconds from the first forward to the last backward."""
    exposed_comm_s: float = 0.0
    """Seconds of data-parallel sync not hidden behind backward."""
    sync_s: float = 0.0
    """Seconds the sync would take alone (before overlap)."""
    optimizer_s: float = 0.0
    """Seconds of the optimizer step on the slowest device."""
    pipeline_period_s: tuple[float, ...] = ()
    """Per pipeline: steady-state seconds per iteration when each stage starts its next
    iteration as soon as it is done (<= `pipeline_s`; smaller for ZB-H2's parallelogram).
    The iteration time uses this, not `pipeline_s`, for an executor that overlaps sync with
    the backward pass (the built-in constants); without (`Calibration.sync_overlap` false)
    every pipeline starts the iteration together and it uses `pipeline_s`."""

    def as_run(self, overlap: bool = True) -> tuple[tuple[float, ...], tuple[float, ...], float]:
        """What the iteration time counts: per pipeline its seconds and bubble fraction, and the
        rest of the iteration past the slowest pipeline and the exposed sync (optimizer step and
        per-iteration overhead). `overlap`: the constants' `sync_overlap`. The three parts add
        up to `iteration_s`; printing the period where the makespan counted left 16 ms of a
        0.48 s ZB-H2 iteration unaccounted for."""
        if overlap:
            times, bubbles = self.pipeline_period_s, self.bubble_fraction
        else:  # the same busy time over the makespan
            times = self.pipeline_s
            bubbles = tuple(max(1.0 - (1.0 - b) * per / span, 0.0) if span > 0 else b
                            for b, per, span in zip(self.bubble_fraction, self.pipeline_period_s, self.pipeline_s))
        rest = self.iteration_s - max(times, default=0.0) - self.exposed_comm_s
        return times, bubbles, max(rest, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"iteration_s": self.iteration_s, "samples_per_s": self.samples_per_s,
                "feasible": self.feasible, "reasons": list(self.reasons),
                "peak_memory_gb": dict(self.peak_memory_gb), "bubble_fraction": list(self.bubble_fraction),
                "pipeline_s": list(self.pipeline_s), "exposed_comm_s": self.exposed_comm_s,
                "sync_s": self.sync_s, "optimizer_s": self.optimizer_s,
                "pipeline_period_s": list(self.pipeline_period_s)}
