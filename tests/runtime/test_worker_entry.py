"""A worker process started with a run config it cannot use ends in one line, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spantrain.runtime.entry import EXIT_REFUSED


def _worker(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120,
                          env={**base, **env})


@pytest.mark.parametrize("content, says", [(None, "file not found"), ("{", "JSON syntax error at line 1")])
@pytest.mark.parametrize("entry", ["emulated", "local"])
def test_a_run_config_a_worker_cannot_read_is_one_line(tmp_path, entry, content, says):
    config = tmp_path / "run_config.json"
    if content is not None:
        config.write_text(content)
    if entry == "emulated":
        args = ["-m", "spantrain.runtime.emulated_worker", str(config)]
    else:
        args = ["-c", "import sys; from spantrain.runtime.entry import local_entry; "
                "local_entry(sys.argv[1], 0, 1, sys.argv[2])", str(config), str(tmp_path / "store")]
    done = _worker(args, {"RANK": "0", "WORLD_SIZE": "1"})
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert done.stderr.startswith(f"rank 0: error: {config}: {says}"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("env", [{}, {"RANK": "x", "WORLD_SIZE": "1"}, {"RANK": "1", "WORLD_SIZE": "1"}])
def test_an_emulated_worker_without_its_rank_is_one_line(tmp_path, env):
    done = _worker(["-m", "spantrain.runtime.emulated_worker", str(tmp_path / "run_config.json")], env)
    assert done.returncode == EXIT_REFUSED, done.stderr
    assert done.stderr == (f"emulated_worker: error: RANK={env.get('RANK', '')} and WORLD_SIZE="
                           f"{env.get('WORLD_SIZE', '')}: both must be set, to a rank below the number of ranks "
                           "(`spantrain run --emulate` sets them)\n"), done.stderr
