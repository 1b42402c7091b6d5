"""The training job's configuration: every bad field named in its error."""

from __future__ import annotations

import pytest

from spantrain.errors import SpantrainError
from spantrain.policies.train_config import TrainConfig


@pytest.mark.parametrize("field,value", [("timesteps", -1), ("start_kicks", -2), ("imitation_episodes", 1.5),
                                         ("imitation_rounds", 0), ("imitation_epochs", 0), ("n_envs", 0),
                                         ("hidden", 30)])
def test_bad_field_is_named(field, value):
    with pytest.raises(SpantrainError, match=field):
        TrainConfig(**{field: value})


def test_nothing_to_train_is_an_error_but_imitation_alone_is_fine():
    with pytest.raises(SpantrainError, match="nothing to train"):
        TrainConfig(timesteps=0, imitation_episodes=0)
    config = TrainConfig(timesteps=0, imitation_episodes=10, start_kicks=3)
    assert config.env_config().start_kicks == 3


def test_init_policy_must_be_a_path_and_leave_ppo_steps_to_run():
    with pytest.raises(SpantrainError, match="init_policy"):
        TrainConfig(init_policy="")
    # a starting policy replaces imitation, so PPO steps are all there is to train
    with pytest.raises(SpantrainError, match="nothing to train"):
        TrainConfig(init_policy="runs/policy/interrupted-policy.pt", timesteps=0, imitation_episodes=10)
    assert TrainConfig(init_policy="p.pt", timesteps=10).init_policy == "p.pt"


def test_missing_init_policy_fails_before_any_work(tmp_path):
    from spantrain.policies.training import train

    with pytest.raises(SpantrainError, match=r"init_policy: .*missing\.pt not found"):
        train(TrainConfig(init_policy=str(tmp_path / "missing.pt"), out_dir=str(tmp_path / "run"),
                          cache_dir=str(tmp_path / "cache"), track=False, progress=False))
    assert not (tmp_path / "cache").exists()  # no heuristic starts were computed
