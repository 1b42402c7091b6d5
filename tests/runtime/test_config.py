"""A worker's record of its run: the optimizer settings check themselves, naming the field."""

from __future__ import annotations

import pytest

from spantrain.errors import ExecutionError
from spantrain.runtime.config import OptimConfig


@pytest.mark.parametrize("field, value", [("lr", 0.0), ("lr", float("nan")), ("weight_decay", -0.1),
                                          ("beta1", 1.0), ("beta2", -0.5), ("eps", float("inf")), ("eps", True)])
def test_optimizer_settings_out_of_range_name_their_field(field, value):
    with pytest.raises(ExecutionError, match=rf"^optim\.{field} is out of range: {value!r}"):
        OptimConfig(**{field: value})


def test_a_decay_that_would_flip_the_weights_is_refused():
    with pytest.raises(ExecutionError, match=r"weight_decay times optim.lr must be below 1, got 2000 x 0.001"):
        OptimConfig(lr=1e-3, weight_decay=2000.0)
    assert OptimConfig(lr=1e-3, weight_decay=999.0).weight_decay == 999.0


def test_settings_are_keyword_only():
    with pytest.raises(TypeError):
        OptimConfig(1e-3)  # type: ignore[misc]


@pytest.mark.parametrize("field, value", [("lr", "0.1"), ("beta1", None), ("eps", [1e-8])])
def test_optimizer_settings_of_the_wrong_type_name_their_field(field, value):
    # compared before their type was checked: a TypeError
    with pytest.raises(ExecutionError, match=rf"^optim\.{field} is out of range"):
        OptimConfig(**{field: value})


def test_optimizer_settings_name_every_bad_field_at_once():
    with pytest.raises(ExecutionError, match=r"optim\.lr .*; optim\.beta2 "):
        OptimConfig(lr=-1.0, beta2=2.0)
