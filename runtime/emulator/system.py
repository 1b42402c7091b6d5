"""Running the system tools (`ip`, `tc`) with explicit argument lists and one-line errors."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from spantrain.errors import EmulationError

__all__ = ["run", "have_tools"]


def run(argv: Sequence[str], *, input: str | None = None, check: bool = True) -> str:
    """Run `argv` (never through a shell); its stdout, or `EmulationError` naming the command."""
    try:
        proc = subprocess.run(list(argv), input=input, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise EmulationError(f"{argv[0]}: command not found (install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise EmulationError(f"{' '.join(argv[:4])} ...: timed out after 60 s") from None
    if check and proc.returncode != 0:
        lines = [x for x in (proc.stderr or proc.stdout).strip().splitlines() if x.strip()]
        reason = lines[-1] if lines else f"exit code {proc.returncode}"
        raise EmulationError(f"`{' '.join(argv[:6])}{' ...' if len(argv) > 6 else ''}` failed: {reason}")
    return proc.stdout


def have_tools(*names: str) -> list[str]:
    """The names among `names` that are not on PATH."""
    return [n for n in names if shutil.which(n) is None]
