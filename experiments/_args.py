"""What the experiment scripts share about bad input: like `spantrain`, each reports a flag or
file it cannot use in one line on stderr, ``SCRIPT: error: ...``, and exits with code 2,
before any work (a run that failed on its input minutes in, or with a traceback, was the
alternative)."""

from __future__ import annotations

import sys

__all__ = ["BAD_INPUT", "bad_input"]

BAD_INPUT = 2
"""Exit code of bad input, as `spantrain` and argparse use."""


def bad_input(script: str, error: Exception | str) -> int:
    """Print `error` (a `SpantrainError`, or the message itself) as ``SCRIPT: error: ...`` on
    stderr; returns `BAD_INPUT` for the script's main to return."""
    print(f"{script}: error: {error}", file=sys.stderr)
    return BAD_INPUT
