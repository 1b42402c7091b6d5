"""One rank's pipeline stage and the schedule that drives it, on torch.distributed.pipelining.

- ``gpipe`` -> `ScheduleGPipe`; ``1f1b`` -> `Schedule1F1B` (torch refuses 1F1B with fewer
  micro-batches than stages; there 1F1B's order *is* GPipe's, all forwards then all
  backwards, so `ScheduleGPipe` runs it).
- ``zb-h1`` / ``zb-h2`` -> torch's custom-order runtime (`_PipelineScheduleRuntime`) fed with
  the per-stage F/B/W order from `spantrain.runtime.zb_order`: B computes only the input
  gradient (sent upstream at once), W the weight gradient later. torch lowers the order to
  sends and receives itself.

Stage shapes are inferred by torch at the first step: with shapes given up front (its
static path) the first stage's backward received no output gradient in this torch release
(checked with gloo, 2 stages, every schedule); inference costs one extra forward of one
micro-batch on the first iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from spantrain.runtime import zb_order

__all__ = ["StageRunner", "build_stage_runner"]


@dataclass
class StageRunner:
    """Runs one iteration of this rank's stage; returns the micro-batch losses on the last stage."""

    schedule: object
    is_first: bool
    is_last: bool
    order_source: str
    """``torch`` for gpipe/1f1b, else where the zero-bubble order came from."""

    def step(self, inputs: torch.Tensor | None, targets: torch.Tensor | None) -> list[torch.Tensor]:
        """One iteration: the first stage passes its samples, the last its targets; others pass None."""
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()
        kwargs = {"target": targets, "losses": losses} if self.is_last else {}
        self.schedule.step(*args, **kwargs)
        return losses


def build_stage_runner(*, schedule: str, module: torch.nn.Module, stage_index: int, stage_ranks: Sequence[int],
                       num_micro_batches: int, group: dist.ProcessGroup, device: torch.device,
                       loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       orders: Callable[[], tuple[list[list[zb_order.Op]], str]]) -> StageRunner:
    """The stage for global ranks `stage_ranks` (in stage order) and its schedule.

    `orders` gives the zero-bubble op order of every stage of this pipeline, and where it
    came from; it is called only for the zero-bubble schedules.
    """
    num_stages = len(stage_ranks)
    stage = PipelineStage(module, stage_index, num_stages, device, group=group)
    # Group ranks follow global-rank order; under torchrun that need not be stage order.
    group_rank = {s: dist.get_group_rank(group, r) for s, r in enumerate(stage_ranks)}
    stage.stage_index_to_group_rank = dict(group_rank)
    m = num_micro_batches
    if schedule == "gpipe" or (schedule == "1f1b" and m < num_stages):
        sched: object = ScheduleGPipe(stage, m, loss_fn=loss)
        source = "torch"
    elif schedule == "1f1b":
        sched = Schedule1F1B(stage, m, loss_fn=loss)
        source = "torch"
    else:
        stage_ops, source = orders()
        runtime = _PipelineScheduleRuntime([stage], m, loss_fn=loss)
        runtime._prepare_schedule_with_comms(zb_order.to_actions(stage_ops, group_rank))
        sched = runtime
    return StageRunner(schedule=sched, is_first=stage_index == 0, is_last=stage_index == num_stages - 1,
                       order_source=source)
