"""Checks that refuse a run before any process starts (no torch import: the launcher stays light).

Everything a user can get wrong about a run (a plan that does not fit the cluster or model,
a model the runtime cannot build, data too short, a checkpoint for another model, nothing
left to train) is caught here with one clear line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from spantrain.cluster import Cluster
from spantrain.errors import ExecutionError, WorkloadError
from spantrain.plan import Plan
from spantrain.workload import Architecture, Workload

__all__ = ["require_arch", "check_run", "check_memory", "resume_state", "cpu_cores", "threads_per_rank",
           "available_memory_bytes", "visible_gpus", "SYNTHETIC_CORPUS_BYTES"]

SYNTHETIC_CORPUS_BYTES = 1 << 18
"""Size of the built-in corpus a run trains on without --data (`spantrain.runtime.data.synthetic_corpus`)."""

_GPU_DRIVERS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/kfd")
"""What an NVIDIA or AMD (ROCm) driver puts on a Linux host; without any of them CUDA sees no GPU."""


def visible_gpus() -> int:
    """`spantrain.runtime.transport.visible_gpus`, without importing torch (a second of the
    launcher's start-up, and again at its exit) on a Linux host that has no GPU driver."""
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in _GPU_DRIVERS):
        return 0
    from spantrain.runtime.transport import visible_gpus as from_torch

    return from_torch()


def require_arch(workload: Workload) -> Architecture:
    """The workload's architecture, or a clear error: the runtime cannot build a model without one."""
    if workload.arch is None:
        raise WorkloadError(f"model {workload.name!r} has no architecture: the runtime builds models from a preset "
                            "or a workload file with an 'architecture:' section, not from explicit layer lists")
    return workload.arch


def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_rank(local_world: int) -> int:
    """CPU threads for one rank when `local_world` ranks share this machine's cores."""
    return max(1, cpu_cores() // max(1, local_world))


def available_memory_bytes() -> int | None:
    """Memory this machine can still give out (`MemAvailable`), None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_memory(cluster: Cluster, workload: Workload, plan: Plan, *, on_this_machine: bool,
                 calibration: Any = None) -> str | None:
    """The cost model's memory verdict on a plan, before any process starts.

    A plan the model says does not fit its devices gets a note (returned), not a refusal:
    the model may be conservative, and the spec's memory is not the CPU's. But when every
    worker runs on this machine (local and emulated runs) and together they need more than
    it has available, the run is refused: it would swap the machine to a halt or be killed
    mid-iteration. Their true need is larger still, since the runtime trains in fp32
    whatever precision the model assumes."""
    from spantrain.env.costmodel import CostModel
    from spantrain.estimate import fmt_memory

    est = CostModel(cluster, workload, calibration).estimate(plan)  # the constants the run planned with
    if on_this_machine:
        need = sum(est.peak_memory_gb.values()) * 1e9
        have = available_memory_bytes()
        if have is not None and need > have:
            raise ExecutionError(f"the plan's {len(plan.devices)} workers need about {fmt_memory(need)} together "
                                 f"(cost model) and this machine has {fmt_memory(have)} available: use a smaller "
                                 "micro-batch size or model, or run the devices on their own machines (torchrun)")
    if not est.feasible:
        more = f" (and {len(est.reasons) - 1} more)" if len(est.reasons) > 1 else ""
        return (f"the cost model says the plan does not fit: {est.reasons[0]}{more}; on real devices it would "
                "run out of memory (`spantrain plan` finds one that fits)")
    return None


def check_run(cluster: Cluster, workload: Workload, plan: Plan, *, data: str | None) -> None:
    """Refuse a plan or input the runtime cannot execute (`PlanError` lists every plan problem)."""
    plan.validate(cluster, workload)
    arch = require_arch(workload)
    if arch.vocab_size < 256:
        raise WorkloadError(f"model {workload.name!r}: byte-level data needs a vocabulary of at least 256, "
                            f"it has {arch.vocab_size}: set the architecture's vocab_size to 256 or more to run it "
                            "(the runtime trains on bytes; planning takes any size)")
    if data is None and workload.seq_len + 1 > SYNTHETIC_CORPUS_BYTES:  # a worker found it, after start-up
        raise ExecutionError(f"model {workload.name!r}: one sample of seq_len {workload.seq_len} needs "
                             f"{workload.seq_len + 1} bytes and the built-in corpus has {SYNTHETIC_CORPUS_BYTES}: "
                             "pass a longer text file with --data, or lower seq_len")
    if data is not None:
        p = Path(data)
        if p.is_dir():
            raise ExecutionError(f"--data {p} is a directory: pass a text file")
        if p.exists() and not p.is_file():  # a device or a pipe: each worker would read other bytes, or forever
            raise ExecutionError(f"--data {p} is not a regular file: pass a text file")
        if not p.is_file():
            raise ExecutionError(f"--data {p}: file not found")
        if p.stat().st_size < workload.seq_len + 1:
            raise ExecutionError(f"--data {p}: {p.stat().st_size} bytes; one sample needs {workload.seq_len + 1}: "
                                 "pass a longer text file, or lower the model's seq_len")


def resume_state(checkpoint_dir: str | None, workload: Workload, steps: int) -> dict[str, Any]:
    """The train state `--resume` continues from, or a clear refusal."""
    from spantrain.runtime.checkpoint import check_meta, incomplete_after, latest_checkpoint

    if not checkpoint_dir:
        raise ExecutionError("--resume needs --checkpoint-dir (where the checkpoints are)")
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        from spantrain.runtime.launcher import refuse_held

        refuse_held(checkpoint_dir, "--checkpoint-dir")  # a live run whose first checkpoint is still to come
        raise ExecutionError(f"--resume: no complete checkpoint in {checkpoint_dir}: pass the directory that holds "
                             "the run's checkpoints, or leave out --resume to start anew")
    if skipped := incomplete_after(latest):  # it resumed from an older one without a word
        from spantrain._say import say

        say(f"spantrain run: note: resuming from {latest.name}, the newest complete checkpoint: "
            f"{', '.join(skipped)} in {checkpoint_dir} has no train_state.json (damaged), so it is passed over")
    state = check_meta(latest, workload)
    if int(state["step"]) >= steps:
        raise ExecutionError(f"--resume: checkpoint {latest.name} is already at iteration {state['step']}; "
                             f"--steps {steps} leaves nothing to train (it is the total, not the number to add)")
    return {**state, "path": str(latest)}

