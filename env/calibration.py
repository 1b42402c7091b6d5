"""Every constant the cost model assumes, in one place, so a profiler can calibrate them.

The FLOP and byte counts come from the workload and the cluster; what they cannot say
(fixed per-op and per-message software costs, optimizer state layout, how fast a device
streams memory) lives here. `Calibration` bundles the values one `CostModel` uses; the
module-level defaults are the documented assumptions.

Bytes per parameter (AdamW):

- Resident state: mixed precision (bf16/fp16) keeps a 2-byte weight, a 2-byte gradient
  and 12 bytes of fp32 master weight, first and second moment = 16 bytes; fp32 keeps
  4 weight + 4 gradient + 8 moments = 16 bytes. Hence `STATE_BYTES_PER_PARAM = 16` for
  every precision.
- Gradients on the wire: one element per parameter in the training precision
  (`Workload.bytes_per_element`: 2 for bf16/fp16, 4 for fp32), i.e. gradients are
  reduced in the precision they are computed in. Local-SGD averages parameters in the
  same width.
- Optimizer step: AdamW is bound by memory traffic, not FLOPs. It reads the master
  weight, gradient and both moments and writes the weight, both moments and the
  low-precision copy: about `OPTIMIZER_BYTES_PER_PARAM = 30` bytes. A device's memory
  bandwidth is not in the cluster spec, so it is taken proportional to its sustained
  FLOP/s: `MEMORY_BYTES_PER_FLOP = 0.02` bytes/s per FLOP/s (35 TFLOP/s -> 700 GB/s,
  close to an RTX 3090's 936 GB/s at its ~70 % achievable streaming rate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "OP_OVERHEAD_S",
    "MESSAGE_OVERHEAD_S",
    "STATE_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_PARAM",
    "MEMORY_BYTES_PER_FLOP",
    "RESERVED_BYTES",
    "Calibration",
]

OP_OVERHEAD_S = 0.0
"""Fixed seconds added to every compute op (F, B, W, or a fused backward): kernel launches,
Python dispatch. 0 until measured; a fused backward pays it once, a split one twice."""

MESSAGE_OVERHEAD_S = 0.0
"""Fixed seconds added to every point-to-point message and every collective step
(serialization, a gloo/NCCL call). Occupies the sending link like payload does."""

STATE_BYTES_PER_PARAM = 16.0
"""Resident bytes per parameter: weight + gradient + AdamW state (see module docstring)."""

OPTIMIZER_BYTES_PER_PARAM = 30.0
"""Memory traffic of one AdamW update per parameter (see module docstring)."""

MEMORY_BYTES_PER_FLOP = 0.02
"""Device memory bandwidth per unit of sustained compute, bytes/s per FLOP/s."""

RESERVED_BYTES = 0.0
"""Bytes per device the framework holds besides the model (CUDA context, allocator
fragmentation). 0 until measured: memory estimates are for the training state alone."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The constants one `CostModel` uses; defaults are the module-level assumptions."""

    op_overhead_s: float = OP_OVERHEAD_S
    message_overhead_s: float = MESSAGE_OVERHEAD_S
    state_bytes_per_param: float = STATE_BYTES_PER_PARAM
    optimizer_bytes_per_param: float = OPTIMIZER_BYTES_PER_PARAM
    memory_bytes_per_flop: float = MEMORY_BYTES_PER_FLOP
    reserved_bytes: float = RESERVED_BYTES
    grad_bytes_per_param: float | None = None
    """Bytes per gradient element on the wire; None = the workload's `bytes_per_element`."""

    def vector(self, bytes_per_element: int) -> np.ndarray:
        """The values as the flat float64 array the compiled kernels take (order is fixed)."""
        grad = float(bytes_per_element) if self.grad_bytes_per_param is None else self.grad_bytes_per_param
        return np.array([self.op_overhead_s, self.message_overhead_s, self.state_bytes_per_param, grad,
                         self.optimizer_bytes_per_param, self.memory_bytes_per_flop, self.reserved_bytes],
                        dtype=np.float64)


# Positions in `Calibration.vector` (the kernels index it by these).
C_OP, C_MSG, C_STATE, C_GRAD, C_OPT, C_MEMBW, C_RESERVED = range(7)
