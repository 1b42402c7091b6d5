"""The emulator -> runtime contract: per-message latency (and fallback bandwidth) by rank.

The kernel on these machines cannot delay packets (``netem`` is absent), so the emulator
shapes bandwidth with ``tc`` and leaves latency to whoever sends: the runtime's transport
(and the profiler) call `delay_before_send` before every message they hand to
torch.distributed. The contract, version 1:

- **Env var** ``SPANTRAIN_EMULATION``: absolute path of a JSON file, set by the emulator in
  every device process. Absent or empty: not emulated, every helper returns 0 and sleeps
  never.
- **File** (JSON object):

  ``version`` (1); ``cluster`` (spec name); ``run_id``; ``kernel_shaping`` (true: the
  kernel enforces ``emulated_gbps``; false: the fallback without namespaces, where
  `delay_before_send` also waits ``nbytes / bandwidth``); ``bandwidth_scale`` and
  ``max_gbps`` (emulated = min(spec x scale, max)); ``master_addr``, ``master_port``;
  ``cpu`` (``cores``: cores shared by the devices, ``cores_per_tflops``, ``period_us``: the
  CFS period of each device in rank order, ``limited``: whether cgroup quotas are in
  force); ``devices``: one entry per rank, in rank order, ``{rank, id, region, address,
  namespace, host, cpu_cores, tflops, memory_gb}``; ``latency_s``: one-way seconds ``[src_rank][dst_rank]`` (0 on the
  diagonal), exactly the spec's latency array; ``spec_gbps`` and ``emulated_gbps``:
  ``[src][dst]`` Gbit/s, ``null`` on the diagonal.
- **Helpers**: `latency_s(src, dst)`, `delay_before_send(src, dst, nbytes=0)` (sleeps the
  message's one-way latency, plus its serialization time when the kernel does not shape;
  returns the seconds slept), `ring_latency_s(ranks)` (latency a ring all-reduce over
  `ranks` pays: 2 (n - 1) hops of the slowest ring link), `ring_allreduce_delay_s(ranks,
  nbytes)` (that, plus in the fallback the ring's 2 (n - 1) / n x nbytes over its slowest
  link, since nothing else shapes collectives there), `current()` (the parsed file or
  None). Ranks are global torch.distributed ranks, i.e. positions in ``devices``.

`delay_before_send` blocks the caller for the latency: right for a ping-pong (the profiler),
wrong for a training stage, which on a real network goes on computing while its message
travels. The runtime's transport therefore hands its sends to
`spantrain.runtime.emulator.delayed.DelayedSends`, which issues each one at ``hand-over +
latency_s(...)`` on a thread per destination (the arrival time of a real link) and never
holds the sender.

This module imports only the standard library: the transport imports it on every rank.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spantrain.errors import EmulationError

__all__ = ["ENV_VAR", "VERSION", "Emulation", "current", "latency_s", "delay_before_send", "ring_latency_s",
           "ring_allreduce_delay_s"]

ENV_VAR = "SPANTRAIN_EMULATION"
"""Environment variable holding the path of the emulation file."""

VERSION = 1
"""Version of the file format described in the module docstring."""

GBPS_BYTES = 1e9 / 8


@dataclass(frozen=True, kw_only=True)
class Emulation:
    """The parsed emulation file of one run (see the module docstring for the fields)."""

    cluster: str
    run_id: str
    kernel_shaping: bool
    bandwidth_scale: float
    max_gbps: float
    master_addr: str
    master_port: int
    cpu: dict[str, Any]
    devices: list[dict[str, Any]]
    latency: list[list[float]]
    """One-way seconds, [src_rank][dst_rank]."""
    spec_gbps: list[list[float | None]]
    emulated_gbps: list[list[float | None]]
    _rank_by_id: dict[str, int] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.devices)
        for name, m in (("latency_s", self.latency), ("spec_gbps", self.spec_gbps),
                        ("emulated_gbps", self.emulated_gbps)):
            if len(m) != n or any(len(row) != n for row in m):
                raise EmulationError(f"emulation file: {name} is not a {n} x {n} matrix")
        self._rank_by_id.update({d["id"]: k for k, d in enumerate(self.devices)})

    @property
    def world_size(self) -> int:
        return len(self.devices)

    def rank_of(self, device_id: str) -> int:
        try:
            return self._rank_by_id[device_id]
        except KeyError:
            raise EmulationError(f"emulation has no device {device_id!r}") from None

    def latency_s(self, src_rank: int, dst_rank: int) -> float:
        """One-way latency in seconds of a message from `src_rank` to `dst_rank`."""
        return 0.0 if src_rank == dst_rank else float(self.latency[src_rank][dst_rank])

    def bandwidth_bytes_per_s(self, src_rank: int, dst_rank: int) -> float:
        """Emulated goodput from `src_rank` to `dst_rank` in bytes/s (inf for a rank to itself)."""
        g = self.emulated_gbps[src_rank][dst_rank]
        return float("inf") if src_rank == dst_rank or g is None else float(g) * GBPS_BYTES

    def send_delay_s(self, src_rank: int, dst_rank: int, nbytes: int = 0) -> float:
        """What the sender must add: latency, plus serialization when the kernel does not shape."""
        delay = self.latency_s(src_rank, dst_rank)
        if not self.kernel_shaping and nbytes > 0 and src_rank != dst_rank:
            delay += nbytes / self.bandwidth_bytes_per_s(src_rank, dst_rank)
        return delay

    def ring_latency_s(self, ranks: Sequence[int]) -> float:
        """Latency of a ring all-reduce over `ranks`: 2 (n - 1) hops of the slowest ring link."""
        n = len(ranks)
        if n < 2:
            return 0.0
        worst = max(self.latency_s(ranks[k], ranks[(k + 1) % n]) for k in range(n))
        return 2 * (n - 1) * worst

    def ring_allreduce_delay_s(self, ranks: Sequence[int], nbytes: int) -> float:
        """What a ring all-reduce of `nbytes` over `ranks` must add: its latency, plus, when the
        kernel does not shape, its 2 (n - 1) / n x nbytes over the slowest ring link."""
        delay = self.ring_latency_s(ranks)
        n = len(ranks)
        if not self.kernel_shaping and n > 1 and nbytes > 0:
            slowest = min(self.bandwidth_bytes_per_s(ranks[k], ranks[(k + 1) % n]) for k in range(n))
            delay += 2 * (n - 1) / n * nbytes / slowest
        return delay

    # ---- file --------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"version": VERSION, "cluster": self.cluster, "run_id": self.run_id,
                "kernel_shaping": self.kernel_shaping, "bandwidth_scale": self.bandwidth_scale,
                "max_gbps": self.max_gbps, "master_addr": self.master_addr, "master_port": self.master_port,
                "cpu": self.cpu, "devices": self.devices, "latency_s": self.latency,
                "spec_gbps": self.spec_gbps, "emulated_gbps": self.emulated_gbps}

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Emulation:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise EmulationError(f"cannot read emulation file {path} ({ENV_VAR}): {e}") from None
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise EmulationError(f"emulation file {path}: expected a version {VERSION} object")
        try:
            return cls(cluster=raw["cluster"], run_id=raw["run_id"], kernel_shaping=bool(raw["kernel_shaping"]),
                       bandwidth_scale=float(raw["bandwidth_scale"]), max_gbps=float(raw["max_gbps"]),
                       master_addr=raw["master_addr"], master_port=int(raw["master_port"]), cpu=raw["cpu"],
                       devices=raw["devices"], latency=raw["latency_s"], spec_gbps=raw["spec_gbps"],
                       emulated_gbps=raw["emulated_gbps"])
        except (KeyError, TypeError, ValueError) as e:
            raise EmulationError(f"emulation file {path}: missing or malformed field {e}") from None


_cache: tuple[str, Emulation] | None = None


def current() -> Emulation | None:
    """The emulation this process runs in (from ``$SPANTRAIN_EMULATION``), or None; parsed once per path."""
    global _cache
    path = os.environ.get(ENV_VAR, "")
    if not path:
        return None
    if _cache is None or _cache[0] != path:
        _cache = (path, Emulation.load(path))
    return _cache[1]


def latency_s(src_rank: int, dst_rank: int) -> float:
    """One-way latency to inject for a message from `src_rank` to `dst_rank`; 0 when not emulated."""
    emu = current()
    return 0.0 if emu is None else emu.latency_s(src_rank, dst_rank)


def delay_before_send(src_rank: int, dst_rank: int, nbytes: int = 0) -> float:
    """Sleep what this message must wait before it goes on the wire; returns the seconds slept.

    Call it right before handing a message of `nbytes` bytes from `src_rank` to
    `dst_rank` to torch.distributed. Not emulated: returns 0 at once.
    """
    emu = current()
    if emu is None:
        return 0.0
    delay = emu.send_delay_s(src_rank, dst_rank, nbytes)
    if delay > 0:
        _sleep_precisely(delay)
    return delay


_SPIN_S = 3e-4


def _sleep_precisely(seconds: float) -> None:
    """Sleep `seconds`, spinning through the last 0.3 ms.

    ``time.sleep`` overshoots by ~60-120 us here (timer slack, wake-up), which at a 1 ms
    latency alone is a 10 % error; a short spin at the end removes it for a few hundred
    microseconds of CPU per message.
    """
    deadline = time.perf_counter() + seconds
    if seconds > _SPIN_S:
        time.sleep(seconds - _SPIN_S)
    while time.perf_counter() < deadline:
        pass


def ring_latency_s(ranks: Sequence[int]) -> float:
    """Latency a ring all-reduce over `ranks` pays under emulation; 0 when not emulated."""
    emu = current()
    return 0.0 if emu is None else emu.ring_latency_s(ranks)


def ring_allreduce_delay_s(ranks: Sequence[int], nbytes: int) -> float:
    """Seconds to wait before a ring all-reduce of `nbytes` over `ranks` (latency, plus serialization in the
    fallback without kernel shaping); 0 when not emulated."""
    emu = current()
    return 0.0 if emu is None else emu.ring_allreduce_delay_s(ranks, nbytes)
