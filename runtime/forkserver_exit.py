"""Imported only by the launcher's fork server (its preload): leave without interpreter teardown.

The fork server has torch loaded, and tearing that down takes about half a second, all of it
while the server still holds the launcher's stdout and stderr: a caller reading the run's
output (``subprocess.run(..., capture_output=True)``, ``spantrain run | tee``) would wait that
long after the launcher itself exited. The server's own exit code is read by nobody, and its
workers leave through ``os._exit`` (multiprocessing's own path), so they never run this.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
from multiprocessing import util

__all__: list[str] = []


def _leave() -> None:
    # multiprocessing registered its exit handler before this module was imported, so it would
    # run after this one: run it now (it is idempotent)
    util._exit_function()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed or replaced: nothing to say
            stream.flush()
    os._exit(0)


atexit.register(_leave)  # registered before torch's and the worker module's handlers, so it runs after them
