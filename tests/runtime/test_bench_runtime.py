"""The runtime benchmark runs its configurations and they train the same model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import MODEL

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_runtime_reports_every_configuration(tmp_path):
    (tmp_path / "model.json").write_text(json.dumps(MODEL))  # tiny-gpt's figures are for the report, not tests
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_runtime.py"), "--json", "--steps", "3",
                           "--repeats", "1", "--micro-batches", "2", "--model", str(tmp_path / "model.json"),
                           "--no-track"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = {r["config"]: r for r in out["rows"]}
    assert list(rows) == ["single", "1x1", "1x1-mb", "1x2"]
    assert rows["single"]["overhead_pct"] == 0.0 and rows["1x2"]["processes"] == 2
    assert all(r["step_s"] > 0 and r["samples_per_s"] == pytest.approx(out["batch"] / r["step_s"])
               for r in rows.values())
    # same seed, same samples, same model: every path starts from the same loss
    assert rows["1x1"]["loss_first"] == pytest.approx(rows["single"]["loss_first"], rel=1e-5)
    for name in ("1x1-mb", "1x2"):
        assert rows[name]["loss_first"] == pytest.approx(rows["single"]["loss_first"], rel=1e-5)
    assert all(r["cpu_s"] > 0 for r in rows.values())
