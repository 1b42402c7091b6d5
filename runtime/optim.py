"""AdamW over a stage's layers, with its state addressable by layer.

Every rank, and the single-process reference, builds the optimizer the same way, so a
replica's update of a layer is the same arithmetic wherever that layer lives. Weight decay
applies to matrices and embeddings only (not to norms and biases), as is usual for GPTs.

The state of each parameter (``step``, ``exp_avg``, ``exp_avg_sq``) is named after the
parameter's plan-independent key (``optim.layers.{i}.{name}.exp_avg``), which is what lets
a checkpoint written under one plan be loaded under another.
"""

from __future__ import annotations

import torch

from spantrain.runtime.config import OptimConfig
from spantrain.runtime.models import StageModule

__all__ = ["make_optimizer", "ensure_state", "optimizer_tensors", "STATE_FIELDS"]

STATE_FIELDS = ("step", "exp_avg", "exp_avg_sq")


def make_optimizer(module: StageModule, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the stage's parameters: decay on matrices and embeddings, none on norms and biases."""
    decay, no_decay = [], []
    for _, params in module.layer_parameters().items():
        for _, p in params:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [g for g in ({"params": decay, "weight_decay": cfg.weight_decay},
                          {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    # foreach=False: one code path on every device, so replicas and the reference agree bit for bit.
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, foreach=False)


def ensure_state(optimizer: torch.optim.Optimizer) -> None:
    """Create AdamW's state for parameters that have none yet (as its first step would), so it can be loaded into."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def optimizer_tensors(module: StageModule, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """``optim.{param key}.{field}`` -> the live state tensor (call `ensure_state` first)."""
    out = {}
    for _, params in module.layer_parameters().items():
        for key, p in params:
            state = optimizer.state[p]
            for f in STATE_FIELDS:
                out[f"optim.{key}.{f}"] = state[f]
    return out
