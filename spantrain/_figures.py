"""Quiet figure drawing: names the spec accepts (any Unicode) may have no glyph in the font."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

__all__ = ["glyphs_may_be_missing"]


@contextlib.contextmanager
def glyphs_may_be_missing() -> Iterator[None]:
    """Within (drawing and saving a figure): matplotlib's "Glyph N missing from font(s)"
    warnings are dropped. A cluster named in Japanese drew two dozen of them, each with its
    source line, over the command's output; the figure shows a box per missing glyph anyway."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font", category=UserWarning)
        yield
