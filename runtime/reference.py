"""Single-process training on the same samples: the yardstick for exactness and overhead.

It uses the same layers, initialisation, data order, loss and AdamW as the distributed
runtime, and takes the whole iteration batch in one forward/backward. Distributed runs of
any plan must land on the same parameters (up to float rounding), and the runtime
benchmark compares its step time with this.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from spantrain.runtime.config import OptimConfig
from spantrain.runtime.data import SampleStream, load_tokens
from spantrain.runtime.models import build_stage_module, loss_fn, require_arch
from spantrain.runtime.optim import make_optimizer
from spantrain.workload import Workload

__all__ = ["ReferenceResult", "train_reference"]


@dataclass
class ReferenceResult:
    """Per-iteration losses and seconds, and the final parameters."""

    losses: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)
    """CPU seconds of each iteration (this process, all threads)."""
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    """Final parameters by plan-independent key (``layers.{i}.{name}``)."""


def train_reference(workload: Workload, *, steps: int, batch: int, seed: int = 0, optim: OptimConfig | None = None,
                    data: str | None = None, start_sample: int = 0, threads: int | None = None,
                    precision: str = "fp32") -> ReferenceResult:
    """Train `steps` iterations of `batch` samples from global sample `start_sample` on, in
    `precision` (`spantrain.runtime.models.TRAIN_PRECISIONS`)."""
    arch = require_arch(workload)
    if threads:
        torch.set_num_threads(threads)
    stream = SampleStream(load_tokens(data), seq_len=workload.seq_len, seed=seed, vocab_size=arch.vocab_size,
                          masked_lm=arch.family == "bert")
    model = build_stage_module(workload, 0, workload.num_layers, seed=seed, precision=precision)
    opt = make_optimizer(model, optim or OptimConfig())
    out = ReferenceResult()
    pos = start_sample
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        x, y = stream.batch(pos, batch)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.step_s.append(time.perf_counter() - t0)
        out.cpu_s.append(time.process_time() - c0)
        out.losses.append(float(loss.detach()))
        pos += batch
    out.params = {k: p.detach().clone() for ps in model.layer_parameters().values() for k, p in ps}
    return out
