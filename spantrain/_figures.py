"""Quiet figure drawing: names the spec accepts (any Unicode) may have no glyph in the font."""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["glyphs_may_be_missing", "plain_text"]


@contextlib.contextmanager
def glyphs_may_be_missing() -> Iterator[None]:
    """Within (drawing and saving a figure): matplotlib's "Glyph N missing from font(s)"
    warnings are dropped. A cluster named in Japanese drew two dozen of them, each with its
    source line, over the command's output; the figure shows a box per missing glyph anyway."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font", category=UserWarning)
        yield


def plain_text(draw: Callable[..., Any]) -> Callable[..., Any]:
    """`draw` (a function that makes a figure) with every text drawn as written: names from users'
    files are not matplotlib math, and a cluster or device named 'g$0$\\' or 'm$\\bad{$' was a
    ParseException traceback when the figure was saved."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*args, **kwargs)

    return wrapper
