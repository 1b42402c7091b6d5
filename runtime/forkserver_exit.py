"""Imported only by the launcher's fork server (its preload): leave without interpreter teardown.

The fork server has torch loaded, and tearing that down takes about half a second, all of it
while the server still holds the launcher's stdout and stderr: a caller reading the run's
output (``subprocess.run(..., capture_output=True)``, ``spantrain run | tee``) would wait that
long after the launcher itself exited. The server's own exit code is read by nobody, and its
workers leave through ``os._exit`` (multiprocessing's own path), so they never run this.

A launcher killed outright (SIGKILL, the OOM killer) never runs the exit handler that removes
its ``pymp-*`` directory, where the server's socket lives: the server removes it then.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import sys
from multiprocessing import util

__all__ = ["SOCKET_DIR_ENV"]

SOCKET_DIR_ENV = "SPANTRAIN_FORKSERVER_DIR"
"""Set by the launcher: its multiprocessing temporary directory, which holds the server's socket."""

_LAUNCHER_PID = os.getppid()


def _leave() -> None:
    # multiprocessing registered its exit handler before this module was imported, so it would
    # run after this one: run it now (it is idempotent)
    util._exit_function()
    socket_dir = os.environ.get(SOCKET_DIR_ENV, "")
    if os.getppid() != _LAUNCHER_PID and os.path.basename(socket_dir).startswith("pymp-"):
        shutil.rmtree(socket_dir, ignore_errors=True)  # the launcher is gone without removing it
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed or replaced: nothing to say
            stream.flush()
    os._exit(0)


atexit.register(_leave)  # registered before torch's and the worker module's handlers, so it runs after them
