"""Data-parallel sync of each layer among the ranks that hold it, across pipelines.

Pipelines may cut the model differently, so "the replicas of a layer" differ from layer to
layer. Layers held by the same set of ranks form one *holder group* and sync in a single
flattened message over their own process group; groups are visited in the order of their
first layer on every rank, which keeps blocking collectives on different groups free of
deadlock.

Gradient weighting: after its schedule a pipeline's gradient is the mean over its own
samples (torch's schedules divide by the micro-batch count; every micro-batch has the same
size). Each replica multiplies by its share ``b_p / B`` of the iteration batch before the
sum, so the result is the mean over all ``B`` samples: exactly one big batch, whatever the
pipelines' micro-batch sizes and counts.

Modes (from the plan):

- ``allreduce``: one flat sum over each holder group.
- ``hierarchical``: sum inside each region first, then among one leader per region, then
  the leaders broadcast back inside their regions. Same sum, fewer slow-link messages.
- ``local-sgd`` with period ``H``: replicas take local AdamW steps on their own gradients;
  every ``H``-th iteration is a sync iteration: gradients are weighted and summed as in
  ``allreduce`` before the step, and afterwards parameters and AdamW moments are averaged
  (weighted by batch share), which re-aligns replicas that drifted. With ``H = 1`` every
  iteration syncs and no replica ever drifts, so the averaging is skipped and local-sgd *is*
  allreduce, bit for bit (with plain SGD the definition coincides with classic local SGD for
  any ``H``, since averaging commutes with a linear step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from spantrain.runtime.models import StageModule
from spantrain.runtime.optim import ensure_state
from spantrain.runtime.rankmap import Layout
from spantrain.runtime.transport import Transport

__all__ = ["HolderGroup", "build_holder_groups", "Synchronizer"]


@dataclass
class HolderGroup:
    """Layers held by the same ranks, and the process groups that sync them."""

    ranks: tuple[int, ...]
    layers: tuple[int, ...]
    flat: dist.ProcessGroup | None = None
    region_ranks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    region_groups: dict[str, dist.ProcessGroup | None] = field(default_factory=dict)
    leaders: tuple[int, ...] = ()
    leader_group: dist.ProcessGroup | None = None


def build_holder_groups(layout: Layout, num_layers: int, mode: str, transport: Transport) -> list[HolderGroup]:
    """Every holder group with its process groups; a collective call: every rank runs it alike."""
    out = []
    for ranks, layers in layout.holder_sets(num_layers):
        g = HolderGroup(ranks=ranks, layers=layers)
        if len(ranks) > 1:
            if mode == "hierarchical":
                by_region: dict[str, list[int]] = {}
                for r in ranks:
                    by_region.setdefault(layout.roles[r].region, []).append(r)
                g.region_ranks = {reg: tuple(rs) for reg, rs in sorted(by_region.items())}
                for reg, rs in g.region_ranks.items():
                    g.region_groups[reg] = transport.new_group(rs) if len(rs) > 1 else None
                g.leaders = tuple(sorted(rs[0] for rs in g.region_ranks.values()))
                g.leader_group = transport.new_group(g.leaders) if len(g.leaders) > 1 else None
            else:
                g.flat = transport.new_group(ranks)
        out.append(g)
    return out


class Synchronizer:
    """Weights, reduces and (for local-sgd) averages this rank's layers with their other holders."""

    def __init__(self, *, mode: str, period: int, rank: int, region: str, share: float,
                 groups: list[HolderGroup], transport: Transport):
        self.mode = mode
        self.period = period
        self.rank = rank
        self.region = region
        self.share = share
        self.transport = transport
        # Only groups this rank belongs to, with more than one holder, in the global order.
        self.groups = [g for g in groups if rank in g.ranks and len(g.ranks) > 1]

    def is_sync_step(self, step: int) -> bool:
        """Whether iteration `step` (0-based) sums gradients across replicas."""
        return self.mode != "local-sgd" or (step + 1) % self.period == 0

    def reduce_gradients(self, module: StageModule, step: int) -> None:
        """Turn each replica's gradient into the gradient of the whole iteration batch."""
        if not self.groups or not self.is_sync_step(step):
            return
        per_layer = module.layer_parameters()
        for g in self.groups:
            params = [p for i in g.layers if i in per_layer for _, p in per_layer[i]]
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
            flat = _flatten_dense_tensors(grads).mul_(self.share)
            self._sum(flat, g)
            for p, synced in zip(params, _unflatten_dense_tensors(flat, grads)):
                if p.grad is None:
                    p.grad = synced
                else:
                    p.grad.copy_(synced)

    def average_state(self, module: StageModule, optimizer: torch.optim.Optimizer, step: int,
                      force: bool = False) -> None:
        """local-sgd, period > 1, sync iterations (or `force`): weighted average of parameters and AdamW moments."""
        if self.mode != "local-sgd" or self.period == 1 or not self.groups:
            return
        if not (force or self.is_sync_step(step)):
            return
        # before any update ran (fp16 skipped every one so far) AdamW has no state: zero moments are its fresh one
        ensure_state(optimizer)
        per_layer = module.layer_parameters()
        for g in self.groups:
            tensors = []
            for i in g.layers:
                for _, p in per_layer.get(i, []):
                    state = optimizer.state[p]
                    tensors += [p.data, state["exp_avg"], state["exp_avg_sq"]]
            flat = _flatten_dense_tensors(tensors).mul_(self.share)
            self._sum(flat, g)
            with torch.no_grad():
                for t, avg in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                    t.copy_(avg)

    def _sum(self, flat: torch.Tensor, g: HolderGroup) -> None:
        t = self.transport
        if self.mode != "hierarchical":
            t.all_reduce(flat, g.flat)
            return
        members = g.region_ranks[self.region]
        region_group = g.region_groups[self.region]
        if region_group is not None:
            t.all_reduce(flat, region_group)
        if g.leader_group is not None and self.rank == members[0]:
            t.all_reduce(flat, g.leader_group)
        if region_group is not None and g.leader_group is not None:  # one region: the first sum was all of it
            t.broadcast(flat, src=members[0], group=region_group)
