"""Ctrl-C while `spantrain` starts: quit at once, one line, exit code 130.

While `spantrain` starts it only imports modules (numpy, the command modules, at times
torch: tenths of a second to seconds). Python's KeyboardInterrupt, raised in the middle of
one of those imports, prints a traceback unless every entry catches it, and an import
can even swallow it (raised inside a weakref callback of the import machinery, it becomes
"Exception ignored ..." on stderr and the command runs on). Nothing has started yet that
needs cleaning up, so `quit_on_ctrl_c` simply ends the process.

The process entry (`spantrain.__main__`) installs it first thing. Just before the command
runs, `spantrain.cli.main` calls `command_starts`: a command that stops and saves on Ctrl-C
(``run``, ``train-policy``, ...) gets Python's KeyboardInterrupt back; one that starts no
process and keeps nothing (``plan``, ``simulate``, ...) keeps the handler to its end, its
own lazy imports included, with the command named in the line.

This module imports nothing heavy: the window before it is installed is the interpreter's
own start (with an editable install, its ``.pth`` finder) and a few milliseconds.
"""

from __future__ import annotations

import os
import signal
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["INTERRUPTED", "STOP_SIGNALS", "quit_on_ctrl_c", "install", "command_starts", "SignalsHeld",
           "QUIET_INTERRUPT_ENV"]

QUIET_INTERRUPT_ENV = "SPANTRAIN_QUIET_INTERRUPT"
"""Set for a spantrain process whose parent reports Ctrl-C itself (`profile`'s per-device
children): the child keeps nothing, so Ctrl-C ends it at once, with exit code 130 and no
"interrupted" line of its own."""

INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), what a shell reports for a process SIGINT ended."""


_message = b"spantrain: interrupted\n"


def quit_on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """SIGINT handler while nothing needs cleaning up: one line on stderr, exit code 130."""
    try:
        if not os.environ.get(QUIET_INTERRUPT_ENV):
            os.write(2, _message)
    finally:
        os._exit(INTERRUPTED)


def install() -> None:
    """Make Ctrl-C quit at once, unless SIGINT is ignored (``nohup``, a background job) or
    already has a handler of someone else's."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, quit_on_ctrl_c)


def command_starts(command: str, *, handles_ctrl_c: bool) -> None:
    """The command runs next (a no-op unless `install` replaced the handler). `handles_ctrl_c`:
    from here Ctrl-C raises KeyboardInterrupt again, for the command to stop and save; else
    it still quits at once, naming the command."""
    global _message
    if signal.getsignal(signal.SIGINT) is not quit_on_ctrl_c:
        return
    if handles_ctrl_c:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    else:
        _message = f"spantrain {command}: interrupted\n".encode()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What a user stops a command with: Ctrl-C, `kill`/`timeout`, a closed terminal."""
_HOLD_LIMIT_S = 10.0
"""How long a held signal waits before a repeated one gets through (a hung `ip` or `tc`)."""


class SignalsHeld:
    """Holds `signals` (default `STOP_SIGNALS`) while the block runs; `deliver()` re-raises the
    first one. For work that must not be cut in half: the emulator's teardown, an atomic write.

    A second Ctrl-C while the emulator's teardown ran (seconds for many devices) cut it short and
    left namespaces, cgroups and the run directory behind until the next start, so the teardown
    runs to the end first. The signal is not dropped: ``run --emulate --adapt`` tears the emulator
    down at every plan switch and trains on, and a SIGTERM during the last teardown must not end
    the process with exit code 0. `deliver()`, called once the caller's handlers are back, raises
    the first signal held (`signal.raise_signal`), unless `deliver` was false: the teardown runs
    because of an interrupt already being handled. Should the teardown hang (each `ip`/`tc` call
    times out only after 60 s), the same signal again, `_HOLD_LIMIT_S` after the first, gets
    through at once. Main thread only (Python sets handlers nowhere else); an ignored signal
    stays ignored.
    """

    def __init__(self, signals: tuple[int, ...] = STOP_SIGNALS, deliver: bool = True):
        self.signals = signals
        self.want_delivery = deliver
        self.first: int | None = None
        self._since = 0.0
        self._old: dict[int, object] = {}

    def __enter__(self) -> SignalsHeld:
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._hold) for sig in self.signals
                         if signal.getsignal(sig) is not signal.SIG_IGN}
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        old, self._old = self._old, {}
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def _hold(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first, self._since = signum, now
        elif signum == self.first and now - self._since > _HOLD_LIMIT_S:
            self.first = None  # delivered now, not again
            self._restore()
            signal.raise_signal(signum)

    def deliver(self) -> None:
        """Raise the first signal held, to whatever handles it now (call after restoring handlers)."""
        first, self.first = self.first, None
        if first is not None and self.want_delivery:
            signal.raise_signal(first)
