"""experiments/calibrate.py: the suite, the steady-state figure, the error and ranking summary,
re-prediction of stored measurements, and (root only) a smoke run of ``--quick`` on the emulator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from spantrain.cluster import Cluster
from spantrain.experiments import calibrate
from spantrain.experiments.calibrate_report import cluster_summary
from spantrain.plan import Plan
from spantrain.runtime.emulator import netns
from spantrain.workload import load_workload

ROOT = Path(__file__).resolve().parents[2]


def test_the_suite_is_diverse_and_every_plan_fits_its_cluster():
    suite = calibrate.load_suite()
    workload = load_workload(suite.model)
    plans = []
    for case in suite.clusters:
        cluster = Cluster.from_file(case.spec)
        for p in case.plans:
            plan = Plan.from_dict(p.plan, p.name)
            plan.validate(cluster, workload)
            plans.append(plan)
    assert len(suite.clusters) >= 3 and len(plans) >= 10
    assert {p.schedule for p in plans} == {"gpipe", "1f1b", "zb-h1", "zb-h2"}
    assert {p.sync.mode for p in plans} == {"allreduce", "hierarchical", "local-sgd"}
    assert {len(p.pipelines) for p in plans} == {1, 2, 3}
    assert {max(len(x.stages) for x in p.pipelines) for p in plans} == {1, 2, 3, 4}
    quick = calibrate.load_suite(quick=True)
    assert len(quick.clusters) == 1 and len(quick.clusters[0].plans) == 2 and quick.repeats == 1


def test_steady_state_leaves_out_warmup_and_averages_local_sgd_periods():
    steps = [5.0, 3.0, 1.0, 2.0, 1.1, 2.2, 0.9, 2.1]
    assert calibrate.steady_step_s(steps, warmup=2) == pytest.approx(1.55)  # median of the last six
    # period 2: windows (1.0, 2.0), (1.1, 2.2), (0.9, 2.1) -> means 1.5, 1.65, 1.5
    assert calibrate.steady_step_s(steps, warmup=2, period=2) == pytest.approx(1.5)
    # warm-up 3 with period 2 starts at the next period boundary (index 4)
    assert calibrate.steady_step_s(steps, warmup=3, period=2) == pytest.approx((1.65 + 1.5) / 2)
    with pytest.raises(ValueError):
        calibrate.steady_step_s(steps[:2], warmup=2)


def test_ranking_compares_samples_per_second_within_five_percent():
    def row(name, batch, pred, meas):
        return {"plan": name, "batch": batch, "predicted_s": pred, "measured_s": meas}

    # b is predicted fastest (32/1.0 > 16/0.6) and measured 3 % behind a: preserved
    ok = cluster_summary([row("a", 16, 0.6, 0.485), row("b", 32, 1.0, 1.0)])
    assert ok["predicted_best"] == "b" and ok["measured_best"] == "a" and ok["preserved"]
    bad = cluster_summary([row("a", 16, 0.6, 0.4), row("b", 32, 1.0, 1.0)])
    assert not bad["preserved"] and bad["gap"] == pytest.approx(0.2)


def _stored_measurements(tmp_path: Path, runs: tuple[float, ...] = (0.5, 0.7)) -> Path:
    """A results file whose 'profile' is the spec itself with the run times made up: exercises the
    re-prediction path and the report, not the cost model's accuracy."""
    spec_path = ROOT / "examples" / "calibration" / "two-region.yaml"
    spec = yaml.safe_load(spec_path.read_text())
    suite = calibrate.load_suite(quick=True)
    plans = [{"name": p.name, "plan": p.plan,
              "runs": [{"step_s": [1.0] * 4, "steady_s": s, "loadavg_before": [0.5, 0, 0]} for s in runs]}
             for p in suite.clusters[0].plans]
    measured = {"model": "tiny-gpt", "cpus": 1.0, "command": "test", "clusters": [
        {"spec": str(spec_path), "spec_data": spec, "profile": {"spec": spec, "document": {}}, "plans": plans}]}
    path = tmp_path / "stored.json"
    path.write_text(json.dumps({"measurements": measured}))
    return path


@pytest.mark.parametrize(("cut", "needle"), [
    (lambda m: m.pop("clusters"), "its measurements have no 'clusters'"),
    (lambda m: m.update(clusters=[]), "its measurements hold no clusters"),
    (lambda m: m["clusters"][0].update(plans=[]), "cluster 0 holds no plans"),
    (lambda m: m["clusters"][0]["plans"][1].update(runs=[]), "cluster 0 plan 1 lacks its name, plan or runs"),
    (lambda m: m["clusters"][0]["plans"][0]["runs"][0].update(steady_s=0),
     "cluster 0 plan 0: a run's steady_s is not a positive number of seconds")])
def test_stored_measurements_missing_what_is_read_are_one_line(tmp_path, capsys, cut, needle):
    # an edited calibration.json (a cluster or run taken out) ended in a KeyError or
    # ZeroDivisionError traceback, exit code 1, after passing the load
    from spantrain.experiments._args import run_script

    stored = _stored_measurements(tmp_path)
    data = json.loads(stored.read_text())
    cut(data["measurements"])
    stored.write_text(json.dumps(data))
    out_dir = tmp_path / "out"
    code = run_script(lambda: calibrate.main(["--measurements", str(stored), "--no-track", "--out", str(out_dir)]),
                      "calibrate")
    err = capsys.readouterr().err
    assert code == 2 and err == f"calibrate: error: --measurements {stored}: {needle}; pass a calibration.json " \
                                "this script wrote\n", err
    assert not out_dir.exists()


def test_one_run_per_plan_reports_no_spread(tmp_path, capsys):
    # --quick runs each plan once: "run spread 0%" and "median run-to-run spread 0%", of nothing
    stored = _stored_measurements(tmp_path, runs=(0.6,))
    assert calibrate.main(["--measurements", str(stored), "--no-track", "--out", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "- (1 run)" in out and "median run-to-run spread - (one run per plan)" in out, out


@pytest.mark.parametrize("as_json", [False, True])
def test_a_tracked_calibration_ends_naming_its_wandb_run(tmp_path, capsys, monkeypatch, as_json, wandb_part):
    # train-policy and run name their W&B run as they end; the experiment scripts did not
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    stored = _stored_measurements(tmp_path)
    json_flag = ["--json"] if as_json else []
    assert calibrate.main(["--measurements", str(stored), "--out", str(tmp_path), *json_flag]) == 0
    out, err = capsys.readouterr()
    (part,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    line = f"W&B run: {part} (offline: `wandb sync {part}` uploads it)"
    if as_json:  # stdout holds the JSON report alone
        assert json.loads(out)["plans"] == 2 and err.splitlines()[-1] == line, err
    else:
        assert out.splitlines()[-1] == line, out
    # named for what it calibrated (W&B made up a name, "dainty-sun-3")
    assert wandb_part(part)["name"] == "calibrate: tiny-gpt", wandb_part(part)


def test_stored_measurements_are_re_predicted_without_running(tmp_path, capsys):
    stored = _stored_measurements(tmp_path)
    assert calibrate.main(["--measurements", str(stored), "--json", "--no-track", "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["clusters"][0]["plans"]
    assert len(rows) == 2 and report["plans"] == 2
    for r in rows:
        assert r["measured_s"] == pytest.approx(0.6)  # median over the two stored runs
        assert r["error"] == pytest.approx((r["predicted_s"] - 0.6) / 0.6)
    assert report["mape"] == pytest.approx(sum(abs(r["error"]) for r in rows) / 2)
    assert report["max_abs_error"] == pytest.approx(max(abs(r["error"]) for r in rows))
    assert (tmp_path / "calibration.png").stat().st_size > 10_000
    assert json.loads((tmp_path / "calibration.json").read_text())["mape"] == pytest.approx(report["mape"])


@pytest.mark.parametrize("extra, expected", [
    (["--measurements", "MISSING"], "--measurements MISSING: No such file or directory"),  # tracebacks, before
    (["--measurements", "TMP"], "--measurements TMP: Is a directory"),
    (["--measurements", "OTHER"], "--measurements OTHER: not a calibration JSON with measurements (KeyError"),
    (["--measurements", "STORED", "--out", "OTHER"], "--out OTHER is a file, not a directory"),
    # found after the whole measurement (about 50 min), with exit code 1
    (["--fit", "no_such_constant"], "--fit takes numeric calibration constants, not no_such_constant"),
    (["--repeats", "0"], "--repeats must be at least 1, got 0"),  # ran the suite's repeats instead
    # each run failed with a ValueError traceback after the whole profiling phase
    (["--steps", "3"], "--steps must be at least 6 (the suite's 3 warm-up iterations, then one steady-state window "
                       "of its longest local-SGD period), got 3"),
    (["--suite", "OTHER"], "--suite OTHER: not a calibration suite (missing 'clusters')"),
    (["--suite", "MISSING"], "--suite MISSING: No such file or directory"),
    # a FIFO waited for a writer forever
    (["--suite", "FIFO"], "--suite FIFO: is a pipe or device, not a regular file; save what it gives to a file"),
    (["--measurements", "FIFO"], "--measurements FIFO: is a pipe or device, not a regular file;"),
    (["--calibration", "MISSING"], "--calibration MISSING: no such file, nor a shipped profile"),  # named no flag
])
@pytest.mark.timeout(120)  # a FIFO read waits forever
def test_bad_flags_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, extra, expected):
    places = {"MISSING": tmp_path / "missing.json", "TMP": tmp_path, "OTHER": tmp_path / "other.json",
              "STORED": _stored_measurements(tmp_path)}
    places["OTHER"].write_text("{}")
    places["FIFO"] = tmp_path / "fifo.yaml"
    os.mkfifo(places["FIFO"])
    monkeypatch.setattr(calibrate, "measure", lambda *a: pytest.fail("measured"))
    args = [str(places.get(x, x)) for x in extra]
    assert calibrate.main([*args, "--json", "--no-track", *([] if "--out" in args else ["--out", str(tmp_path)])]) == 2
    out, err = capsys.readouterr()
    for name, path in places.items():
        expected = expected.replace(name, str(path))
    assert out == "" and err.count("\n") == 1 and err.startswith(f"calibrate: error: {expected}"), err


def test_fitting_a_constant_the_profile_leaves_unset_says_so(tmp_path, capsys, monkeypatch):
    # grad_bytes_per_param unset (None: the model's bytes per element) was refused as "not numeric",
    # naming a problem it does not have
    profile = tmp_path / "profile.yaml"
    profile.write_text("calibration:\n  op_overhead_flops: 4.4e+7\n")
    monkeypatch.setattr(calibrate, "measure", lambda *a: pytest.fail("measured"))
    args = ["--measurements", str(_stored_measurements(tmp_path)), "--calibration", str(profile), "--json",
            "--no-track", "--out", str(tmp_path)]
    assert calibrate.main([*args, "--fit", "grad_bytes_per_param"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"calibrate: error: --fit grad_bytes_per_param: unset in --calibration {profile} "
                                 "(the cost model derives it from the model), so the fit has no value to start from; "
                                 "set grad_bytes_per_param in the profile, then fit\n")
    assert calibrate.main([*args, "--fit", "grad_bytes_per_param,sync_overlap"]) == 2  # the wrong name first
    assert capsys.readouterr().err == "calibrate: error: --fit takes numeric calibration constants, not sync_overlap\n"


_SUITE = {"model": "tiny-gpt", "cpus": 1.0, "steps": 9, "warmup": 3, "repeats": 3,
          "clusters": [{"spec": "two-region.yaml",
                        "plans": {"one": ["1f1b", "allreduce", 1, [[8, 4, [["east-0", 0, 8]]]]]}}],
          "quick": {"cluster": "two-region.yaml", "plans": ["one"], "steps": 4, "warmup": 2, "repeats": 1,
                    "profile_budget_s": 20}}


def test_a_bad_input_leaves_no_empty_out_directory(tmp_path, capsys):
    # --out was made before --measurements or --suite was read
    for args in (["--measurements", str(tmp_path / "missing.json")], ["--suite", str(tmp_path / "missing.yaml")]):
        assert calibrate.main([*args, "--json", "--no-track", "--out", str(tmp_path / "new" / "out")]) == 2
        assert "No such file or directory" in capsys.readouterr().err
        assert not (tmp_path / "new").exists()
    assert calibrate.main(["--measurements", str(tmp_path / "missing.json"), "--no-track", "--out", "/proc/out"]) == 2
    assert capsys.readouterr().err.startswith("calibrate: error: --out /proc/out: cannot write in '/proc' (")


@pytest.mark.parametrize("change, quick, expected", [
    ({"steps": "9"}, False, "steps must be an integer >= 1, got '9'"),
    ({"cpus": 0}, False, "cpus must be a number of cores > 0, got 0"),
    ({"clusters": [{"spec": "a.yaml"}]}, False, "clusters[0] must be a mapping with spec (a file name) and plans"),
    ({"clusters": [{"spec": "a.yaml", "plans": {"p": ["1f1b"]}}]}, False,
     "clusters[0] plan 'p' is not [schedule, sync, period, pipelines]"),
    ({"quick": {"cluster": "nope.yaml"}}, True, "quick: cluster must be the spec of one of clusters, got 'nope.yaml'"),
    ({"quick": {**_SUITE["quick"], "plans": ["two"]}}, True, "quick: plans must be a list of two-region.yaml's plans"),
    ({"quick": {**_SUITE["quick"], "warmup": -1}}, True, "quick: warmup must be an integer >= 0, got -1"),
])
def test_load_suite_names_what_is_wrong_with_a_suite(tmp_path, change, quick, expected):
    # calibrate caught TypeError, AttributeError and StopIteration around load_suite: a bug in it read
    # as "not a calibration suite"; load_suite now checks the file and raises SpantrainError itself
    from spantrain.errors import SpantrainError

    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump({**_SUITE, **change}))
    with pytest.raises(SpantrainError) as e:
        calibrate.load_suite(path, quick=quick)
    assert str(e.value).startswith(f"{path}: not a calibration suite ({expected}"), e.value


def test_fit_recovers_a_known_overhead_and_checks_it_on_held_out_clusters():
    """Measurements made by the cost model itself with a known op overhead: the fit must find it
    (from zero), with no error left on the clusters it did not see."""
    import dataclasses

    from spantrain.env.calibration import Calibration
    from spantrain.experiments.calibrate_fit import cross_validate, fit

    suite = calibrate.load_suite()
    truth = Calibration(sync_overlap=False, op_overhead_flops=5.3e10)  # ~13 ms an op at the specs' 4 TFLOP/s
    clusters = []
    for case in suite.clusters:
        spec = yaml.safe_load(case.spec.read_text())
        plans = [{"name": p.name, "plan": p.plan, "runs": [
            {"steady_s": calibrate.predict(spec, suite.model, p.plan, truth)["iteration_s"]}]} for p in case.plans]
        clusters.append({"spec_data": spec, "profile": {"spec": spec}, "plans": plans})
    measured = {"model": suite.model, "clusters": clusters}
    start = dataclasses.replace(truth, op_overhead_flops=0.0)
    assert calibrate.evaluate(measured, start, with_default=False)["mape"] > 0.02
    cal, mape = fit(measured, start, ["op_overhead_flops"], calibrate.evaluate)
    assert cal.op_overhead_flops == pytest.approx(5.3e10, rel=0.02) and mape < 0.005
    folds = cross_validate(measured, start, ["op_overhead_flops"], calibrate.evaluate)
    assert [f["held_out"] for f in folds] == [c["spec_data"]["name"] for c in clusters]
    assert all(f["mape"] < 0.005 for f in folds)


def test_profiles_combine_by_the_per_device_median_of_compute():
    def spec(east_tflops, block_ms):
        return {"name": "m", "devices": [
            {"id": "east-0", "region": "net-0", "tflops": east_tflops, "memory_gb": 6,
             "layer_times": {"tiny-gpt": {"batch": 4, "forward_ms": [1.0, block_ms], "backward_ms": [2.0, 3.0]}}},
            {"id": "west-0", "region": "net-1", "tflops": 0.005, "memory_gb": 6}],
            "network": {"links": [{"between": ["east-0", "west-0"], "gbps": 0.04}]}}

    combined = calibrate.median_profile([spec(0.010, 15.0), spec(0.012, 12.0), spec(0.009, 20.0)])
    east, west = combined["devices"]
    assert east["tflops"] == 0.010 and west["tflops"] == 0.005
    assert east["layer_times"]["tiny-gpt"] == {"batch": 4, "forward_ms": [1.0, 15.0], "backward_ms": [2.0, 3.0]}
    assert combined["network"] == spec(0, 0)["network"]
    one = spec(0.01, 1.0)
    assert calibrate.median_profile([one]) is one
    # a profile writes a list in seconds where no ms figure reads back: the profiles combine all the same
    in_s = spec(0.012, 12.0)
    in_s["devices"][0]["layer_times"]["tiny-gpt"] = {"batch": 4, "forward_s": [0.001, 0.012],
                                                     "backward_ms": [2.0, 3.0]}
    combined = calibrate.median_profile([spec(0.010, 15.0), in_s, spec(0.009, 20.0)])
    assert combined["devices"][0]["layer_times"]["tiny-gpt"] == {"batch": 4, "forward_ms": [1.0, 15.0],
                                                                 "backward_ms": [2.0, 3.0]}


def test_the_suite_profiles_every_cluster_several_times():
    assert calibrate.load_suite().profiles >= 3
    assert calibrate.load_suite(quick=True).profiles == 1


_REASON = netns.unavailable_reason()


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.skipif(_REASON is not None, reason=f"needs root, ip netns and tc htb: {_REASON}")
def test_quick_calibration_profiles_runs_and_reports(tmp_path):
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "wandb")}
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "calibrate.py"), "--quick", "--json",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    rows = report["clusters"][0]["plans"]
    assert [r["plan"] for r in rows] == ["one-device", "wan-2stage"]
    for r in rows:
        assert 0.05 < r["measured_s"] < 10 and 0.05 < r["predicted_s"] < 10
        assert r["error"] == pytest.approx((r["predicted_s"] - r["measured_s"]) / r["measured_s"])
    assert report["ranking_preserved"] in (True, False) and report["loadavg"]
    stored = json.loads((tmp_path / "calibration-quick.json").read_text())
    prof = stored["measurements"]["clusters"][0]["profile"]["spec"]
    assert {d["id"] for d in prof["devices"]} == {"east-0", "east-1", "west-0", "west-1"}
    assert all("layer_times" in d for d in prof["devices"])
    assert len(stored["measurements"]["clusters"][0]["profile"]["profiles"]) == 1
    assert (tmp_path / "calibration-quick.png").exists()
    assert list((tmp_path / "wandb").rglob("*.wandb")), "no offline W&B run was written"


@pytest.mark.parametrize("module", ["calibrate_fit", "calibrate_report"])
def test_its_helper_modules_run_as_scripts_point_to_calibrate(module):
    import subprocess
    import sys
    from pathlib import Path

    script = Path(calibrate.__file__).with_name(f"{module}.py")
    proc = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""  # printed nothing and exited 0
    assert proc.stderr == (f"{module}: error: a module of experiments/calibrate.py, not a script: run python "
                           "experiments/calibrate.py --help\n")
