"""A run's predicted s/iteration: which constants, which value, when it is comparable, how it is told."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_helpers import ASYMMETRIC, CLUSTER, MODEL, plan

from spantrain.cluster import Cluster
from spantrain.env.calibration import EMULATED_CPU, Calibration
from spantrain.env.costmodel import estimate
from spantrain.plan import Plan
from spantrain.runtime.prediction import (
    calibration_name,
    comparable,
    default_calibration,
    predicted_step_s,
    profiled,
)
from spantrain.workload import Workload

ROOT = Path(__file__).resolve().parents[2]


def _inputs(layer_times: bool = False) -> tuple[Cluster, Workload, Plan]:
    workload = Workload.from_spec(MODEL, "model")
    spec = {**CLUSTER, "devices": [dict(d) for d in CLUSTER["devices"]]}
    if layer_times:  # as `spantrain profile` writes them
        for d in spec["devices"]:
            n = workload.num_layers
            d["layer_times"] = {MODEL["name"]: {"batch": 1, "forward_ms": [2.0] * n, "backward_ms": [4.0] * n}}
    return Cluster.from_spec(spec, "cluster"), workload, Plan.from_dict(plan("1f1b", "allreduce", ASYMMETRIC))


def test_emulated_runs_default_to_the_profile_fitted_to_the_runtime():
    shipped = default_calibration(emulated=True)
    # the documented path is a link to the packaged profile, so the two cannot drift apart
    assert shipped == Calibration.from_file(ROOT / "examples" / "calibration" / "emulated-cpu.yaml")
    assert shipped.sync_overlap is False and shipped.op_overhead_flops > 0  # the runtime's way, fitted
    assert default_calibration(emulated=False) is None  # a real cluster: the built-in constants
    assert calibration_name(None, emulated=True) == EMULATED_CPU.name == "emulated-cpu.yaml"
    assert calibration_name(None, emulated=False) == "built-in constants"


def test_the_prediction_is_the_cost_models_estimate_with_the_runs_constants(tmp_path):
    cluster, workload, p = _inputs()
    mine = tmp_path / "mine.yaml"
    mine.write_text("op_overhead_s: 0.25\n")
    cal = Calibration.from_file(mine)
    assert calibration_name(str(mine), emulated=True) == "mine.yaml"  # a file given wins over the default
    assert predicted_step_s(cluster, workload, p, cal) == pytest.approx(estimate(cluster, workload, p, cal).iteration_s)
    # the fixed 0.25 s per op is in it: 1f1b, 4 micro-batches, forward and backward on each of 2 stages
    assert predicted_step_s(cluster, workload, p, cal) > predicted_step_s(cluster, workload, p, None) + 8 * 0.25


def test_an_emulated_run_is_comparable_only_on_measured_compute():
    cluster, workload, p = _inputs()
    # the emulator gives each device a share of this machine's cores, not the spec's TFLOP/s
    assert not comparable(cluster, workload, p, where="emulated")
    assert comparable(cluster, workload, p, where="torchrun")
    assert not comparable(cluster, workload, p, where="local")  # workers share one machine
    measured, workload, p = _inputs(layer_times=True)
    assert comparable(measured, workload, p, where="emulated")
    # the drift watch also holds a slow start against the prediction only on measured compute,
    # under torchrun too: a spec's TFLOP/s are peaks, and its runs would all look slow
    assert profiled(measured, workload, p) and not profiled(cluster, workload, p)
    assert not comparable(measured, Workload.from_spec({**MODEL, "name": "other"}, "model"), p, where="emulated")


def test_the_report_sets_the_prediction_beside_the_measured_time(capsys):
    from spantrain.cli.run import _report

    result = {"start_step": 0, "final_step": 5, "target_steps": 5, "stopped_early": False, "loss_first": 5.0,
              "loss_last": 4.0, "samples_per_s": 10.0, "step_s": 0.55, "losses": [5.0, 4.0], "metrics": "m.jsonl",
              "predicted_step_s": 0.5, "prediction_calibration": "emulated-cpu.yaml", "prediction_comparable": True}
    _report(result, as_json=False)
    out = capsys.readouterr().out
    assert "predicted by the cost model (emulated-cpu.yaml): 0.500 s/iteration, measured 10% slower" in out
    _report({**result, "step_s": 0.4}, as_json=False)
    assert "0.500 s/iteration, measured 20% faster" in capsys.readouterr().out
    # under torchrun on devices the spec does not describe (an A100 spec, a CPU run): not "0.000 s/iteration,
    # measured 566166% slower"
    _report({**result, "predicted_step_s": 7.4e-05, "step_s": 0.42}, as_json=False)
    assert ("7.4e-05 s/iteration, measured 5,676x slower: the cluster spec does not describe the devices this ran "
            "on (`spantrain profile` measures them)") in capsys.readouterr().out
    _report({**result, "prediction_comparable": False}, as_json=False)
    assert "predicted" not in capsys.readouterr().out  # a figure of another machine would mislead
    segments = [{"start_step": 0, "final_step": 3, "plan": plan("1f1b", "allreduce", ASYMMETRIC), "step_s": 0.5,
                 "predicted_step_s": 0.5},
                {"start_step": 3, "final_step": 5, "plan": plan("1f1b", "allreduce", ASYMMETRIC), "step_s": 0.6,
                 "predicted_step_s": 0.3}]
    _report({**result, "segments": segments}, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("s/iteration", 1)[1] for line in lines if line.startswith("plan ")] == [
        " (predicted 0.500 s/iteration, measured as predicted)", " (predicted 0.300 s/iteration, measured 100% slower)"]


def test_a_run_under_spantrain_emulate_counts_as_emulated(monkeypatch):
    from spantrain.cli.run import run_where
    from spantrain.runtime.emulator.latency import ENV_VAR

    monkeypatch.delenv(ENV_VAR, raising=False)
    assert [run_where(False, False), run_where(False, True), run_where(True, False)] == ["local", "torchrun",
                                                                                        "emulated"]
    # `spantrain emulate -- spantrain run` sets torchrun's variables on emulated devices: its comparison
    # with the spec's TFLOP/s read "measured 948% slower", with the built-in constants
    monkeypatch.setenv(ENV_VAR, "/run/spantrain-emulator/x/emulation.json")
    assert run_where(False, True) == "emulated"


def test_the_memory_check_before_launch_uses_the_runs_calibration():
    from spantrain.runtime.preflight import check_memory

    _, workload, p = _inputs()
    tight = Cluster.from_spec({**CLUSTER, "devices": [{**d, "memory_gb": 5e-4} for d in CLUSTER["devices"]]}, "c")
    assert "does not fit" in check_memory(tight, workload, p, on_this_machine=False)
    # the same plan under constants that say its training state takes almost no bytes: it fits
    # (it had been chosen with them, and was then said not to fit, "`spantrain plan` finds one that fits")
    small = Calibration(state_bytes_per_param=1e-4, optimizer_bytes_per_param=1e-4)
    assert check_memory(tight, workload, p, on_this_machine=False, calibration=small) is None


@pytest.mark.parametrize(("emulate", "profiled", "holds"), [(True, True, True), (True, False, False),
                                                            (False, True, False)])
def test_the_run_tells_its_workers_whether_the_prediction_holds(tmp_path, monkeypatch, emulate, profiled, holds):
    import json

    from runtime_helpers import spantrain_here

    from spantrain.runtime import launcher

    seen = {}

    def capture(cfg, **kwargs):
        seen["holds"] = cfg.prediction_comparable
        raise KeyboardInterrupt  # enough: the run's configuration is made

    monkeypatch.setattr(launcher, "launch_emulated" if emulate else "launch_local", capture)
    cluster, _, _ = _inputs(layer_times=profiled)
    paths = {name: tmp_path / f"{name}.json" for name in ("cluster", "model", "plan")}
    paths["cluster"].write_text(json.dumps(cluster.to_spec()))
    paths["model"].write_text(json.dumps(MODEL))
    paths["plan"].write_text(json.dumps(plan("1f1b", "allreduce", ASYMMETRIC)))
    code, _, err = spantrain_here("run", "--cluster", str(paths["cluster"]), "--model", str(paths["model"]), "--plan",
                                  str(paths["plan"]), "--steps", "1", "--run-dir", str(tmp_path / "run"),
                                  *(["--emulate"] if emulate else []))
    # the drift watch measures a plan slow from the start against the prediction only where it holds
    assert code == 130 and seen["holds"] is holds, err


def test_the_report_says_a_plan_stopped_mid_iteration_was_rolled_back(capsys):
    # a switch whose workers could not finish their iteration: "plan 1: iterations 0..0 ... n/a s/iteration"
    from spantrain.cli.run import _report

    seg = {"start_step": 0, "final_step": 0, "plan": plan("1f1b", "allreduce", ASYMMETRIC), "step_s": None,
           "predicted_step_s": 0.5}
    result = {"start_step": 0, "final_step": 6, "target_steps": 6, "stopped_early": False, "loss_first": 5.0,
              "loss_last": 4.0, "samples_per_s": 10.0, "step_s": 0.5, "metrics": "m.jsonl",
              "segments": [seg, {**seg, "final_step": 6, "step_s": 0.5}]}
    _report(result, as_json=False)
    out = capsys.readouterr().out
    assert "plan 1: on 4 device(s)" in out and ("stopped before it finished its iteration: the next plan went on "
                                                "from iteration 0, the last checkpoint (or the start)") in out, out
    assert "n/a s/iteration" not in out and "plan 2: iterations 0..6 on 4 device(s)" in out
