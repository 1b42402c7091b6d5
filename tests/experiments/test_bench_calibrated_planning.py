"""Smoke run of experiments/bench_calibrated_planning.py: its figures are the cost model's, in seconds."""

from __future__ import annotations

import json

from spantrain.experiments import bench_calibrated_planning as bench


def test_prints_every_case_and_the_gain_of_planning_for_the_runtime(capsys):
    assert bench.main(["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {(r["cluster"], r["model"]): r for r in out["rows"]}
    assert len(rows) == out["summary"]["cases"] == 2 * len(bench.cases()) == 18
    # the README's measured case: the built-in constants' plan is far slower on the emulated runtime
    assert rows["two-region", "tiny-gpt"]["gain"] > 1.3 and not rows["two-region", "tiny-gpt"]["same_plan"]
    assert out["summary"]["min_gain"] <= out["summary"]["median_gain"] <= out["summary"]["max_gain"]
    assert all(r["gain"] == r["builtin_plan_s"] / r["calibrated_plan_s"] for r in out["rows"])


def test_scripts_say_bad_input_and_ctrl_c_in_one_line(capsys):
    from spantrain.experiments._args import run_script

    # a bad --calibration was a SpecError traceback with exit code 1
    assert run_script(lambda: bench.main(["--calibration", "/nonexistent.yaml"]), "bench_calibrated_planning") == 2
    assert capsys.readouterr().err == "bench_calibrated_planning: error: /nonexistent.yaml: file not found\n"

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_script(interrupted, "bench_runtime") == 130  # was a KeyboardInterrupt traceback
    assert capsys.readouterr().err == "bench_runtime: interrupted\n"
