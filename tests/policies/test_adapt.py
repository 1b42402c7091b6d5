"""Adapting a running plan to a changed cluster (`spantrain.policies.adapt`, `plan --from`)."""

from __future__ import annotations

import json

import pytest
import yaml
from policy_helpers import region_cluster

from spantrain.errors import PlanError
from spantrain.plan import Plan
from spantrain.policies.adapt import adapt_plan, candidate_from_plan
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.workload import Workload

W = Workload.from_preset("gpt2-medium")


def _clusters(west_lan_gbps: float = 100.0, west_count: int = 4):
    """Two regions of four A100s joined by 100 Mbit/s; the change slows the west LAN
    (which the running plan, one pipeline through west-0..3, uses for every activation)."""
    before = region_cluster({"west": (4, 140, 40, 100), "east": (4, 140, 40, 100)}, 0.1, name="before")
    after = region_cluster({"west": (west_count, 140, 40, west_lan_gbps), "east": (4, 140, 40, 100)}, 0.1,
                           name="after")
    return before, after


@pytest.fixture(scope="module")
def running() -> Plan:
    before, _ = _clusters()
    plan = HeuristicPlanner().plan(before, W)
    assert plan.devices == ["west-0", "west-1", "west-2", "west-3"]  # what the scenarios below rely on
    return plan


def test_candidate_from_plan_scores_the_plan_as_written(running):
    from spantrain.env.costmodel import CostModel
    from spantrain.env.evaluator import Evaluator

    _, after = _clusters(0.5)
    cand = candidate_from_plan(Evaluator(after, W), running)
    assert cand.time == pytest.approx(CostModel(after, W, memo=False).estimate(running).iteration_s, rel=1e-12)


def test_unchanged_cluster_keeps_the_running_plan(running):
    before, _ = _clusters()
    a = adapt_plan(before, W, running, remaining_steps=500)
    assert a.chosen == "keep" and not a.switch and not a.missing
    assert [o.name for o in a.options] == ["keep", "ppo", "heuristic"]
    assert a.plan.to_dict()["pipelines"] == running.to_dict()["pipelines"]
    assert a.option("keep").migration_s == 0.0


def test_switch_only_when_the_remaining_steps_pay_for_the_migration(running):
    _, after = _clusters(0.5)
    long = adapt_plan(after, W, running, remaining_steps=5000, planner="heuristic")
    keep, new = long.option("keep"), long.option("heuristic")
    # the slowed LAN makes the running pipeline ~8x slower; moving east pays in ~90 iterations
    assert new.iteration_s < keep.iteration_s / 4 and new.migration_s > 10
    assert long.chosen == "heuristic" and long.switch
    assert new.total_s == pytest.approx(5000 * new.iteration_s + new.migration_s)
    long.plan.validate(after, W)
    assert long.plan.predicted["iteration_s"] == pytest.approx(new.iteration_s)
    short = adapt_plan(after, W, running, remaining_steps=10, planner="heuristic")
    assert short.chosen == "keep" and short.plan.devices == running.devices
    assert short.plan.predicted["iteration_s"] == pytest.approx(keep.iteration_s)


def test_departed_device_plans_afresh(running):
    _, after = _clusters(west_count=3)
    a = adapt_plan(after, W, running, remaining_steps=500)
    assert a.missing == ("west-3",) and a.switch
    assert "keep" not in [o.name for o in a.options]
    a.plan.validate(after, W)
    (fresh,) = a.options  # the remaining steps' time, as every other option's (it was one iteration's)
    assert fresh.total_s == pytest.approx(500 * fresh.iteration_s)


@pytest.mark.parametrize("planner", ["auto", "ppo", "heuristic"])
def test_a_running_plan_that_no_longer_fits_memory_is_replanned(running, planner):
    # the case adapting is for: the policy's start had no throughput, and its log-ratio divided by zero
    # (plan --from and a running --adapt job ended in a ZeroDivisionError traceback)
    shrunk = region_cluster({"west": (4, 140, 1, 100), "east": (4, 140, 40, 100)}, 0.1, name="shrunk")
    a = adapt_plan(shrunk, W, running, remaining_steps=500, planner=planner)
    assert a.switch and a.option("keep").iteration_s == float("inf")
    assert "ppo" not in [o.name for o in a.options] or planner == "ppo"  # no policy move from a plan that cannot run
    a.plan.validate(shrunk, W)
    from spantrain.env.costmodel import estimate

    assert estimate(shrunk, W, a.plan).feasible


def test_running_plan_that_does_not_match_the_workload(running):
    _, after = _clusters()
    with pytest.raises(PlanError, match="goes past the model's 14 layers"):
        adapt_plan(after, Workload.from_preset("gpt2-small"), running)
    with pytest.raises(PlanError, match="pass --global-batch 64"):
        adapt_plan(after, W.with_global_batch(32), running)
    with pytest.raises(PlanError, match="remaining steps must be a positive integer"):
        adapt_plan(after, W, running, remaining_steps=0)
    # an invalid micro-batch is named, with no batch to pass (a string one was a TypeError traceback,
    # a negative one suggested "--global-batch -8")
    for bad in ("8", -2, None):
        broken = Plan.from_dict({**running.to_dict(), "pipelines": [{**running.to_dict()["pipelines"][0],
                                                                      "micro_batch_size": bad}]})
        with pytest.raises(PlanError, match="micro_batch_size must be a positive integer") as e:
            adapt_plan(after, W, broken)
        assert "--global-batch" not in str(e.value)


def _spec_file(tmp_path, cluster, name):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cluster.to_spec()))
    return path


def test_plan_from_cli(run_cli, tmp_path, running, monkeypatch):
    from spantrain.policies import ppo

    loads = []
    real_load = ppo.load_policy
    monkeypatch.setattr(ppo, "load_policy", lambda *a, **kw: loads.append(1) or real_load(*a, **kw))
    _, after = _clusters(0.5)
    plan_file = tmp_path / "running.json"
    running.save(plan_file)
    spec = _spec_file(tmp_path, after, "after.yaml")
    out_file = tmp_path / "next.json"
    code, out, err = run_cli("plan", "-c", spec, "-m", "gpt2-medium", "--from", plan_file,
                             "--remaining-steps", "5000", "--json", "-o", out_file)
    assert code == 0, err
    obj = json.loads(out)
    assert obj["adaptation"]["switch"] is True and obj["adaptation"]["remaining_steps"] == 5000
    assert obj["load_s"] > 0  # loading the policy is timed apart from planning, as plain plan does (was 0.0)
    assert len(loads) == 1  # and done once: the adaptation plans with the planner that loaded it
    assert {o["name"] for o in obj["adaptation"]["options"]} == {"keep", "ppo", "heuristic"}
    assert Plan.from_file(out_file).to_dict()["pipelines"] == obj["plan"]["pipelines"]
    code, out, err = run_cli("plan", "-c", spec, "-m", "gpt2-medium", "--from", plan_file, "--remaining-steps", "10")
    assert code == 0, err
    assert "keep the running plan" in out and "10 iterations to go" in out
    code, out, err = run_cli("plan", "-c", spec, "-m", "gpt2-medium", "--from", plan_file,
                             "--remaining-steps", "500000")
    assert code == 0, err
    (decision,) = [line for line in out.splitlines() if line.startswith("decision ")]
    assert decision.endswith(" s sooner, migration included") and "e+" not in decision  # was "3.347e+04 s"


@pytest.mark.parametrize("args, needle", [
    (["--remaining-steps", "5"], "--remaining-steps needs --from"),
    (["--from", "{plan}", "--remaining-steps", "0"], "--remaining-steps must be a positive integer"),
    (["--from", "{plan}", "--global-batch", "32"], "pass --global-batch 64"),
    (["--from", "{missing}"], "missing.json"),
])
def test_plan_from_cli_errors(run_cli, tmp_path, running, args, needle):
    _, after = _clusters()
    plan_file = tmp_path / "running.json"
    running.save(plan_file)
    args = [a.format(plan=plan_file, missing=tmp_path / "missing.json") for a in args]
    code, out, err = run_cli("plan", "-c", _spec_file(tmp_path, after, "c.yaml"), "-m", "gpt2-medium", *args)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1 and needle in err, err


def test_plan_from_cli_re_plans_at_the_running_plans_batch(run_cli, tmp_path):
    # the run trains its plan's batch; without --global-batch, plan --from refused the running plan
    # for not having the model's default batch, in the very command the drift note prints
    from spantrain.workload import load_workload

    default = load_workload("gpt2-medium").global_batch
    before, after = _clusters()
    running = HeuristicPlanner().plan(before, load_workload("gpt2-medium", global_batch=32))
    assert running.batch == 32 != default
    plan_file = tmp_path / "running.json"
    running.save(plan_file)
    code, out, err = run_cli("plan", "-c", _spec_file(tmp_path, after, "c.yaml"), "-m", "gpt2-medium",
                             "--from", plan_file, "--json")
    assert code == 0, err
    assert Plan.from_dict(json.loads(out)["plan"]).batch == running.batch
    assert err == (f"spantrain plan: note: re-planning at the running plan's batch of {running.batch} samples "
                   f"(gpt2-medium's default is {default})\n"), err


def test_plan_from_cli_with_a_departed_device_warns_and_plans_afresh(run_cli, tmp_path, running):
    _, after = _clusters(west_count=3)
    plan_file = tmp_path / "running.json"
    running.save(plan_file)
    code, out, err = run_cli("plan", "-c", _spec_file(tmp_path, after, "c.yaml"), "-m", "gpt2-medium",
                             "--from", plan_file, "--json")
    assert code == 0, err
    assert json.loads(out)["adaptation"]["missing_devices"] == ["west-3"]
    assert err.count("\n") == 1 and "the running plan's device west-3 is not in" in err and "planning afresh" in err
    # a long path (here 150 characters) stays on its line, whole, to copy: it broke at 120 columns
    deep = tmp_path / ("d" * 150) / "next.json"
    deep.parent.mkdir()
    code, out, err = run_cli("plan", "-c", _spec_file(tmp_path, after, "c.yaml"), "-m", "gpt2-medium",
                             "--from", plan_file, "-o", deep)
    # no "next" line where the running plan cannot go on, the case that needs it most
    assert code == 0 and f"\nnext       spantrain run ... --resume --plan {deep}\n" in out, out
    assert f"\nwritten    {deep}\n" in out, out


def test_migration_is_priced_at_the_calibrations_state_bytes(running):
    from spantrain.env.calibration import Calibration

    _, after = _clusters(west_lan_gbps=0.1)
    base = adapt_plan(after, W, running, remaining_steps=500, planner="heuristic")
    heavy = adapt_plan(after, W, running, remaining_steps=500, planner="heuristic",
                       calibration=Calibration(state_bytes_per_param=32))
    assert base.option("heuristic").migration_s > 0
    assert heavy.plan.to_dict()["pipelines"] == base.plan.to_dict()["pipelines"]  # the same move, twice the bytes
    # it was 16 bytes per parameter whatever the constants said
    assert heavy.option("heuristic").migration_s == pytest.approx(2 * base.option("heuristic").migration_s)
