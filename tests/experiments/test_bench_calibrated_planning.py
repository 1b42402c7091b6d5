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


def test_the_same_plan_under_both_constants_is_counted_as_the_same():
    # each plan carries the prediction it was made with, which differs between the constants:
    # compared whole, no two plans were ever the same ("the same plan on 0 of them")
    from spantrain.cluster import Cluster
    from spantrain.env.calibration import EMULATED_CPU, Calibration
    from spantrain.workload import Workload

    cluster = Cluster.from_file(bench.ROOT / "examples" / "calibration" / "three-site.yaml")
    row = bench.compare_case(cluster, Workload.from_preset("gpt2-medium"), Calibration.from_file(EMULATED_CPU))
    assert row["gain"] == 1.0 and row["same_plan"]


def test_scripts_say_bad_input_and_ctrl_c_in_one_line(capsys):
    from spantrain.experiments._args import run_script

    # a bad --calibration was a SpecError traceback with exit code 1
    assert run_script(lambda: bench.main(["--calibration", "/nonexistent.yaml"]), "bench_calibrated_planning") == 2
    assert capsys.readouterr().err == (
        "bench_calibrated_planning: error: --calibration /nonexistent.yaml: no such file, nor a shipped profile "
        "(emulated-cpu)\n")

    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_script(interrupted, "bench_runtime") == 130  # was a KeyboardInterrupt traceback
    assert capsys.readouterr().err == "bench_runtime: interrupted\n"


def test_sigterm_to_a_script_unwinds_like_ctrl_c(tmp_path):
    import signal
    import subprocess
    import sys

    # a script that holds a temporary directory, as bench_runtime does; SIGTERM left it behind
    code = ("import sys, tempfile, time\n"
            "from spantrain.experiments._args import run_script\n"
            "def main():\n"
            "    with tempfile.TemporaryDirectory(dir=sys.argv[1]):\n"
            "        print('ready', flush=True)\n"
            "        time.sleep(60)\n"
            "    return 0\n"
            "raise SystemExit(run_script(main, 'bench_x'))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and err == "bench_x: interrupted by SIGTERM\n", err
    assert list(tmp_path.iterdir()) == []
