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

Fixed costs come in two forms: seconds (`op_overhead_s`, CPU-side costs of a GPU that do
not depend on its speed) and FLOP-equivalents (`op_overhead_flops`,
`iteration_overhead_flops`: work done at the device's own sustained rate, i.e. divided by
its FLOP/s; right where the framework's Python and dispatch run on the device being
modelled, as on CPUs and the local emulated cluster, whose CPU quotas slow them too).

How iterations are executed (`sync_overlap`): the defaults describe an executor that
starts each data-parallel collective as soon as its layers' gradients are complete,
overlapping it with the rest of the backward pass and the other pipelines, and lets each
stage start its next iteration when it is done (so ZB-H2 gains its steady-state period).
spantrain's runtime (`spantrain.runtime.worker`) instead runs, on every rank, the whole
schedule, then its collectives in layer order, then the optimizer, and meets all ranks at
the end of every iteration; ``sync_overlap: false`` models that. Calibration profiles
(YAML/JSON, `Calibration.from_file`; ``examples/calibration/emulated-cpu.yaml`` is the
one fitted to that runtime on the local emulated cluster) set any of the fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spantrain._spec import FIGURE_MAX, FIGURE_MIN, got, is_figure, other_kind, shown
from spantrain.errors import SpecError, join_problems

__all__ = [
    "OP_OVERHEAD_S",
    "MESSAGE_OVERHEAD_S",
    "STATE_BYTES_PER_PARAM",
    "OPTIMIZER_BYTES_PER_PARAM",
    "MEMORY_BYTES_PER_FLOP",
    "RESERVED_BYTES",
    "Calibration",
    "EMULATED_CPU",
    "SHIPPED_PROFILES",
    "C_OP", "C_MSG", "C_STATE", "C_GRAD", "C_OPT", "C_MEMBW", "C_RESERVED", "C_OPF", "C_ITF", "C_OVERLAP", "C_LSGD",
    "C_SPB", "C_SPW",
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

EMULATED_CPU = Path(__file__).resolve().parent / "profiles" / "emulated-cpu.yaml"
"""The profile fitted to spantrain's runtime on the local emulated cluster (shipped in the
package; ``examples/calibration/emulated-cpu.yaml`` links to it)."""

SHIPPED_PROFILES = {"emulated-cpu": EMULATED_CPU}
"""Profiles a ``--calibration`` may name instead of a file (an installed package has no examples/)."""


_DIVISORS = ("memory_bytes_per_flop",)
"""Constants the model divides by: 0 is no figure for them."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The constants one `CostModel` uses; defaults are the module-level assumptions."""

    op_overhead_s: float = OP_OVERHEAD_S
    """Fixed seconds per compute op (`OP_OVERHEAD_S`)."""
    message_overhead_s: float = MESSAGE_OVERHEAD_S
    """Fixed seconds per message and collective step (`MESSAGE_OVERHEAD_S`)."""
    state_bytes_per_param: float = STATE_BYTES_PER_PARAM
    """Resident training-state bytes per parameter (`STATE_BYTES_PER_PARAM`)."""
    optimizer_bytes_per_param: float = OPTIMIZER_BYTES_PER_PARAM
    """Memory traffic of one optimizer update per parameter (`OPTIMIZER_BYTES_PER_PARAM`)."""
    memory_bytes_per_flop: float = MEMORY_BYTES_PER_FLOP
    """Memory bandwidth per unit of compute (`MEMORY_BYTES_PER_FLOP`)."""
    reserved_bytes: float = RESERVED_BYTES
    """Bytes per device held besides the model (`RESERVED_BYTES`)."""
    grad_bytes_per_param: float | None = None
    """Bytes per gradient element on the wire; None = the workload's `bytes_per_element`."""
    op_overhead_flops: float = 0.0
    """Fixed work per compute op in FLOPs at the device's sustained rate (added to
    `op_overhead_s` as ``op_overhead_flops / device FLOP/s``): the pipelining framework's
    per-op Python and dispatch where the device itself runs them."""
    iteration_overhead_flops: float = 0.0
    """Fixed work per iteration on every device in FLOPs at its sustained rate: zeroing
    gradients, the per-iteration bookkeeping, batch preparation."""
    sync_overlap: bool = True
    """True: collectives overlap the backward pass and stages run iterations back to back
    (module docstring). False: every rank syncs after its whole schedule, in layer order,
    then steps its optimizer, and all ranks meet at the end of each iteration; the
    iteration lasts until the last rank is done."""
    local_sgd_bytes_per_param: float | None = None
    """Bytes per parameter moved at each local-SGD sync point (period > 1); None = the
    gradient width (parameters averaged in the training precision). spantrain's runtime sums
    the fp32 gradient and then averages weights and both AdamW moments: 4 + 12 = 16."""
    split_input_grad_factor: float = 1.0
    """Cost of a zero-bubble schedule's separate input-gradient op (B) relative to its FLOP
    share of the fused backward. 1: splitting is free. torch.distributed.pipelining's split
    walks the autograd graph twice, so B and W together cost ~1.5x the fused backward."""
    split_weight_grad_factor: float = 1.0
    """The same for the separate weight-gradient op (W)."""

    @classmethod
    def from_dict(cls, raw: Any, source: str = "calibration") -> Calibration:
        """From ``{field: number}`` (a ``calibration:`` section is also accepted, other top-level
        keys of that form are notes); every problem is reported at once in a `SpecError`."""
        if wrong := other_kind(raw, "calibration profile"):  # a spec or plan: one line, not a dozen unknown keys
            raise SpecError(f"{source}: {wrong}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if isinstance(raw, dict) and "calibration" in raw:
            # beside the section, a constant is not a note: it was silently ignored (a line
            # appended to the shipped profile without its indentation)
            outside = [key for key in raw if key in fields]
            if outside:
                raise SpecError(f"{source}: {', '.join(map(repr, outside))} {'is' if len(outside) == 1 else 'are'} "
                                "outside the calibration: section, where constants are ignored: move "
                                f"{'it' if len(outside) == 1 else 'them'} into the section")
            raw = raw["calibration"]
        if not isinstance(raw, dict):
            raise SpecError(f"{source}: expected a mapping of calibration constants")
        problems, values = [], {}
        unknown = [key for key in raw if key not in fields]
        if unknown:  # listed once: a cluster or suite file given here has a dozen keys
            problems.append(f"unknown constant{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                            f"(known: {', '.join(fields)})")
        _check_constants({key: value for key, value in raw.items() if key in fields}, problems, values)
        if problems:
            raise SpecError(f"{source}: " + join_problems(problems))
        return cls(**values)

    def __post_init__(self) -> None:
        # built in code, Calibration(op_overhead_s=nan) or ="1" was taken (and failed, or predicted nan, inside)
        problems: list[str] = []
        _check_constants(dataclasses.asdict(self), problems, {})
        if problems:
            raise SpecError("Calibration: " + join_problems(problems))

    @classmethod
    def from_file(cls, path: str | Path) -> Calibration:
        """A calibration profile (YAML or JSON), e.g. ``examples/calibration/emulated-cpu.yaml``,
        or the name of a shipped one (`SHIPPED_PROFILES`) when no such file exists."""
        if str(path) in SHIPPED_PROFILES and not Path(path).exists():
            path = SHIPPED_PROFILES[str(path)]
        from spantrain._spec import read_structured

        return cls.from_dict(read_structured(path, SpecError), str(path))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def vector(self, bytes_per_element: int) -> np.ndarray:
        """The values as the flat float64 array the compiled kernels take (order is fixed)."""
        grad = float(bytes_per_element) if self.grad_bytes_per_param is None else self.grad_bytes_per_param
        lsgd = grad if self.local_sgd_bytes_per_param is None else self.local_sgd_bytes_per_param
        return np.array([self.op_overhead_s, self.message_overhead_s, self.state_bytes_per_param, grad,
                         self.optimizer_bytes_per_param, self.memory_bytes_per_flop, self.reserved_bytes,
                         self.op_overhead_flops, self.iteration_overhead_flops, float(self.sync_overlap), lsgd,
                         self.split_input_grad_factor, self.split_weight_grad_factor], dtype=np.float64)


def _check_constants(raw: dict[str, Any], problems: list[str], values: dict[str, Any]) -> None:
    """Record each of `raw`'s constants (all known fields) in `values` as the model takes it, or
    its problem in `problems`."""
    defaults = {f.name: f.default for f in dataclasses.fields(Calibration)}
    for key, value in raw.items():
        if value is None and key in ("grad_bytes_per_param", "local_sgd_bytes_per_param"):
            values[key] = None
        elif isinstance(defaults[key], bool):
            if not isinstance(value, bool):
                problems.append(f"{key} must be true or false, got {shown(value)}")
            values[key] = value
        elif not is_figure(value):
            # past FIGURE_MAX the kernels' sums overflow to inf and their schedule simulation deadlocks
            problems.append(f"{key} must be a number from 0 to {FIGURE_MAX:g}, {got(value)}")
        elif key in _DIVISORS and value < FIGURE_MIN:  # the optimizer's time divides by it: 5e-324 overflows
            problems.append(f"{key} must be from {FIGURE_MIN:g} to {FIGURE_MAX:g} (a rate the model divides "
                            f"by), {got(value)}")
        else:
            values[key] = float(value)


# Positions in `Calibration.vector` (the kernels index it by these).
C_OP, C_MSG, C_STATE, C_GRAD, C_OPT, C_MEMBW, C_RESERVED, C_OPF, C_ITF, C_OVERLAP, C_LSGD, C_SPB, C_SPW = range(13)
