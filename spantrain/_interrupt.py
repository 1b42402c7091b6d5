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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["INTERRUPTED", "quit_on_ctrl_c", "install", "command_starts"]

INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), what a shell reports for a process SIGINT ended."""


_message = b"spantrain: interrupted\n"


def quit_on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """SIGINT handler while nothing needs cleaning up: one line on stderr, exit code 130."""
    try:
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
