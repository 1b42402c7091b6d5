"""The device-graph encoder and the action heads of the scheduling policy.

Layers take tensors (node features, edge index, edge features), never environment
objects; the padded observation becomes a PyG-style batch only at the features
extractor boundary (`spantrain.policies.extractor`). No device ids enter the network,
and every head is per node, per pair or pooled, so one set of weights serves clusters of
any size and any device order (permuting devices permutes the logits and leaves the
value unchanged; tested).
"""

from __future__ import annotations

import numbers
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch_geometric.nn import GATv2Conv
from torch_geometric.utils import scatter

from spantrain.errors import SpantrainError, join_problems

__all__ = ["DeviceGraphEncoder", "PlanHeads"]


class DeviceGraphEncoder(nn.Module):
    """Residual GATv2 layers over the complete device graph with edge features.

    Attention over all other devices lets a device weigh its neighbours by the link
    (bandwidth, latency) and their roles, which is what placement decisions hinge on.
    """

    def __init__(self, node_in: int, edge_in: int, hidden: int = 64, layers: int = 3, heads: int = 4):
        super().__init__()
        check_sizes(hidden=hidden, layers=layers, heads=heads)
        self.node_proj = nn.Sequential(nn.Linear(node_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden))
        # raw edge features go straight into each layer's attention: projecting them to
        # `hidden` first would cost O(edges x hidden^2) per layer on complete graphs
        with _scratch_tempdir():
            self.convs = nn.ModuleList(GATv2Conv(hidden, hidden // heads, heads=heads, edge_dim=edge_in,
                                                 add_self_loops=False) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(hidden) for _ in range(layers))
        self.hidden = hidden

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        h = self.node_proj(x)
        for conv, norm in zip(self.convs, self.norms):
            h = norm(h + torch.relu(conv(h, edge_index, edge_attr)))
        return h


def check_sizes(*, hidden: Any, layers: Any, heads: Any) -> None:
    """SpantrainError naming every bad network size (hidden=0 or layers=-1 built a network
    that learned nothing, heads=0 was a ZeroDivisionError, "64" a TypeError)."""
    problems = [f"{name} must be an integer >= 1, got {value!r:.40}" for name, value in
                (("hidden", hidden), ("layers", layers), ("heads", heads))
                if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1]
    if not problems and hidden % heads:
        problems.append(f"hidden ({hidden}) must be a multiple of heads ({heads}), which split it")
    if problems:
        raise SpantrainError(f"policy network: {join_problems(problems)}")


@contextmanager
def _scratch_tempdir() -> Iterator[None]:
    """Point `tempfile` at a directory removed on exit.

    The first instance of a PyG conv class in a process renders its `propagate` into a
    .py file in the temp directory, imports it and never deletes it: without this every
    `spantrain plan` left two files in /tmp. The module stays imported; only the file goes.
    """
    saved = tempfile.tempdir
    with tempfile.TemporaryDirectory(prefix="spantrain-pyg-") as scratch:
        tempfile.tempdir = scratch
        try:
            yield
        finally:
            tempfile.tempdir = saved


class PlanHeads(nn.Module):
    """Scores every move from node embeddings: pairs (insert, swap), nodes (idle, solo), knobs; and a value latent."""

    def __init__(self, hidden: int, edge_in: int, global_in: int, knobs: int, pair_hidden: int = 32):
        super().__init__()
        self.global_proj = nn.Sequential(nn.Linear(2 * hidden + global_in, hidden), nn.ReLU(),
                                         nn.Linear(hidden, hidden), nn.ReLU())
        # pair scores factorized as MLP(A h_i + B h_j + C e_ij + D g): linear in N^2, not N^2 x hidden^2
        self.pair_src = nn.Linear(hidden, pair_hidden)
        self.pair_dst = nn.Linear(hidden, pair_hidden, bias=False)
        self.pair_edge = nn.Linear(edge_in, pair_hidden, bias=False)
        self.pair_glob = nn.Linear(hidden, pair_hidden, bias=False)
        self.pair_out = nn.Linear(pair_hidden, 2)
        self.node_out = nn.Sequential(nn.Linear(2 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))
        self.knob_out = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, knobs))
        self.hidden = hidden

    def pooled(self, h: torch.Tensor, batch: torch.Tensor, size: int, globals_: torch.Tensor) -> torch.Tensor:
        mean = scatter(h, batch, dim=0, dim_size=size, reduce="mean")
        top = scatter(h, batch, dim=0, dim_size=size, reduce="max")
        return self.global_proj(torch.cat([mean, top, globals_], dim=-1))

    def forward(self, dense_h: torch.Tensor, edges: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Flat logits (B, 2N^2 + 2N + knobs) from dense node embeddings (B, N, hidden),
        raw edge features (B, N, N, E) and the pooled graph embedding (B, hidden)."""
        b, n, _ = dense_h.shape
        pair = (self.pair_src(dense_h)[:, :, None, :] + self.pair_dst(dense_h)[:, None, :, :]
                + self.pair_edge(edges) + self.pair_glob(g)[:, None, None, :])
        pair = self.pair_out(torch.relu(pair))                      # (B, N, N, 2)
        insert = pair[..., 0].reshape(b, n * n)
        swap = pair[..., 1].reshape(b, n * n)
        node = self.node_out(torch.cat([dense_h, g[:, None, :].expand(b, n, self.hidden)], dim=-1))
        knob = self.knob_out(g)
        return torch.cat([insert, swap, node[..., 0], node[..., 1], knob], dim=-1)
