"""A worker's record of its run: the optimizer settings check themselves, naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from spantrain.errors import ExecutionError
from spantrain.runtime.config import OptimConfig

ROOT = Path(__file__).resolve().parents[2]


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


def _config_text(tmp_path) -> str:
    from spantrain.cluster import Cluster
    from spantrain.runtime.config import RunConfig

    cluster = Cluster.from_file(ROOT / "examples" / "cee-demo.yaml")
    plan = {"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1,
                           "stages": [{"devices": [cluster.devices[0].id], "layers": [0, 4]}]}]}
    return RunConfig(cluster_spec=cluster.to_spec(), model="tiny-gpt", global_batch=None, plan=plan, steps=2,
                     run_dir=str(tmp_path), metrics_path=str(tmp_path / "metrics.jsonl")).to_json()


def test_a_run_config_reads_back_what_it_saved(tmp_path):
    from spantrain.runtime.config import RunConfig

    path = tmp_path / "run_config.json"
    path.write_text(_config_text(tmp_path))
    config = RunConfig.from_file(path)
    assert config.steps == 2 and config.optim == OptimConfig() and config.to_json() == _config_text(tmp_path)


@pytest.mark.parametrize("content, message", [
    (None, "PATH: file not found"),
    ("DIR", "PATH: is a directory, expected a file"),
    ('{"steps": 2,', "PATH: JSON syntax error at line 1 column 13: Expecting property name enclosed in double quotes"),
    ("[1, 2]", "PATH: expected a JSON object of a run's settings, got list; pass the run_config.json that spantrain "
               "run wrote in a run directory"),
    ('{"steps": 2, "colour": 1}', "PATH: not a run's settings (unknown key 'colour'; missing key 'cluster_spec'; "
                                  "missing key 'model'; "),
    (lambda text: text.replace('"lr"', '"learning_rate"'), "PATH: not a run's settings (optim: unknown key "
                                                            "'learning_rate'); pass the run_config.json"),
    (lambda text: text.replace('"lr": 0.001', '"lr": -1'), "PATH: optim.lr is out of range: -1"),
])
def test_a_bad_run_config_file_is_one_error_naming_it(tmp_path, content, message):
    # a worker's settings file: a missing one was a FileNotFoundError, a malformed one a JSONDecodeError,
    # KeyError or TypeError traceback in the worker
    from spantrain.runtime.config import RunConfig

    path = tmp_path / "run_config.json"
    if content == "DIR":
        path.mkdir()
    elif callable(content):
        path.write_text(content(_config_text(tmp_path)))
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ExecutionError) as err:
        RunConfig.from_file(path)
    assert str(err.value).startswith(message.replace("PATH", str(path))), str(err.value)
