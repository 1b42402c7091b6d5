"""Smoke run of experiments/bench_deep_planning.py: each plan in a process of its own."""

from __future__ import annotations

import json

from spantrain.experiments import bench_deep_planning as bench


def test_plans_a_deep_model_coarse_and_exact_and_prints_both(capsys):
    assert bench.main(["--layers", "600", "--exact-up-to", "600", "--clusters", "cee-16", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["cluster"] == "cee-16" and row["layers"] == 600
    for mode in ("coarse", "exact"):
        assert row[mode]["plan_s"] > 0 and row[mode]["peak_mb"] > 0 and row[mode]["iteration_s"] > 0
    assert row["ratio"] == row["coarse"]["iteration_s"] / row["exact"]["iteration_s"] <= 1.01


def test_a_depth_out_of_range_is_one_line(capsys):
    from spantrain.experiments._args import run_script

    assert run_script(lambda: bench.main(["--layers", "5000"]), "bench_deep_planning") == 2
    assert capsys.readouterr().err == "bench_deep_planning: error: --layers must be in 3-4096\n"
