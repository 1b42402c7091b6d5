"""The tracked experiment scripts refuse a W&B setting wandb would refuse before their work, not
after it (W&B starts as they end: 50 min into calibrate, 6 min into bench_planners)."""

from __future__ import annotations

import pytest

from spantrain.experiments import bench_planners, bench_runtime, calibrate


@pytest.mark.parametrize("script, args", [
    (bench_planners, ["--quick", "--no-progress"]),
    (bench_runtime, ["--steps", "3", "--repeats", "1"]),
    (calibrate, ["--quick"]),
], ids=["bench_planners", "bench_runtime", "calibrate"])
def test_a_refused_wandb_setting_stops_the_script_before_its_work(script, args, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "bogus")
    out = tmp_path / "out"
    extra = [] if script is bench_runtime else ["--out", str(out)]
    assert script.main([*args, *extra]) == 2
    name = script.__name__.rsplit(".", 1)[-1]
    assert capsys.readouterr().err.strip() == (f"{name}: error: WANDB_MODE=bogus is not a W&B mode: set it to "
                                               "online, offline or disabled, or unset it")
    assert not out.exists()
