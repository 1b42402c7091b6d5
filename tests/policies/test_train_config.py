"""The training job's configuration: every bad field named in its error."""

from __future__ import annotations

import pytest

from spantrain.errors import SpantrainError
from spantrain.policies.train_config import TrainConfig


@pytest.mark.parametrize("field,value", [("timesteps", -1), ("start_kicks", -2), ("imitation_episodes", 1.5),
                                         ("imitation_rounds", 0), ("imitation_epochs", 0), ("n_envs", 0)])
def test_bad_field_is_named(field, value):
    with pytest.raises(SpantrainError, match=field):
        TrainConfig(**{field: value})


def test_nothing_to_train_is_an_error_but_imitation_alone_is_fine():
    with pytest.raises(SpantrainError, match="nothing to train"):
        TrainConfig(timesteps=0, imitation_episodes=0)
    config = TrainConfig(timesteps=0, imitation_episodes=10, start_kicks=3)
    assert config.env_config().start_kicks == 3
