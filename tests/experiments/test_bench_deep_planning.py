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


def test_a_plan_over_the_timeout_is_a_row_not_a_traceback(capsys):
    # a plan slower than --timeout ended the whole run in subprocess.TimeoutExpired's traceback;
    # 1 ms is less than the child's interpreter takes to start
    assert bench.main(["--layers", "8", "--exact-up-to", "8", "--clusters", "cee-16", "--timeout", "0.001",
                       "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["coarse"] == row["exact"] == {"timed_out_s": 0.001} and "ratio" not in row
    assert bench.main(["--layers", "8", "--exact-up-to", "8", "--clusters", "cee-16", "--timeout", "0.001"]) == 0
    assert capsys.readouterr().out == ("cee-16             8 layers: coarse over 0.001 s (--timeout); "
                                       "exact over 0.001 s (--timeout)\n")


def test_a_timeout_of_zero_is_one_line(capsys):
    from spantrain.experiments._args import run_script

    assert run_script(lambda: bench.main(["--layers", "8", "--timeout", "0"]), "bench_deep_planning") == 2
    assert capsys.readouterr().err == ("bench_deep_planning: error: --timeout must be a number of seconds above 0, "
                                       "got 0\n")


def test_a_failed_child_is_one_line_naming_its_error(capsys, monkeypatch):
    import subprocess

    from spantrain.experiments._args import run_script

    failed = subprocess.CompletedProcess([], 1, "", "Traceback (most recent call last):\n  ...\nMemoryError: out\n")
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: failed)
    assert run_script(lambda: bench.main(["--layers", "8", "--clusters", "cee-16"]), "bench_deep_planning") == 2
    # a RuntimeError traceback around the child's, before
    assert capsys.readouterr().err == ("bench_deep_planning: error: planning cee-16 at 8 layers failed (exit 1): "
                                       "MemoryError: out\n")
