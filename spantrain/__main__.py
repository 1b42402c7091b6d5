"""`python -m spantrain` and the `spantrain` console script (`run`).

Ctrl-C may come at any moment of start-up, while numpy, the command modules and torch are
still being imported, before `spantrain.cli.main` handles it: `run` first makes it end the
process with one line and exit code 130 (`spantrain._interrupt`). Importing the package
and this module loads nothing before that (see `spantrain/__init__`).
"""

from __future__ import annotations

import os
import signal
import sys

from spantrain import _interrupt


def run() -> int:
    """The command line: `spantrain.cli.main`, with Ctrl-C during its start-up handled too."""
    _interrupt.install()
    try:
        from spantrain.cli import main

        code = main()
        if signal.getsignal(signal.SIGINT) is _interrupt.quit_on_ctrl_c:
            # a command that keeps nothing is done and said all: a Ctrl-C while the interpreter
            # shuts down (which restores the default handler) ended it with 130 and no word
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            # the command is done (stopped and saved, or finished: train-policy had shipped its policy
            # and printed its result, then exited 130 unsaid): a Ctrl-C would only cut the exit (W&B's
            # and torch's atexit teardown) into tracebacks and lost records. Held and dropped (the same
            # signal again, 10 s on, still ends it)
            _interrupt.SignalsHeld(deliver=False).__enter__()
        return code
    except KeyboardInterrupt:  # SIGINT had another handler than Python's (run() called in-process)
        if not os.environ.get(_interrupt.QUIET_INTERRUPT_ENV):
            print("spantrain: interrupted", file=sys.stderr)
        return _interrupt.INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(run())
