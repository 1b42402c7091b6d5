"""How the caller's command line names the emulator's settings.

The emulator's errors end with a fix, and a fix must name an option the user can pass:
`spantrain emulate` calls them ``--cpus`` and ``--mode``; ``spantrain run --emulate``
calls them ``--emulate-cpus`` and ``--emulate-mode`` and has no ``--no-cpu-limits``,
``--bandwidth-scale`` or ``--max-gbps``; ``spantrain profile --cluster`` has only
``--cpus``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Options", "EMULATE_OPTIONS", "RUN_OPTIONS", "PROFILE_OPTIONS"]


@dataclass(frozen=True, kw_only=True)
class Options:
    """The caller's flag for each setting an error may suggest (None: the caller has none)."""

    cpus: str
    """Cores the whole cluster shares."""
    mode: str | None
    """Emulation mode (auto, netns, local)."""
    no_cpu_limits: str | None
    """Turns CPU quotas off."""
    bandwidth_scale: str | None
    """Scales every link of the spec."""
    max_gbps: str | None
    """Caps every emulated link."""


EMULATE_OPTIONS = Options(cpus="--cpus", mode="--mode", no_cpu_limits="--no-cpu-limits",
                          bandwidth_scale="--bandwidth-scale", max_gbps="--max-gbps")
"""`spantrain emulate`."""
RUN_OPTIONS = Options(cpus="--emulate-cpus", mode="--emulate-mode", no_cpu_limits=None, bandwidth_scale=None,
                      max_gbps=None)
"""`spantrain run --emulate`."""
PROFILE_OPTIONS = Options(cpus="--cpus", mode=None, no_cpu_limits=None, bandwidth_scale=None, max_gbps=None)
"""`spantrain profile --cluster`."""
