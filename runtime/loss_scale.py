"""Dynamic loss scaling for fp16 mixed precision, agreed by every rank of a run.

fp16 has bf16's bytes but a far narrower range: gradients below about 6e-8 flush to zero.
So the last stage multiplies its loss by a scale (2^16 at first), every gradient of the
pipeline's backward comes out multiplied by it, and each rank divides its fp32 gradients by
it again before the optimizer step. A scale too large overflows somewhere: then the
iteration's update is skipped and the scale halved; after `growth_interval` clean
iterations in a row it doubles again (torch's `GradScaler` policy).

In a pipeline the decision must be one for the whole run: an overflow in one stage's
gradients means the backward that fed every upstream stage was scaled too far, and replicas
of a layer in different pipelines must take the same steps. So each rank checks its own
gradients (after the data-parallel sum, which spreads an inf to every holder of the layer),
and one small all-reduce over all ranks tells every rank whether any of them found one. The
scale and its counters are identical on every rank and are saved with checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from spantrain.errors import ExecutionError
from spantrain.runtime.config import INITIAL_LOSS_SCALE

__all__ = ["LossScaler", "MAX_OVERFLOWS_IN_ROW"]

MAX_OVERFLOWS_IN_ROW = 50
"""Overflows in a row after which the run stops: by then the scale has fallen by 2^50, so the
overflow is not the scale's (fp16 activations beyond its range, or a diverged run); halving on
would reach a scale of 0 and a division by it."""


@dataclass
class LossScaler:
    """The run's loss scale and its history (identical on every rank)."""

    scale: float = INITIAL_LOSS_SCALE
    growth_interval: int = 2000
    """Clean iterations in a row before the scale doubles."""
    clean: int = 0
    """Clean iterations since the last overflow or growth."""
    skipped: int = 0
    """Iterations whose update was skipped on overflow, over the whole run (resumes included)."""
    in_row: int = 0
    """Overflows since the last clean iteration."""

    def __post_init__(self) -> None:
        assert self.scale > 0 and self.growth_interval > 0

    def scaled(self, loss: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        """`loss` times the current scale: the schedule's loss function on the last stage."""
        return lambda *args: loss(*args) * self.scale

    def unscale(self, params: Iterable[torch.nn.Parameter]) -> torch.Tensor:
        """Divide the gradients by the scale in place; returns 1.0 if any is inf or NaN, else 0.0
        (a tensor on the gradients' device: no host sync per parameter)."""
        found = None
        inv = 1.0 / self.scale
        for p in params:
            if p.grad is None:
                continue
            p.grad.mul_(inv)
            bad = (~torch.isfinite(p.grad)).any()
            found = bad if found is None else found | bad
        if found is None:
            return torch.zeros(1)
        return found.float().reshape(1)

    def unscale_and_agree(self, params: Iterable[torch.nn.Parameter], vote: Callable[[torch.Tensor], None],
                          device: torch.device | str = "cpu") -> tuple[float, bool]:
        """One iteration's decision: unscale this rank's gradients, sum every rank's overflow vote
        (`vote`: an all-reduce over the world, in place), update the scale. Returns the scale the
        iteration ran with and whether its update must be skipped (the same on every rank)."""
        scale = self.scale
        found = self.unscale(params).to(device)
        vote(found)
        overflow = bool(found.item() > 0)
        self.update(overflow)
        return scale, overflow

    def update(self, overflow: bool) -> None:
        """After an iteration: halve on overflow, double after `growth_interval` clean ones;
        `ExecutionError` after `MAX_OVERFLOWS_IN_ROW` overflows in a row (every rank alike)."""
        if overflow:
            self.scale /= 2
            self.clean = 0
            self.skipped += 1
            self.in_row += 1
            if self.in_row >= MAX_OVERFLOWS_IN_ROW:
                raise ExecutionError(f"fp16 overflowed in {self.in_row} iterations in a row (loss scale now "
                                     f"{self.scale:.3g}): the model's values exceed fp16's range or training "
                                     "diverged; train in bf16 or fp32 (--precision), or lower --lr")
            return
        self.in_row = 0
        self.clean += 1
        if self.clean == self.growth_interval:
            self.scale *= 2
            self.clean = 0

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's scaler (in place: the schedule's loss function holds this one);
        a field the checkpoint lacks (older ones had no `in_row`) keeps its default."""
        for f in dataclasses.fields(self):
            if f.name in state:
                setattr(self, f.name, float(state[f.name]) if f.name == "scale" else int(state[f.name]))
