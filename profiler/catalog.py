"""A catalog of accelerators with the figures training actually sees.

`tflops` is *sustained* dense mixed-precision throughput on transformer layers, taken as
roughly 40-50% of the datasheet's dense fp16/bf16 tensor peak (the model FLOPs
utilisation large-model training reaches in practice), not the peak itself; less for the T4
and the Jetson, held back by their power and memory bandwidth.
`memory_gb` is the card's memory; the cost model keeps its own reserve for buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GpuModel", "CATALOG"]


@dataclass(frozen=True, kw_only=True)
class GpuModel:
    """One accelerator model."""

    name: str
    """Label written into the spec's `gpu` field."""
    peak_tflops: float
    """Datasheet dense fp16/bf16 tensor-core peak, TFLOP/s."""
    tflops: float
    """Sustained training throughput, TFLOP/s (what specs carry)."""
    memory_gb: float
    """Device memory, GB."""
    intra_node_gbps: float
    """GPU-to-GPU bandwidth inside one server (NVLink where present, else PCIe)."""


CATALOG: dict[str, GpuModel] = {g.name: g for g in [
    # NVLink 4 (900 GB/s bidirectional) -> ~3600 Gbit/s one way; we keep figures conservative.
    GpuModel(name="H100-80GB", peak_tflops=989, tflops=400, memory_gb=80, intra_node_gbps=2400),
    GpuModel(name="A100-80GB", peak_tflops=312, tflops=150, memory_gb=80, intra_node_gbps=1600),
    GpuModel(name="A100-40GB", peak_tflops=312, tflops=140, memory_gb=40, intra_node_gbps=1600),
    GpuModel(name="V100-32GB", peak_tflops=125, tflops=50, memory_gb=32, intra_node_gbps=800),
    GpuModel(name="T4", peak_tflops=65, tflops=20, memory_gb=16, intra_node_gbps=100),
    GpuModel(name="RTX3090", peak_tflops=71, tflops=35, memory_gb=24, intra_node_gbps=100),
    GpuModel(name="RTX3060", peak_tflops=25, tflops=12, memory_gb=12, intra_node_gbps=50),
    # Orin's GPU peaks near 42 dense fp16 TFLOP/s at MAXN; training sustains a fraction of it,
    # and its 32 GB are shared with the CPU.
    GpuModel(name="Jetson-AGX-Orin", peak_tflops=42, tflops=8, memory_gb=32, intra_node_gbps=10),
]}
"""Every known accelerator by label."""
