"""The planner interface module: the garbage-collector pause the heuristic and ppo search under."""

from __future__ import annotations

import gc

import pytest

from spantrain.planner import gc_paused


def test_gc_paused_nests_and_restores_the_collector_even_on_error():
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner exit keeps the outer pause
        raise RuntimeError
    assert gc.isenabled()

