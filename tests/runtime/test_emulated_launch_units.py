"""`spantrain run --emulate` without namespaces: option checks, and whom a failed emulated run blames."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import ASYMMETRIC, plan, spantrain_here, write_inputs

from spantrain.runtime.config import RunConfig
from spantrain.runtime.emulator import DeviceResult
from spantrain.runtime.entry import error_file
from spantrain.runtime.launcher import _blame_emulated


def _args(tmp_path, *extra: str) -> list[str]:
    cluster, model = write_inputs(tmp_path)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    return ["run", "--cluster", str(cluster), "--model", str(model), "--plan", str(path), "--steps", "2",
            "--run-dir", str(tmp_path / "run"), *extra]


@pytest.mark.parametrize("extra, expected", [
    (["--emulate-cpus", "2"], "--emulate-cpus and --emulate-mode only apply with --emulate"),
    (["--emulate-mode", "local"], "--emulate-cpus and --emulate-mode only apply with --emulate"),
    (["--emulate", "--emulate-cpus", "0"], "--emulate-cpus must be a finite number > 0, got 0"),
])
def test_emulate_options_are_checked_before_anything_starts(tmp_path, extra, expected):
    code, out, err = spantrain_here(*_args(tmp_path, *extra))
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"spantrain run: error: {expected}"), err
    assert not (tmp_path / "run").exists()


def _cfg(tmp_path) -> RunConfig:
    return RunConfig(cluster_spec={}, model="m", global_batch=None, plan={}, steps=1, run_dir=str(tmp_path),
                     metrics_path=str(tmp_path / "m.jsonl"))


def _result(rank: int, code: int, stopped: bool = False, seconds: float = 1.0) -> DeviceResult:
    return DeviceResult(device_id=f"d{rank}", rank=rank, returncode=code, stdout="", stderr="", seconds=seconds,
                        stopped=stopped)


def _error(tmp_path, rank: int, text: str) -> None:
    path = error_file(tmp_path, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def test_a_killed_worker_is_blamed_before_the_peers_it_took_down(tmp_path):
    _error(tmp_path, 0, "RuntimeError: Connection closed by peer")
    results = [_result(0, 1, seconds=3.0), _result(1, -9, seconds=3.5), _result(2, -15, stopped=True)]
    assert _blame_emulated(results, _cfg(tmp_path)) == (1, "was killed by SIGKILL")


def test_a_worker_with_its_own_error_is_blamed_before_secondary_failures(tmp_path):
    _error(tmp_path, 0, "RuntimeError: Connection reset by peer")
    _error(tmp_path, 2, "ValueError: bad shape")
    results = [_result(0, 1, seconds=1.0), _result(1, -15, stopped=True), _result(2, 1, seconds=2.0)]
    assert _blame_emulated(results, _cfg(tmp_path)) == (2, "exited with code 1")


def test_when_everyone_timed_out_the_worker_still_running_is_blamed(tmp_path):
    for r in (0, 2):
        _error(tmp_path, r, "DistBackendError: Timed out waiting 300000ms for recv")
    results = [_result(0, 1), _result(1, -15, stopped=True), _result(2, 1)]
    rank, how = _blame_emulated(results, _cfg(tmp_path))
    assert rank == 1 and how.startswith("stopped responding")
