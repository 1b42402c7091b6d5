"""Checks for a figure path the user gave (`--plot`, `--timeline`), made before any work."""

from __future__ import annotations

from pathlib import Path

from spantrain.cli._common import check_output_file
from spantrain.errors import SpantrainError

__all__ = ["FIGURE_FORMATS", "check_figure_path"]

FIGURE_FORMATS = ("png", "pdf", "svg")
"""Suffixes a figure may have: formats matplotlib writes without extra tools (pgf needs LaTeX)."""


def check_figure_path(path: str, option: str) -> None:
    """Refuse in one line a figure path that cannot be written as given, like `-o` does: an
    unsupported or missing suffix (matplotlib would fail late or write PATH.png instead), a
    directory, or a parent directory that does not exist (it is not created)."""
    formats = ", ".join(f".{f}" for f in FIGURE_FORMATS)
    check_output_file(path, option, f"give a file name ending in {formats}")
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FIGURE_FORMATS:
        got = f"format '.{suffix}' is not supported" if suffix else "no file suffix"
        raise SpantrainError(f"{option} {path}: {got}; give a file name ending in {formats}")
