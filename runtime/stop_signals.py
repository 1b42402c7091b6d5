"""SIGTERM and SIGHUP as Ctrl-C, for the processes that own a run (the local launcher and the
emulated cluster).

By default these signals end a process at once: no `finally` block runs, so workers lose
every iteration since their last checkpoint and an emulated cluster leaves its namespaces
behind. Raised as `Terminated` (a `KeyboardInterrupt`) in the main thread instead, they
unwind like Ctrl-C. A signal ignored when the run started (``nohup``) stays ignored.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["Terminated", "install", "restore"]

_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so the run stops as on Ctrl-C."""


def _raise(signum: int, frame: Any) -> None:
    raise Terminated(f"by {signal.Signals(signum).name}")


def install() -> dict[int, Any]:
    """Make SIGTERM and SIGHUP raise `Terminated`; the handlers they replaced, for `restore`
    (none outside the main thread, where Python cannot set handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _raise) for sig in _SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN}


def restore(old: dict[int, Any]) -> None:
    """Put back the handlers `install` replaced."""
    for sig, handler in old.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
