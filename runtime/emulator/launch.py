"""Starting one process per device, relaying its output, and stopping them all together.

Each device's command runs as ``ip netns exec <ns> COMMAND`` (or plain COMMAND in the
fallback) in a session of its own, so the emulator can signal the whole process group.
The child joins its cgroup between fork and exec, so the command and everything it
forks start inside the CPU quota, and asks for SIGTERM when the emulator dies. Output is
relayed line by line with a ``[device-id]`` prefix (stdout to stdout, stderr to stderr),
optionally copied to per-device log files, and the tail is kept for the caller. Like
torchrun, the first device that fails brings the others down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from spantrain.errors import EmulationError

__all__ = ["DeviceResult", "DeviceProcess", "log_name", "TimedOut", "wait_all", "stop_all", "first_failure",
           "describe_exit"]

_KEEP_LINES = 5000
_GRACE_S = 5.0
_print_lock = threading.Lock()


class TimedOut(EmulationError):
    """The command was still running at `wait_all`'s timeout; every device was stopped."""


@dataclass
class DeviceResult:
    """How one device's command ended."""

    device_id: str
    rank: int
    returncode: int
    """Exit code; negative: killed by that signal (as in `subprocess`)."""
    stdout: str
    """The last lines of its stdout."""
    stderr: str
    """The last lines of its stderr."""
    seconds: float
    """Wall time from start to exit."""
    stopped: bool = False
    """True when the emulator stopped it because another device failed (or on interrupt)."""

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class _Pump(threading.Thread):
    """Copies one pipe to a prefixed stream and a log file, keeping the tail."""

    def __init__(self, pipe: IO[bytes], prefix: str, echo: IO[str] | None, log: IO[str] | None):
        super().__init__(daemon=True)
        self.pipe, self.prefix, self.echo, self.log = pipe, prefix, echo, log
        self.lines: deque[str] = deque(maxlen=_KEEP_LINES)

    def run(self) -> None:
        for raw in iter(self.pipe.readline, b""):
            line = raw.decode(errors="replace")
            self.lines.append(line)
            if self.log is not None:
                try:
                    self.log.write(line)
                    self.log.flush()
                except OSError:  # a full disk: the device must not block on its pipe for it
                    self.log = None
            if self.echo is not None:
                try:
                    with _print_lock:
                        self.echo.write(f"{self.prefix}{line if line.endswith(chr(10)) else line + chr(10)}")
                        self.echo.flush()
                except OSError:  # `| head`, /dev/full: stop echoing but keep draining, or the device blocks
                    self.echo = None
        self.pipe.close()


def _child_setup(cgroup_procs: str | None):
    """preexec_fn: join the device's cgroup, and ask the kernel for SIGTERM should the emulator
    die (``kill -9``): its devices ran on, ranks training into a checkpoint directory the
    user's next run resumed from, until the next start swept them up. Raw os calls and a
    libc function looked up before the fork: safe after it."""
    prctl = _prctl() if threading.current_thread() is threading.main_thread() else None  # the death of
    parent = os.getpid()  # the forking thread is what the kernel watches: only the main thread lives on

    def setup() -> None:
        if cgroup_procs is not None:
            fd = os.open(cgroup_procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # it died before the request: the signal will not come
                os.kill(os.getpid(), signal.SIGTERM)

    return setup


_PR_SET_PDEATHSIG = 1


def _prctl():
    """libc's prctl, or None where there is none (not Linux)."""
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def log_name(device_id: str) -> str:
    """The file name of a device's log: ``<id>.log``, with ``%``, ``/`` and NUL written ``%25``,
    ``%2F`` and ``%00`` (an id ``../../x`` wrote ``x.log`` two directories above the log directory)."""
    return device_id.replace("%", "%25").replace("/", "%2F").replace("\0", "%00") + ".log"


class DeviceProcess:
    """One device's command, running."""

    def __init__(self, *, rank: int, device_id: str, command: Sequence[str], env: dict[str, str],
                 netns: str | None, cgroup: Path | None, echo: bool, log_dir: Path | None):
        self.rank, self.device_id = rank, device_id
        argv = ["ip", "netns", "exec", netns, *command] if netns else list(command)
        self._log = open(log_dir / log_name(device_id), "w") if log_dir else None  # noqa: SIM115 (closed in finish)
        self.started = time.monotonic()
        self.ended: float | None = None
        self.stopped = False
        try:
            self.popen = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True,
                                          preexec_fn=_child_setup(str(cgroup / "cgroup.procs") if cgroup else None))
        except OSError as e:
            if self._log:
                self._log.close()
            raise EmulationError(f"cannot start {command[0]!r} for device {device_id}: {e.strerror or e}") from None
        prefix = f"[{device_id}] "
        self._pumps = [_Pump(self.popen.stdout, prefix, sys.stdout if echo else None, self._log),
                       _Pump(self.popen.stderr, prefix, sys.stderr if echo else None, self._log)]
        for p in self._pumps:
            p.start()

    def poll(self) -> int | None:
        """The exit code once the device's command has ended (None while it runs). A device ends
        with its command: what that left running in the background (outside a cgroup nothing
        else stops it; it held the output pipes, which cost 5 s a pipe) is killed first, while
        the command's unreaped zombie still holds the group's id, so no other group is hit."""
        if self.popen.returncode is not None:
            return self.popen.returncode
        try:
            ended = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped elsewhere
            return self.popen.poll()
        if ended is None:
            return None
        return self._reap()

    def _reap(self) -> int:
        if self.ended is None:
            self.ended = time.monotonic()
        self.signal(signal.SIGKILL)
        return self.popen.wait()

    def signal(self, sig: int) -> None:
        """Send `sig` to the device's whole process group (not once the command is reaped: its
        group's id may belong to someone else by then)."""
        if self.popen.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, sig)

    def result(self) -> DeviceResult:
        if self.popen.returncode is None:
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOWAIT)  # until it ends, unreaped
            self._reap()
        code = self.popen.returncode
        for p in self._pumps:
            p.join(timeout=5)
        if self._log:
            with contextlib.suppress(OSError):  # a full disk: the pumps already stopped writing it
                self._log.close()
        return DeviceResult(device_id=self.device_id, rank=self.rank, returncode=code,
                            stdout="".join(self._pumps[0].lines), stderr="".join(self._pumps[1].lines),
                            seconds=(self.ended or time.monotonic()) - self.started, stopped=self.stopped)


def stop_all(procs: Sequence[DeviceProcess], first: int = signal.SIGTERM, grace_s: float = _GRACE_S) -> None:
    """Signal every running device with `first`, then SIGKILL whatever is left after `grace_s`."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.stopped = True
        p.signal(first)
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in running) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in running:
        p.signal(signal.SIGKILL)


def wait_all(procs: Sequence[DeviceProcess], timeout_s: float | None = None,
             stop_when: Callable[[], bool | float] | None = None, interrupt_grace_s: float = _GRACE_S,
             on_interrupt: Callable[[], None] | None = None) -> list[DeviceResult]:
    """Wait for every device; the first failure (or the timeout) stops the rest.

    `stop_when`, polled about every 50 ms, lets the caller stop every device early: true
    (a run that stopped making progress, say) sends SIGTERM and SIGKILL after the usual
    grace; a number of seconds instead gives the devices that long to finish (a run that
    checkpoints before it exits). The devices it stops come back with ``stopped``. On Ctrl-C
    (or SIGTERM to this process) the devices get SIGINT and `interrupt_grace_s` to finish (a
    training run's iteration and checkpoint), after `on_interrupt()` says so; a second Ctrl-C
    kills them.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if any(c not in (None, 0) for c in codes):
                stop_all(procs)
                break
            stop = stop_when() if stop_when is not None else False
            if stop is not False:
                stop_all(procs, grace_s=_GRACE_S if stop is True else float(stop))
                break
            if deadline is not None and time.monotonic() > deadline:
                stop_all(procs)
                for p in procs:
                    p.result()
                raise TimedOut(f"the command was still running after {timeout_s:g} s; stopped every device")
            time.sleep(0.05)
    except BaseException as e:
        # Ctrl-C, SIGTERM to the emulator, or a bug here: never leave devices running.
        interrupted = isinstance(e, KeyboardInterrupt)
        try:
            if interrupted and on_interrupt is not None:
                on_interrupt()
            stop_all(procs, signal.SIGINT, grace_s=interrupt_grace_s if interrupted else _GRACE_S)
        except KeyboardInterrupt:
            # A second Ctrl-C during the grace: kill them now. Raised out of the grace, it skipped the
            # SIGKILL, and devices outside namespaces and cgroups (the fallback) ran on, orphaned.
            stop_all(procs, signal.SIGKILL, grace_s=0)
        raise
    return [p.result() for p in procs]


def describe_exit(code: int | None) -> str:
    """How a process ended, from its exit code as `subprocess` and `multiprocessing` give it
    (negative: the signal that killed it; a real-time signal has no name)."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


def first_failure(results: Sequence[DeviceResult]) -> DeviceResult | None:
    """The device that failed on its own first (not one the emulator stopped), if any."""
    failed = [r for r in results if not r.ok and not r.stopped] or [r for r in results if not r.ok]
    return min(failed, key=lambda r: r.seconds) if failed else None
