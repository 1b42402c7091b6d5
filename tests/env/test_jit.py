"""Compiled kernels without a writable cache: compiled in the process, with one note."""

from __future__ import annotations

import subprocess
import sys

_NOWHERE = """
from numba.core import caching

caching.CacheImpl._locator_classes = []  # what numba finds with no writable __pycache__ or ~/.cache
import spantrain.env.kernel, spantrain.env.partition, spantrain.policies.exhaustive, spantrain.policies.grouping
from spantrain.env.jit import cached_njit

@cached_njit
def twice(x):
    return 2 * x

print(twice(21))
"""


def test_kernels_with_nowhere_to_cache_compile_in_the_process_with_one_note():
    # every command that loads the cost model was numba's "cannot cache function ...: no locator
    # available" traceback
    proc = subprocess.run([sys.executable, "-c", _NOWHERE], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["42"]
    notes = [line for line in proc.stderr.splitlines() if "numba cannot cache" in line]
    assert len(notes) == 1 and notes[0].endswith("set NUMBA_CACHE_DIR to a directory you can write"), proc.stderr
