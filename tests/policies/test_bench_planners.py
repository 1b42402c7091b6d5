"""experiments/bench_planners.py: the summary arithmetic, and a --quick smoke run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spantrain.experiments import bench_planners as bench

ROOT = Path(__file__).resolve().parents[2]


def _row(profile, sps, feasible=None):
    feasible = feasible or {}
    return {"profile": profile, "devices": 8, "seed": 0, "model": "m", "ga_budget_s": 1.0,
            "planners": {n: {"samples_per_s": v, "feasible": feasible.get(n, v > 0), "iteration_s": 1.0,
                             "plan_s": 0.1, "cpu_s": 0.1, "reason": ""} for n, v in sps.items()}}


def test_summary_arithmetic():
    suite = [
        _row("cee", {"heuristic": 40.0, "ga": 20.0, "ddp": 1.0, "gpipe": 10.0, "megatron": 0.0}),
        _row("cee", {"heuristic": 90.0, "ga": 90.0, "ddp": 30.0, "gpipe": 0.0, "megatron": 0.0}),
        _row("geo", {"heuristic": 9.7, "ga": 9.0, "ddp": 10.0, "gpipe": 1.0, "megatron": 2.0}),
        _row("datacenter", {"heuristic": 5.0, "ga": 5.0, "ddp": 0.0, "gpipe": 0.0, "megatron": 0.0}),
    ]
    small = [{"profile": "cee", "devices": 6, "seed": 0, "model": "m",
              "planners": {"heuristic": {"samples_per_s": 97.0, "feasible": True, "plan_s": 0.1},
                           "exhaustive": {"samples_per_s": 100.0, "feasible": True, "plan_s": 2.0}}},
             {"profile": "geo", "devices": 6, "seed": 0, "model": "m",
              "planners": {"heuristic": {"samples_per_s": 50.0, "feasible": True, "plan_s": 0.1},
                           "exhaustive": {"samples_per_s": 50.0, "feasible": True, "plan_s": 1.0}}}]
    scaling = [{"profile": "cee", "devices": 64, "model": "m", "plan_s": 1.5, "cpu_s": 1.2},
               {"profile": "geo", "devices": 64, "model": "m", "plan_s": 0.5, "cpu_s": 0.4}]
    slow = [{"cluster": "2xA100 0.5 Gbit/s", "model": "m",
             "planners": {"heuristic": {"samples_per_s": 50.0, "feasible": True},
                          "exhaustive": {"samples_per_s": 60.0, "feasible": True}}},
            {"cluster": "cee-6-s0 x0.1", "model": "m",
             "planners": {"heuristic": {"samples_per_s": 7.0, "feasible": True},
                          "exhaustive": {"samples_per_s": 7.0, "feasible": True}}},
            {"cluster": "geo-6-s0 x0.1", "model": "m",
             "planners": {"heuristic": {"samples_per_s": 0.0, "feasible": False},
                          "exhaustive": {"samples_per_s": 0.0, "feasible": False}}}]
    far = [{"cluster": "geo-7-s1 LAN latency x200", "model": "m",
            "planners": {"heuristic": {"samples_per_s": 0.0, "feasible": False},
                         "exhaustive": {"samples_per_s": 5.0, "feasible": True}}}]
    s = bench.summarize({"suite": suite, "small": small, "scaling": scaling, "slow": slow, "far": far})
    assert s["slow_cases"] == 3 and s["slow_cases_exhaustive_feasible"] == 2 and s["slow_within_3pct"] == 1
    assert s["slow_max_gap"] == pytest.approx(0.2) and s["slow_max_gap_case"] == "2xA100 0.5 Gbit/s m"
    assert s["far_cases"] == 1 and s["far_within_3pct"] == 0 and s["far_max_gap"] == math.inf
    older = bench.summarize({"suite": suite, "small": small, "scaling": scaling})  # files before these parts
    assert older["slow_cases"] == 0 and older["far_cases"] == 0
    assert s["speedup_vs_best_baseline"]["heuristic"]["cee"] == pytest.approx((4.0 * 3.0) ** 0.5)
    assert s["speedup_vs_best_baseline"]["heuristic"]["geo"] == pytest.approx(0.97)
    assert s["speedup_vs_best_baseline"]["heuristic"]["datacenter"] is None  # no feasible baseline
    assert s["cases_without_feasible_baseline"] == 1
    assert s["heuristic_worst_vs_best_baseline"] == pytest.approx(0.97)
    assert s["heuristic_below_baseline_by_2pct"] == 1
    assert s["best_count"] == {"heuristic": 3, "ga": 2, "ddp": 1, "gpipe": 0, "megatron": 0}
    assert s["heuristic_at_least_ga"] == 4
    assert s["small_within_3pct"] == 1  # 100/97 - 1 = 3.09 % misses; the tie counts
    assert s["small_max_gap"] == pytest.approx(100 / 97 - 1)
    assert s["scaling"]["64"] == {"max_wall_s": 1.5, "max_cpu_s": 1.2, "cases": 2}
    assert s["scaling"]["8"]["cases"] == 4  # the suite's cases count too
    table = bench.markdown(s, bench.full_spec())
    assert "| heuristic | 3.46x | 0.97x | - |" in table
    assert "| within 3 % of exhaustive on slow-network small clusters | 1/2; max gap 20.00% (2xA100 0.5 Gbit/s m) |" \
        in table
    assert ("| within 3 % of exhaustive on high-latency small clusters | 0/1; max gap inf% "
            "(geo-7-s1 LAN latency x200 m) |") in table


@pytest.mark.parametrize("content, error", [
    (None, "FILE: file not found"),
    ("DIR", "FILE is a directory: pass a bench_planners.json file"),
    ("", "FILE: not JSON (Expecting value: line 1 column 1 (char 0))"),
    ("{", "FILE: not JSON (Expecting property name"),
    (b"\x00\xff\xfe", "FILE: not JSON ('utf-8' codec can't decode byte 0xff"),
    ("{}", "FILE: not a bench_planners.json (KeyError: 'spec'); pass a file this script wrote"),
    ("[1]", "FILE: not a bench_planners.json (TypeError: "),
    ('{"spec": {"bogus": 1}, "results": {}, "summary": {}}', "FILE: not a bench_planners.json (TypeError: "),
])
def test_bad_from_json_is_a_one_line_error(tmp_path, capsys, content, error):
    saved = tmp_path / "saved.json"
    if content == "DIR":
        saved.mkdir()
    elif isinstance(content, bytes):
        saved.write_bytes(content)
    elif content is not None:
        saved.write_text(content)
    assert bench.main(["--from-json", str(saved), "--out", str(tmp_path / "out"), "--no-track"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bench_planners: error: --from-json {error.replace('FILE', str(saved))}"), err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    out = tmp_path / "results"
    out.write_text("x")
    assert bench.main(["--quick", "--out", str(out), "--no-track"]) == 2
    assert capsys.readouterr().err == f"bench_planners: error: --out {out} is a file, not a directory: pass a " \
                                      "directory\n"


def test_out_that_cannot_be_made_says_so_and_what_to_do(capsys):
    # was "--out /proc/x: No such file or directory"
    assert bench.main(["--quick", "--out", "/proc/spantrain-nope", "--no-track"]) == 2
    assert capsys.readouterr().err == ("bench_planners: error: --out /proc/spantrain-nope: cannot create it (No such "
                                       "file or directory); pass a directory this user can write\n")


def test_a_zero_gap_names_no_case_and_reads_back_the_same():
    """Exhaustive ties the heuristic on every slow case up to float noise: no case is the worst,
    and the saved file's rounded figures (all exact ties) give the same table line."""
    def case(name, h, x):
        return {"cluster": name, "model": "m", "planners": {"heuristic": {"samples_per_s": h, "feasible": True},
                                                             "exhaustive": {"samples_per_s": x, "feasible": True}}}
    live = [case("4xA100 0.1 Gbit/s", 14.207, 14.207 * (1 + 4.4e-16)), case("geo-6-s3 x0.1", 2.2859, 2.2859)]
    saved = [case(c["cluster"], round(c["planners"]["heuristic"]["samples_per_s"], 4),
                  round(c["planners"]["exhaustive"]["samples_per_s"], 4)) for c in live]
    spec, results, _ = bench.load_saved(str(ROOT / "experiments" / "results" / "bench_planners.json"))
    lines = []
    for slow in (live, saved):
        s = bench.summarize({**results, "slow": slow})
        assert s["slow_max_gap"] < 1e-9 and s["slow_max_gap_case"] is None
        lines += [line for line in bench.markdown(s, spec).splitlines() if "slow-network" in line]
    assert lines[0] == lines[1] == "| within 3 % of exhaustive on slow-network small clusters | 2/2; max gap 0.00% |"


def test_from_json_reads_back_the_saved_results():
    spec, results, summary = bench.load_saved(str(ROOT / "experiments" / "results" / "bench_planners.json"))
    assert summary["cases"] == len(results["suite"]) > 0 and spec.suite_sizes


@pytest.mark.slow
def test_quick_run_writes_results_and_logs(tmp_path, wandb_part):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench_planners.py"), "--quick", "--json",
                           "--out", str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    obj = json.loads(proc.stdout)
    s = obj["summary"]
    assert s["cases"] == 3 and s["small_cases"] == 3 and set(s["scaling"]) == {"8", "16"}
    assert s["slow_cases"] == 5 and s["slow_within_3pct"] == s["slow_cases_exhaustive_feasible"] > 0
    assert s["far_cases"] == 3 and s["far_within_3pct"] == s["far_cases_exhaustive_feasible"] > 0
    assert s["small_exhaustive_beaten"] == 0
    assert s["heuristic_feasible"] == 3
    assert "planner bench" in proc.stderr  # the progress bar
    for name in ("bench_planners.md", "bench_planners.json", "planners_speedup.png", "planners_exhaustive_gap.png",
                 "planners_scaling.png"):
        assert (out / name).stat().st_size > 500, name
    assert "| heuristic |" in (out / "bench_planners.md").read_text()
    assert obj["wandb"] and any(tmp_path.rglob("*.wandb"))
    # and it ends naming that run, as train-policy and run do (stderr: stdout holds the JSON alone)
    assert proc.stderr.splitlines()[-1] == f"W&B run: {obj['wandb']} (offline: `wandb sync {obj['wandb']}` uploads it)"
    assert wandb_part(obj["wandb"])["name"] == "bench_planners (quick)"  # W&B's made-up name, before
