"""What the experiment scripts share about bad input: like `spantrain`, each reports a flag or
file it cannot use in one line on stderr, ``SCRIPT: error: ...``, and exits with code 2,
before any work (a run that failed on its input minutes in, or with a traceback, was the
alternative)."""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["BAD_INPUT", "INTERRUPTED", "bad_input", "run_script"]

BAD_INPUT = 2
"""Exit code of bad input, as `spantrain` and argparse use."""
INTERRUPTED = 130
"""Exit code after Ctrl-C, as `spantrain` and shells use."""


def bad_input(script: str, error: Exception | str) -> int:
    """Print `error` (a `SpantrainError`, or the message itself) as ``SCRIPT: error: ...`` on
    stderr; returns `BAD_INPUT` for the script's main to return."""
    print(f"{script}: error: {error}", file=sys.stderr)
    return BAD_INPUT


def run_script(main: Callable[[], int], script: str) -> int:
    """A script's ``__main__``: `main`'s exit code; bad input (`SpantrainError`) in one line and
    code 2; Ctrl-C, SIGTERM or SIGHUP in one line and code 130, as `spantrain` does (a traceback
    otherwise; SIGTERM left the scripts' temporary directories behind, since no `finally` ran)."""
    from spantrain._interrupt import SignalsHeld
    from spantrain._say import saying_as
    from spantrain.errors import SpantrainError
    from spantrain.runtime import stop_signals

    old = stop_signals.install()
    try:
        with saying_as(script):  # its notes as its errors: ``SCRIPT: note: ...``
            return main()
    except SpantrainError as e:
        return bad_input(script, e)
    except KeyboardInterrupt as e:
        print(f"{script}: interrupted" + (f" {e}" if str(e) else ""), file=sys.stderr)
        return INTERRUPTED
    finally:
        stop_signals.restore(old)
        main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        if getattr(main_spec, "name", "").endswith(f".{script}"):  # the program, about to end (not a caller's call)
            # done and said: a Ctrl-C during the interpreter's teardown (W&B's) ended a finished script
            # with 130 and no word. Held and dropped (the same signal again, 10 s on, still ends it)
            SignalsHeld(deliver=False).__enter__()
