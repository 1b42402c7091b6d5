"""numba's `njit`, with its on-disk cache where there is somewhere to write it.

numba caches compiled kernels beside their source (``__pycache__``) or, failing that, under
the user's ``~/.cache``. A user who can write neither (a root-owned install, ``HOME`` read-only
or ``/nonexistent``, as for ``nobody``) got numba's "cannot cache function ...: no locator
available" traceback from every command that loads the cost model. Such a process compiles
the kernels itself instead (15-30 s on 2 cores), with one note naming the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numba import njit

from spantrain._say import note

__all__ = ["cached_njit"]

_noted = False


def cached_njit(func: Callable[..., Any]) -> Callable[..., Any]:
    """``njit(cache=True)(func)``, or ``njit(func)`` when numba has nowhere to write its cache."""
    global _noted
    try:
        return njit(cache=True)(func)
    except RuntimeError as e:
        if "cannot cache" not in str(e):
            raise
    if not _noted:
        _noted = True
        note("numba cannot cache the cost model's compiled kernels (no writable directory beside them or in "
             "~/.cache), so every command compiles them first (15-30 s on 2 cores): set NUMBA_CACHE_DIR to a "
             "directory you can write")
    return njit(func)
