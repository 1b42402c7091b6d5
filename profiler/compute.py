"""Compute: forward and backward time of the workload's own layers on this device.

The layers are the runtime's (`spantrain.runtime.models.build_layer`), so the times are
those a stage of a real run pays. All blocks of a model have one shape, so the profiler
times the embedding, one block and the head, and lists the block's time for every block.

Big presets do not fit a CPU's time (one GPT-2 XL head forward at 1024 tokens is ~330
GFLOP). The profiler then times a *proxy*: the same layers (same hidden size, FFN size,
heads and vocabulary, so the same shapes per token) on fewer tokens (micro-batch first
reduced to 1, then the sequence halved) until one pass fits the compute budget, and
scales each layer's forward and backward time by the ratio of the workload's FLOPs at the
real shape to those at the proxy shape (attention's s^2 term included). `ComputeProfile`
records the proxy shape so nothing is hidden.

Precision: the workload's on CUDA; fp32 on CPU, where bf16 matmuls are emulated and the
runtime trains in fp32. Sustained TFLOP/s = the model's training FLOPs for one
micro-batch / the sum of its measured layer times.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

from spantrain.cluster import LayerTimes
from spantrain.errors import WorkloadError
from spantrain.workload import Workload

__all__ = ["ComputeProfile", "default_micro_batch", "measure_compute", "layer_flops", "timed_layers",
           "check_layers_fit", "cpu_free_bytes"]

_MIN_SEQ = 16
_MIN_REPS, _MAX_REPS = 3, 10_000
_SAMPLE_S, _MAX_GROUP = 0.5, 512
"""A timed repetition groups passes to last at least this long (see `_time_layer`)."""
_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class ComputeProfile:
    """What one device measured on one workload."""

    layer_times: LayerTimes
    """Per-layer forward/backward seconds at the workload's shape and `layer_times.batch`."""
    tflops: float
    """Sustained TFLOP/s over the whole model (forward + backward)."""
    proxy_batch: int
    proxy_seq_len: int
    """Shape actually timed (equal to the workload's when no proxy was needed)."""
    reps: int
    """Timed repetitions per layer (median taken)."""
    device: str
    """``cpu`` or the CUDA device name."""


def default_micro_batch(workload: Workload) -> int:
    """The micro-batch the times are measured at: global batch / 8, a typical pipeline micro-batch."""
    return max(1, workload.global_batch // 8)


def layer_flops(workload: Workload, index: int, batch: int) -> tuple[float, float]:
    """(forward, backward = B + W) FLOPs of layer `index` for `batch` samples."""
    layer = workload.layers[index]
    return layer.forward_flops * batch, (layer.input_grad_flops + layer.weight_grad_flops) * batch


def _proxy_workload(workload: Workload, seq_len: int) -> Workload:
    if seq_len == workload.seq_len:
        return workload
    return Workload.from_arch(workload.arch, name=workload.name, global_batch=workload.global_batch,
                              seq_len=seq_len, precision=workload.precision)


def _probe_flops_per_s(torch, device, dtype) -> float:
    """A quick matmul rate, only to size the proxy (the real figure comes from the layers)."""
    n = 256
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    _sync(torch, device)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05 or reps < 3:
        a @ b
        reps += 1
    _sync(torch, device)
    return 2 * n**3 * reps / (time.perf_counter() - t0)


def _choose_shape(workload: Workload, micro_batch: int, rate: float, budget_s: float) -> tuple[int, int]:
    """The largest (batch, seq) at most the real one whose three timed layers fit the budget."""
    batch, seq = micro_batch, workload.seq_len
    passes = _MIN_REPS + 1  # warm-up plus the minimum timed repetitions
    idx = (0, 1, workload.num_layers - 1)
    while True:
        proxy = _proxy_workload(workload, seq)
        cost = sum(sum(layer_flops(proxy, i, batch)) for i in idx) / rate * passes
        if cost <= budget_s or (batch == 1 and seq <= _MIN_SEQ):
            return batch, seq
        if batch > 1:
            batch = max(1, math.floor(batch * budget_s / cost))
        else:
            seq = max(_MIN_SEQ, seq // 2)


def timed_layers(workload: Workload) -> tuple[int, ...]:
    """The layers `measure_compute` times: the embedding, the first block and the head."""
    return tuple(sorted({0, 1, workload.num_layers - 1}))


def check_layers_fit(workload: Workload, free_bytes: int, element_size: int = 4) -> None:
    """`WorkloadError` when a timed layer cannot be held with its gradients in `free_bytes`:
    torch's allocator failed with a traceback asking for terabytes (the default element size is
    fp32's, a CPU device's)."""
    for i in timed_layers(workload):
        need = 2 * workload.layers[i].params * element_size  # weights and their gradients, activations aside
        if need > free_bytes:
            raise WorkloadError(f"layer {i} of {workload.name} has {workload.layers[i].params:,} parameters "
                                f"({need / 2**30:,.1f} GB with their gradients), more than this device has free "
                                f"({free_bytes / 2**30:,.1f} GB): it cannot be timed here; profile a model whose "
                                "layers fit (--model)")


def cpu_free_bytes() -> int:
    """Memory free on this machine (what a CPU device's layers are held in)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def _check_layers_fit(torch, workload: Workload, device, dtype) -> None:
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else cpu_free_bytes()
    check_layers_fit(workload, free, torch.tensor([], dtype=dtype).element_size())


def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_layer(torch, layer, make_input, out_grad_like, device, budget_s: float) -> tuple[float, float, int]:
    """Median forward and backward seconds of `layer` over repetitions that fit `budget_s`.

    Each repetition is a group of passes lasting at least `_SAMPLE_S` together (their mean
    counts): under a CPU quota (the emulator's cgroups) a device computes in bursts of a
    few milliseconds, and a single short pass ran either at full speed or through a stall,
    depending on where in the quota period it began; a median of such bimodal times put
    identical devices up to 2.8x apart. A group spans many quota periods (the emulator's
    are 10-20 ms) because the CPU time a window gets is quantized by periods: groups of
    50 ms (~5 periods) came out 20 % apart and profiles of the same device drifted by as
    much (their median picks one quantization step); at 0.5 s the step is ~2 % (shorter
    when the budget leaves less than `_MIN_REPS` + 1 such groups). The output gradient is
    drawn before the clock starts.
    """
    fwd, bwd = [], []
    t_start = time.perf_counter()
    sample_s = min(_SAMPLE_S, max(0.05, budget_s / (_MIN_REPS + 1)))  # a short budget still gets its repetitions
    group = 1
    for rep in range(_MAX_REPS + 1):
        f_sum = b_sum = 0.0
        for _ in range(group):
            x = make_input()
            layer.zero_grad(set_to_none=True)
            _sync(torch, device)
            t0 = time.perf_counter()
            y = layer(x)
            _sync(torch, device)
            t1 = time.perf_counter()
            grad = out_grad_like(y)
            _sync(torch, device)
            t2 = time.perf_counter()
            y.backward(grad)
            _sync(torch, device)
            t3 = time.perf_counter()
            f_sum += t1 - t0
            b_sum += t3 - t2
        if rep == 0:  # the first pass warms allocators and kernels up, and sizes the groups
            group = max(1, min(_MAX_GROUP, math.ceil(sample_s / max(f_sum + b_sum, 1e-6))))
        else:
            fwd.append(f_sum / group)
            bwd.append(b_sum / group)
        if len(fwd) >= _MIN_REPS and time.perf_counter() - t_start > budget_s:
            break
    fwd.sort()
    bwd.sort()
    return fwd[len(fwd) // 2], bwd[len(bwd) // 2], len(fwd)


def measure_compute(workload: Workload, *, micro_batch: int | None = None, budget_s: float = 10.0,
                    local_world_size: int = 1, local_rank: int = 0) -> ComputeProfile:
    """Time the workload's layers on this process's device within about `budget_s` seconds."""
    import torch

    from spantrain.runtime.models import build_layer, require_arch

    arch = require_arch(workload)
    mb = micro_batch or default_micro_batch(workload)
    if mb <= 0:
        raise WorkloadError(f"--micro-batch must be a positive integer, got {mb}")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        dtype = getattr(torch, _DTYPES[workload.precision])
        name = torch.cuda.get_device_name(device)
    else:
        device, dtype, name = torch.device("cpu"), torch.float32, "cpu"
        if "OMP_NUM_THREADS" not in os.environ:
            # Ranks sharing this machine split its cores, as the runtime does.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world_size)))
    torch.manual_seed(0)

    _check_layers_fit(torch, workload, device, dtype)
    t_start = time.perf_counter()
    rate = _probe_flops_per_s(torch, device, dtype)
    batch, seq = _choose_shape(workload, mb, rate, budget_s)
    proxy = _proxy_workload(workload, seq)
    n = workload.num_layers
    measured = {}
    for left, i in ((3, 0), (2, 1), (1, n - 1)):
        # Time-boxed rather than a fixed count, so devices measured together stay busy
        # together and none gets the CPU to itself for its last repetitions.
        per_layer_budget = max(0.0, budget_s - (time.perf_counter() - t_start)) / left
        layer = build_layer(arch, i, n, device=device, init=False).to(dtype)
        if i == 0:
            make_input = lambda: torch.randint(0, arch.vocab_size, (batch, seq), device=device)
        else:
            make_input = lambda: torch.randn(batch, seq, arch.d_model, device=device, dtype=dtype,
                                             requires_grad=True)
        measured[i] = _time_layer(torch, layer, make_input, torch.randn_like, device, per_layer_budget)
        del layer

    fwd_s, bwd_s = [], []
    for i in range(n):
        key = 0 if i == 0 else (n - 1 if i == n - 1 else 1)
        f_meas, b_meas, _ = measured[key]
        f_proxy, b_proxy = layer_flops(proxy, key, batch)
        f_real, b_real = layer_flops(workload, i, mb)
        fwd_s.append(f_meas * f_real / f_proxy)
        bwd_s.append(b_meas * b_real / b_proxy)
    total_flops = sum(sum(layer_flops(workload, i, mb)) for i in range(n))
    tflops = total_flops / (sum(fwd_s) + sum(bwd_s)) / 1e12
    return ComputeProfile(layer_times=LayerTimes(batch=mb, forward_s=tuple(fwd_s), backward_s=tuple(bwd_s)),
                          tflops=tflops, proxy_batch=batch, proxy_seq_len=seq,
                          reps=min(m[2] for m in measured.values()), device=name)
