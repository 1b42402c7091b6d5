"""Memory a device can train with: the GPU's, or this process's share of the host's.

On CUDA it is the device's total memory. On a CPU it is the memory available to this
process (``MemAvailable``, lowered to what its memory cgroup still allows when it has a
limit) divided by the processes that share the machine: the emulation's device count
under the emulator (all its namespaces share one host's RAM), else ``LOCAL_WORLD_SIZE``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["memory_bytes", "sharing_processes"]

_NO_LIMIT = 1 << 60


def _meminfo_available() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return float(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def _cgroup_headroom() -> float | None:
    """Limit minus usage of this process's cgroup v1 memory group, or None without a limit."""
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                group = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
                limit = int((group / "memory.limit_in_bytes").read_text())
                usage = int((group / "memory.usage_in_bytes").read_text())
                return None if limit >= _NO_LIMIT else float(max(0, limit - usage))
    except (OSError, ValueError):
        return None
    return None


def sharing_processes() -> int:
    """How many device processes share this machine's memory."""
    from spantrain.runtime.emulator.latency import current

    emu = current()
    if emu is not None:
        return emu.world_size
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def memory_bytes(torch, device) -> float:
    """Bytes this device can use for training (see the module docstring)."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    available = _meminfo_available()
    headroom = _cgroup_headroom()
    if headroom is not None:
        available = min(available, headroom)
    return available / sharing_processes()
