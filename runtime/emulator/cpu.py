"""CPU quotas: each device gets cores in proportion to its TFLOP/s, via cgroup v1 `cpu`.

All devices together get `cores` cores (default: the machine's). A device with `t`
TFLOP/s gets ``t * cores / sum(tflops)`` cores, so every device computes
``sum(tflops) * 1e12 / (cores * R)`` times slower than the spec says, where ``R`` is the
FLOP/s one core sustains on the workload: one common time dilation, which keeps the
devices' speed ratios exact. The emulation file records ``cores_per_tflops``; the profiler
measures the resulting real TFLOP/s.

CFS enforces a quota per period: a device that used its share sleeps until the next
period starts. A long period (the kernel's default 100 ms) would stall a throttled
device's messages for up to ~100 ms, which the profiler would read as latency, so a
device's period is short, `MIN_PERIOD_US` (10 ms), unless its share needs a longer one for
the kernel's 1 ms minimum quota. Not shorter: with 2-3.5 ms periods, devices on a machine
busy with other work got 13-16 % less than their quotas (a quota must then be used within
a short window while other tasks compete for the core); at 10 ms they got them exactly.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from spantrain.errors import EmulationError
from spantrain.runtime.emulator.options import EMULATE_OPTIONS, Options

__all__ = ["CGROUP_CPU", "MIN_PERIOD_US", "MIN_SHARE", "cpu_shares", "check_shares", "period_us",
           "unavailable_reason", "create_groups", "group_pids", "remove_tree"]

CGROUP_CPU = Path("/sys/fs/cgroup/cpu")
"""Mount point of the cgroup v1 cpu controller."""

_MIN_QUOTA_US = 1000
MIN_PERIOD_US = 10_000
"""Shortest CFS period given to a device (module docstring)."""
_MAX_PERIOD_US = 1_000_000
MIN_SHARE = _MIN_QUOTA_US / _MAX_PERIOD_US
"""Fewest cores a quota gives: the kernel's 1 ms minimum quota in the longest (1 s) period."""


def cpu_shares(tflops: Sequence[float], cores: float) -> list[float]:
    """Cores for each device: proportional to its TFLOP/s, summing to `cores`."""
    if not (math.isfinite(cores) and cores > 0):  # nan passes `<= 0` and breaks the cgroup arithmetic
        raise EmulationError(f"--cpus must be a finite number > 0, got {cores:g}")
    total = float(sum(tflops))
    return [float(cores * t / total) for t in tflops]


def check_shares(ids: Sequence[str], shares: Sequence[float], cores: float,
                 options: Options = EMULATE_OPTIONS) -> None:
    """Refuse shares below `MIN_SHARE`: those devices would get `MIN_SHARE` (up to 19x their share
    on a 4,096-device cluster at 2 cores), so the speed ratios and the one time dilation the
    emulator reports would be false. The fix names the caller's `options`."""
    k = min(range(len(shares)), key=shares.__getitem__)
    if shares[k] < MIN_SHARE:
        need = _round_up(cores * MIN_SHARE / shares[k])
        raise EmulationError(f"{cores:g} cores shared in proportion to TFLOP/s leave device {ids[k]} {shares[k]:.2g} "
                             f"cores, below the smallest CPU quota the kernel enforces ({MIN_SHARE:g} cores): give the "
                             f"cluster at least {need:g} cores ({options.cpus})"
                             + (f", or emulate it without CPU quotas ({options.no_cpu_limits})"
                                if options.no_cpu_limits else ""))


def _round_up(x: float, digits: int = 3) -> float:
    """`x` to `digits` significant digits, never below it (a figure the user passes back must suffice)."""
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale) / scale


def period_us(share: float) -> int:
    """The CFS period of a device with `share` cores: `MIN_PERIOD_US`, or longer when its quota would be
    below the kernel's 1 ms minimum."""
    needed = math.ceil(_MIN_QUOTA_US / share) if share > 0 else _MAX_PERIOD_US
    return int(min(_MAX_PERIOD_US, max(MIN_PERIOD_US, needed)))


def unavailable_reason(root: Path = CGROUP_CPU) -> str | None:
    """Why CPU quotas cannot be set here, or None when they can."""
    if os.geteuid() != 0:
        return "not running as root"
    if not (root / "cpu.cfs_quota_us").exists():
        return f"no cgroup v1 cpu controller at {root}"
    if not os.access(root, os.W_OK):
        return f"{root} is not writable"
    return None


def create_groups(root: Path, shares: Sequence[float]) -> list[Path]:
    """The run's cgroup `root` with one child ``d<k>`` per device: quota `shares[k]` cores per `period_us` of it.

    A quota is a cap, not a guarantee: when other work keeps the machine busy the devices
    get less than their quotas, and plain CFS would then split the CPU evenly between
    them, erasing their speed ratios. So each child also gets ``cpu.shares`` in proportion
    to its quota (mean 1024), which keeps the ratios under contention, and the root gets
    1024 per device, so the emulated cluster competes with other work like as many plain
    processes would.
    """
    n = len(shares)
    mean = sum(shares) / n
    paths = []
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "cpu.shares").write_text(str(1024 * n))
        for k, cores in enumerate(shares):
            path = root / f"d{k}"
            path.mkdir(exist_ok=True)
            (path / "cpu.shares").write_text(str(max(2, round(1024 * cores / mean))))
            period = period_us(cores)
            (path / "cpu.cfs_period_us").write_text(str(period))
            (path / "cpu.cfs_quota_us").write_text(str(max(_MIN_QUOTA_US, round(cores * period))))
            paths.append(path)
    except OSError as e:
        raise EmulationError(f"cannot set CPU quotas under {root}: {e.strerror or e}") from None
    return paths


def group_pids(path: Path) -> list[int]:
    """Pids in cgroup `path` and every group below it."""
    pids: list[int] = []
    for procs in sorted(path.rglob("cgroup.procs")):
        try:
            pids += [int(x) for x in procs.read_text().split()]
        except (OSError, ValueError):
            continue
    return pids


def remove_tree(path: Path, wait_s: float = 5.0) -> None:
    """Kill every process in cgroup `path` (and below), then remove the groups, leaves first."""
    if not path.exists():
        return
    deadline = time.monotonic() + wait_s
    while True:
        pids = group_pids(path)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise EmulationError(f"processes {pids[:5]} in {path} did not exit")
        time.sleep(0.05)
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        d.rmdir()
    path.rmdir()
