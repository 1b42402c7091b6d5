"""The runtime benchmark runs its configurations and they train the same model."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from runtime_helpers import MODEL

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_runtime_reports_every_configuration(tmp_path, wandb_part):
    (tmp_path / "model.json").write_text(json.dumps(MODEL))  # tiny-gpt's figures are for the report, not tests
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb")}
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_runtime.py"), "--json", "--steps", "3",
                           "--repeats", "1", "--micro-batches", "2", "--model", str(tmp_path / "model.json")],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    # it ends naming its W&B run, as train-policy and run do (stderr: stdout holds the JSON alone)
    (part,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    assert proc.stderr.splitlines()[-1] == f"W&B run: {part} (offline: `wandb sync {part}` uploads it)", proc.stderr
    assert wandb_part(part)["name"] == "bench_runtime: rt-small"  # W&B's made-up name, before
    rows = {r["config"]: r for r in out["rows"]}
    assert list(rows) == ["single", "single-bf16", "1x1", "1x1-mb", "1x2", "1x2-bf16"]
    assert rows["single"]["overhead_pct"] == 0.0 and rows["1x2"]["processes"] == 2
    assert all(r["step_s"] > 0 and r["samples_per_s"] == pytest.approx(out["batch"] / r["step_s"])
               for r in rows.values())
    # same seed, same samples, same model: every path starts from the same loss
    assert rows["1x1"]["loss_first"] == pytest.approx(rows["single"]["loss_first"], rel=1e-5)
    for name in ("1x1-mb", "1x2"):
        assert rows[name]["loss_first"] == pytest.approx(rows["single"]["loss_first"], rel=1e-5)
    # bf16 rounds: near the same loss, not exactly it
    for name in ("single-bf16", "1x2-bf16"):
        assert rows[name]["loss_first"] == pytest.approx(rows["single"]["loss_first"], rel=1e-2)
        assert rows[name]["loss_first"] != rows["single"]["loss_first"]
    assert all(r["cpu_s"] > 0 for r in rows.values())


@pytest.mark.parametrize("extra, expected", [
    (["--micro-batches", "0"], "--micro-batches must be at least 1, got 0"),  # was a ZeroDivisionError traceback
    (["--micro-batches", "3"], "--micro-batches must divide the model's batch (10), got 3"),
    (["--steps", "2"], "--steps must be at least 3, got 2"),
    (["--seed", "-1"], "--seed must be an integer from 0 to 4294967295, got -1"),  # numpy's traceback
    (["--threads", "0"], "--threads must be at least 1, got 0"),  # exit 1, after the first training
    (["--schedule", "bogus"], "schedule 'bogus' is unknown"),  # the same
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),  # a WorkloadError traceback
])
def test_bad_flags_are_one_line_before_any_work(tmp_path, extra, expected):
    from spantrain.experiments.bench_runtime import main

    (tmp_path / "model.json").write_text(json.dumps(MODEL))
    args = ["--json", "--no-track", "--model", str(tmp_path / "model.json"), "--micro-batches", "2", *extra]
    with mock.patch("spantrain.runtime.reference.train_reference", side_effect=AssertionError("trained")):
        code, out, err = _main(main, args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"bench_runtime: error: {expected}"), err


def _main(main, args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()
