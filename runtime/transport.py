"""Every message the runtime sends goes through here: process-group setup, point-to-point
transfers between pipeline stages, and the collectives of the data-parallel sync.

Keeping them in one place gives one spot to time them (the metrics' "waiting on
transfers") and one spot to shape them: under the local emulated cluster
(``SPANTRAIN_EMULATION`` set) every send reaches the wire its link's latency later (on a
thread per peer, `spantrain.runtime.emulator.delayed`: the sending stage computes on, as
over a real link) and every collective first waits its ring latency, as
`spantrain.runtime.emulator.latency` prescribes.

`torch.distributed.pipelining` issues its stage-to-stage transfers through two
module-level helpers, `_batch_p2p` and `_wait_batch_p2p`; `Transport.install` routes them
through this module. It issues each operation on its own (gloo runs a batch one operation
at a time anyway; every schedule posts matching operations in the same order on both
sides, so this cannot deadlock), which lets emulated latency apply per message. The
pipelining helpers are private: if a torch release renames them, `install` says so instead
of silently running untimed.

Backend (`choose_backend`): NCCL when CUDA is available (each rank on ``cuda:{local_rank}``),
gloo on the CPU otherwise, on the emulated cluster (its devices are CPU processes under CPU
quotas, and NCCL would bypass its shaped network), with ``SPANTRAIN_DEVICE=cpu``, and for a
local run with more workers than GPUs. NCCL's send and receive block on the GPU in the order
they are queued, so under NCCL a batch that mixes sends and receives (1F1B's steady state)
goes through `torch.distributed.batch_isend_irecv` as one group, as torch's own helper does;
and since NCCL's waits return before the GPU is done, the transport synchronizes the device
around every wait and collective, so the metrics' split of compute and communication time
holds on GPUs too.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from spantrain.errors import ExecutionError

__all__ = ["TransferStats", "Transport", "choose_backend", "visible_gpus", "DEVICE_ENV"]

DEVICE_ENV = "SPANTRAIN_DEVICE"
"""``cpu``: train with gloo on the CPU although GPUs are there."""


def visible_gpus() -> int:
    """GPUs this host's workers may train on: 0 (gloo on the CPU) without CUDA or NCCL, on the
    emulated cluster, or with ``SPANTRAIN_DEVICE=cpu``; else how many CUDA sees.
    Safe before forking workers: `torch.cuda.device_count` asks NVML, not the CUDA runtime."""
    if os.environ.get("SPANTRAIN_EMULATION") or os.environ.get(DEVICE_ENV, "").lower() == "cpu":
        return 0
    if not dist.is_nccl_available():
        return 0
    return torch.cuda.device_count()


def choose_backend(local_rank: int = 0, local_world: int = 1, *, local: bool = False) -> tuple[str, torch.device]:
    """(backend, device) for the worker of `local_rank` among `local_world` on this host: NCCL
    on its own GPU, else gloo on the CPU (module docstring). `local`: the workers were started
    by spantrain's launcher, which falls back to the CPU when they outnumber the GPUs; under
    torchrun that is the user's mistake, named in an `ExecutionError`."""
    count = visible_gpus()
    if count == 0 or not torch.cuda.is_available():
        return "gloo", torch.device("cpu")
    if local_world > count:
        if local:
            return "gloo", torch.device("cpu")
        # one visible GPU each (CUDA_VISIBLE_DEVICES set per process) is a layout that works
        if not (count == 1 and os.environ.get("CUDA_VISIBLE_DEVICES")):
            raise ExecutionError(f"{local_world} processes on this host (LOCAL_WORLD_SIZE) but {count} GPU(s) "
                                 f"visible: start at most {count} per node (torchrun --nproc-per-node {count}), or "
                                 f"train on the CPU with {DEVICE_ENV}=cpu")
    device = torch.device("cuda", local_rank if count > 1 else 0)
    torch.cuda.set_device(device)
    return "nccl", device


@dataclass
class TransferStats:
    """Seconds this rank spent blocked on communication, and how much it sent."""

    p2p_wait_s: float = 0.0
    """Waiting for activations / gradients from neighbouring stages (and for sends to drain)."""
    collective_s: float = 0.0
    """Inside data-parallel collectives (gradient or parameter averaging) and barriers."""
    bytes_sent: int = 0
    """Bytes of point-to-point sends issued."""
    messages: int = 0
    """Point-to-point operations issued (sends and receives)."""


class Transport:
    """Point-to-point and collective communication for one rank, timed."""

    def __init__(self, backend: str, device: torch.device, timeout_s: float):
        self.backend = backend
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.stats = TransferStats()
        self._installed = False
        self._emulation = None
        self._delayed = None
        if os.environ.get("SPANTRAIN_EMULATION"):
            # Running on the local emulated cluster: it shapes bandwidth in the kernel and leaves
            # per-message latency to the sender (contract in spantrain.runtime.emulator.latency).
            # Sends are delayed on a thread per peer, so latency postpones their arrival without
            # holding this stage's compute (as a real link does).
            from spantrain.runtime.emulator import latency
            from spantrain.runtime.emulator.delayed import DelayedSends

            self._emulation = latency
            self._delayed = DelayedSends(latency.current(), dist.get_rank())

    # ---- setup ---------------------------------------------------------------------------------

    @classmethod
    def init(cls, *, rank: int, world_size: int, init_method: str | None, timeout_s: float,
             local_rank: int = 0, local_world: int = 1, local: bool = False) -> Transport:
        """Join the default process group (``init_method=None`` reads torchrun's ``env://``;
        ``file://PATH`` is a file store at PATH, taken literally)."""
        backend, device = choose_backend(local_rank, local_world, local=local)
        timeout = timedelta(seconds=timeout_s)
        if init_method and init_method.startswith("file://"):
            # The local launcher's rendezvous file, opened as a path, not parsed as a URL: a '?' or
            # '#' in the run directory ("runs/exp#2") would cut the path short at a query or fragment.
            store = dist.FileStore(init_method.removeprefix("file://"), world_size)
            store.set_timeout(timeout)
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, init_method=init_method or "env://", rank=rank,
                                    world_size=world_size, timeout=timeout)
        return cls(backend, device, timeout_s)

    def new_group(self, ranks: Iterable[int]) -> dist.ProcessGroup | None:
        """A process group over `ranks` (every rank must call this, in the same order)."""
        return dist.new_group(ranks=sorted(ranks), timeout=self.timeout)

    def install(self) -> None:
        """Route torch.distributed.pipelining's stage-to-stage transfers through this transport."""
        from torch.distributed.pipelining import schedules

        for name in ("_batch_p2p", "_wait_batch_p2p"):
            if not callable(getattr(schedules, name, None)):
                raise ExecutionError(f"this torch ({torch.__version__}) has no pipelining helper {name}; "
                                     "the runtime's transport needs it (tested with torch 2.6-2.13)")
        schedules._batch_p2p = lambda ops, desc=None: self.issue(ops)
        schedules._wait_batch_p2p = self.wait
        self._installed = True

    @property
    def emulation(self):
        """The emulator's contract this rank runs under (`spantrain.runtime.emulator.latency`), or None."""
        return self._delayed.emulation if self._delayed is not None else None

    def flush(self) -> None:
        """Wait until every send handed over has left (emulated latency delays them on threads)."""
        if self._delayed is not None:
            self._delayed.flush()

    def close(self) -> None:
        """Leave the process group (every rank at the end of its run), after any delayed sends."""
        if self._delayed is not None:
            try:
                self._delayed.flush()
            finally:
                self._delayed.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    # ---- point to point ----------------------------------------------------------------------

    def issue(self, ops: list[dist.P2POp]) -> list[dist.Work]:
        """Start each operation on its own (under NCCL, a batch mixing sends and receives as one
        group); the caller waits on the returned works."""
        for op in ops:
            if op.op not in (dist.isend, dist.irecv):
                raise ExecutionError(f"unsupported point-to-point operation {op.op!r}")
            if op.op is dist.isend:
                self.stats.bytes_sent += op.tensor.numel() * op.tensor.element_size()
        self.stats.messages += len(ops)
        if self.backend == "nccl" and self._delayed is None and len({op.op for op in ops}) > 1:
            return dist.batch_isend_irecv(ops)
        works = []
        for op in ops:
            if op.op is dist.irecv:
                works.append(dist.irecv(op.tensor, group=op.group, tag=op.tag, group_src=op.group_peer))
            elif self._delayed is not None:
                # A private copy: the caller may reuse the tensor once its wait returns (at once).
                payload = op.tensor.detach().clone()
                works.append(self._delayed.submit(
                    dist.get_global_rank(op.group, op.group_peer), op.tensor.numel() * op.tensor.element_size(),
                    lambda t=payload, op=op: dist.isend(t, group=op.group, tag=op.tag, group_dst=op.group_peer)))
            else:
                works.append(dist.isend(op.tensor, group=op.group, tag=op.tag, group_dst=op.group_peer))
        return works

    def settle(self) -> None:
        """On a GPU, wait for the work queued on it (a no-op on the CPU, whose ops are done when
        they return): NCCL's waits return once the GPU is told to wait, not when it has."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wait(self, works: Iterable[dist.Work]) -> None:
        """Block until the transfers are done; the time counts as waiting on transfers."""
        self.settle()  # the compute queued before is the stage's, not the wait's
        t0 = time.perf_counter()
        for w in works:
            w.wait()
        self.settle()
        self.stats.p2p_wait_s += time.perf_counter() - t0

    # ---- collectives ---------------------------------------------------------------------------

    def _collective_latency(self, group: dist.ProcessGroup | None) -> None:
        if self._emulation is not None:
            ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
            delay = self._emulation.ring_latency_s(ranks)
            if delay > 0:
                time.sleep(delay)

    def all_reduce(self, tensor: torch.Tensor, group: dist.ProcessGroup | None) -> None:
        """Sum `tensor` in place over `group`."""
        self.settle()
        t0 = time.perf_counter()
        self._collective_latency(group)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        self.settle()
        self.stats.collective_s += time.perf_counter() - t0

    def broadcast(self, tensor: torch.Tensor, src: int, group: dist.ProcessGroup | None) -> None:
        """Copy `tensor` from global rank `src` to every member of `group`."""
        self.settle()
        t0 = time.perf_counter()
        self._collective_latency(group)
        dist.broadcast(tensor, src=src, group=group)
        self.settle()
        self.stats.collective_s += time.perf_counter() - t0

    def all_gather_rows(self, row: torch.Tensor) -> torch.Tensor:
        """Stack one small row from every rank of the world (rank order); used for per-step stats."""
        out = [torch.empty_like(row) for _ in range(dist.get_world_size())]
        dist.all_gather(out, row)
        return torch.stack(out)

    def all_gather_object(self, obj: object) -> list:
        """One picklable object from every rank, in rank order (start-up only: it is slow)."""
        out: list = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def any_rank(self, flag: bool) -> bool:
        """Whether any rank of the world passes True; also a barrier. A control message (like
        the per-iteration row): no emulated latency."""
        t0 = time.perf_counter()
        votes = torch.tensor([float(flag)], device=self.device)
        dist.all_reduce(votes, op=dist.ReduceOp.SUM)
        self.stats.collective_s += time.perf_counter() - t0
        return bool(votes.item() > 0)

    def barrier(self) -> None:
        """Wait for every rank (checkpoint phases)."""
        t0 = time.perf_counter()
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()
        self.stats.collective_s += time.perf_counter() - t0

    def take_stats(self) -> TransferStats:
        """The stats since the last call, and start counting afresh."""
        out, self.stats = self.stats, TransferStats()
        return out

