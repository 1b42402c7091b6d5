"""What the partition DP weighs, worked out plainly for the partition tests."""

from __future__ import annotations

from spantrain.env.calibration import C_MSG
from spantrain.env.partition import Partitioner

__all__ = ["dp_terms"]


def dp_terms(part: Partitioner, devs, starts, m: int, n_ops: float) -> tuple[float, float]:
    """(bottleneck, fill) of a partition: the slowest stage or link per micro-batch of m samples,
    and one micro-batch's seconds through every stage and link (latencies included)."""
    mdl, L = part.model, part.num_layers
    bott = fill = 0.0
    for s, d in enumerate(devs):
        a, b = starts[s], starts[s + 1] if s + 1 < len(devs) else L
        c = m * (part._tfb[d, b] - part._tfb[d, a]) + part._op[d] * n_ops
        bott, fill = max(bott, c), fill + c
        if s:
            d0 = devs[s - 1]
            occ = m * part._bb[a - 1] / min(mdl.bandwidth[d0, d], mdl.bandwidth[d, d0]) + mdl.calib[C_MSG]
            bott, fill = max(bott, occ), fill + 2 * occ + mdl.latency[d0, d] + mdl.latency[d, d0]
    return bott, fill
