"""One rank's part of a profile, and rank 0's assembly of the whole.

Launch one process per device with torchrun or ``spantrain emulate`` (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set); every rank runs `profile_rank`.

The budget is wall time from launch: by default from this process's start (read from
/proc, so Python and torch start-up count), or an absolute deadline the caller passes
(``spantrain profile --cluster`` passes its own start + budget). A reserve (15 %, at
least 3 s) is kept for gathering, writing and shutting down. Phases, each started by
rank 0 broadcasting its length so all ranks run them together:

1. compute: every device at once, `COMPUTE_SHARE` of the budget (at most a third of what
   is left);
2. network: the round-robin rounds of `spantrain.profiler.network`, each a slot of
   what is left divided by the rounds; a pair spends up to 15 % of its slot on
   ping-pongs, and each of its 2 x `TIMED_TRANSFERS` timed messages (both directions)
   lasts up to 1 / (2 x `TIMED_TRANSFERS`) of the slot (at most `TRANSFER_S`).

Results are gathered on rank 0, which groups the devices and returns the `Profile`;
other ranks return None.

Device identity: ``SPANTRAIN_DEVICE_ID`` (set by the emulator) or ``<host>-<local rank>``;
host: ``SPANTRAIN_HOST`` (the emulated host) or the machine's hostname.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from spantrain.errors import ExecutionError
from spantrain.profiler.assemble import DeviceMeasurement, Profile, assemble
from spantrain.profiler.compute import measure_compute
from spantrain.profiler.memory import memory_bytes
from spantrain.profiler.network import TIMED_TRANSFERS, measure_pair, round_robin
from spantrain.workload import Workload

__all__ = ["COMPUTE_SHARE", "TRANSFER_S", "identity", "process_start", "profile_rank"]

COMPUTE_SHARE = 0.1
TRANSFER_S = 0.35
_MIN_SLOT_S = 0.3
_MIN_COMPUTE_S = 2.0


def identity(local_rank: int) -> tuple[str, str]:
    """(device id, host) of this process."""
    host = os.environ.get("SPANTRAIN_HOST") or socket.gethostname()
    return os.environ.get("SPANTRAIN_DEVICE_ID") or f"{host}-{local_rank}", host


def process_start() -> float:
    """This process's start as a Unix time (boot time + start ticks from /proc)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError, IndexError):
        return time.time()


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ExecutionError(f"{name} must be an integer, got {value!r}") from None


def _agree(dist, torch, value: float) -> float:
    """Rank 0's `value` on every rank."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.broadcast(t, 0)
    return float(t.item())


def profile_rank(workload: Workload, *, budget_s: float, micro_batch: int | None, name: str,
                 log: Callable[[str], None], distributed: bool = True,
                 deadline: float | None = None) -> Profile | None:
    """Measure this device (and, distributed, its pairs); rank 0 returns the assembled profile."""
    import torch
    import torch.distributed as dist

    deadline = deadline if deadline is not None else process_start() + budget_s
    reserve = max(3.0, 0.15 * budget_s)

    def left() -> float:
        return deadline - reserve - time.time()

    rank = _env_int("RANK", 0) if distributed else 0
    world = _env_int("WORLD_SIZE", 1) if distributed else 1
    local_rank = _env_int("LOCAL_RANK", 0)
    device_id, host = identity(local_rank)
    say = log if rank == 0 else (lambda msg: None)
    if distributed:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=timedelta(seconds=max(120.0, 4 * budget_s)))
    try:
        if left() < 0.3 * budget_s:
            say(f"profile: warning: start-up left {max(0.0, left()):.0f} s of the {budget_s:g} s budget, so the "
                "measurements are cut short and lose accuracy; raise --budget-s, or, profiling an emulated cluster "
                "(--cluster), give its slowest devices more CPU (--cpus)")
        compute_s = max(_MIN_COMPUTE_S, min(COMPUTE_SHARE * budget_s, left() / 3))
        if distributed:
            compute_s = _agree(dist, torch, compute_s)
        cp = measure_compute(workload, micro_batch=micro_batch, budget_s=compute_s,
                             local_world_size=_env_int("LOCAL_WORLD_SIZE", 1), local_rank=local_rank)
        device = torch.device("cuda", local_rank % torch.cuda.device_count()) if torch.cuda.is_available() \
            else torch.device("cpu")
        me = DeviceMeasurement(rank=rank, id=device_id, host=host, local_rank=local_rank, gpu=cp.device,
                               tflops=cp.tflops, memory_gb=memory_bytes(torch, device) / 1e9, model=workload.name,
                               layer_times=cp.layer_times)
        proxy = "" if (cp.proxy_batch, cp.proxy_seq_len) == (cp.layer_times.batch, workload.seq_len) else \
            f", timed on a proxy of {cp.proxy_batch} x {cp.proxy_seq_len} tokens"
        say(f"profile: compute on {workload.name} for {compute_s:.1f} s (micro-batch {cp.layer_times.batch}{proxy}): "
            f"rank 0 {cp.tflops * 1e3:.3g} GFLOP/s, median of {cp.reps}+ passes per layer")
        if not distributed or world == 1:
            return assemble([me], [], name=name)

        dist.barrier()
        rounds = round_robin(world)
        slot_s = _agree(dist, torch, max(_MIN_SLOT_S, left() / len(rounds)))
        say(f"profile: {world * (world - 1) // 2} pairs in {len(rounds)} parallel rounds of up to {slot_s:.1f} s")
        pairs = []
        t_net = time.monotonic()
        for k, round_pairs in enumerate(rounds):
            dist.barrier()
            for a, b in round_pairs:
                if rank in (a, b):
                    m = measure_pair(dist, torch, rank, a, b, latency_slot_s=0.15 * slot_s,
                                     transfer_s=min(TRANSFER_S, slot_s / (2 * TIMED_TRANSFERS)))
                    if m is not None:
                        pairs.append(m)
            say(f"profile: round {k + 1}/{len(rounds)} done, {time.monotonic() - t_net:.1f} s into the network phase")
        gathered: list | None = [None] * world if rank == 0 else None
        dist.gather_object((me, pairs), gathered, dst=0)
        if rank != 0:
            return None
        devices = [g[0] for g in gathered]
        ids = [d.id for d in devices]
        if len(set(ids)) != len(ids):
            raise ExecutionError(f"device ids are not unique across ranks: {sorted(ids)}")
        return assemble(devices, [p for g in gathered for p in g[1]], name=name)
    finally:
        if distributed and dist.is_initialized():
            dist.destroy_process_group()
