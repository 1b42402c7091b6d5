"""`spantrain run --adapt`: the cluster file is followed while training; a change that makes
moving pay off switches plans through a checkpoint and training continues exactly."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from runtime_helpers import (
    ASYMMETRIC,
    CLUSTER,
    EXACT_EPS,
    LR,
    plan,
    rewrite,
    rewrite_after_step,
    spantrain_here,
    wandb_items,
    write_inputs,
)

from spantrain.cluster import Cluster
from spantrain.errors import PlanError
from spantrain.plan import Plan
from spantrain.runtime.adapter import Adapter, ClusterFile, Decision, adaptation_scalars

RUNNING = Plan.from_dict(plan("1f1b", "allreduce", ASYMMETRIC))
SINGLE = Plan.from_dict(plan("1f1b", "allreduce", [(1, 10, [("a-1", 0, 6)])]))
# The link between the regions collapses: every plan that crosses it is many times slower.
SLOW_WAN = copy.deepcopy(CLUSTER)
SLOW_WAN["network"]["default"] = {"gbps": 0.00001, "latency_ms": 1000}


def test_cluster_file_reports_real_changes_once_and_waits_out_a_broken_file(tmp_path):
    path, _ = write_inputs(tmp_path)
    watch, notes = ClusterFile(path), []
    assert watch.poll(notes.append) is None
    rewrite(path, CLUSTER)  # touched, same content
    assert watch.poll(notes.append) is None
    path.write_text("devices: [")  # half-written
    assert watch.poll(notes.append) is None and watch.poll(notes.append) is None
    assert len(notes) == 1 and str(path) in notes[0] and "keeping the running plan" in notes[0]
    rewrite(path, SLOW_WAN)
    new = watch.poll(notes.append)
    assert isinstance(new, Cluster) and new.bandwidth.min() < Cluster.from_spec(CLUSTER).bandwidth.min()
    assert watch.poll(notes.append) is None and len(notes) == 1


def test_a_cluster_file_that_is_gone_is_noted_once_and_followed_when_it_is_back(tmp_path):
    # deleted (or a directory in its place) mid-run, it was ignored without a word
    path, _ = write_inputs(tmp_path)
    watch, notes = ClusterFile(path), []
    path.unlink()
    assert watch.poll(notes.append) is None and notes == []  # a writer's moment between delete and write
    assert watch.poll(notes.append) is None and watch.poll(notes.append) is None
    assert notes == [f"the cluster file {path} is gone or no file now; keeping the running plan until it is back"]
    rewrite(path, SLOW_WAN)
    assert isinstance(watch.poll(notes.append), Cluster) and len(notes) == 1
    # a file still to be written (RUN_DIR/cluster-measured.json) is no file gone: every --adapt run said so
    later, notes = ClusterFile(tmp_path / "cluster-measured.json"), []
    for _ in range(3):
        assert later.poll(notes.append) is None
    assert notes == []


def _adapter(tmp_path, replan, steps=20):
    path, _ = write_inputs(tmp_path)
    notes = []
    adapter = Adapter(cluster_file=ClusterFile(path), plan=RUNNING, cluster=Cluster.from_spec(CLUSTER), steps=steps,
                      replan=replan, note=notes.append)
    return path, adapter, notes


def test_adapter_keeps_switches_and_survives_a_failed_replan(tmp_path):
    answers = []

    def replan(running, cluster, remaining):
        answers.append((running, remaining))
        kind = replies.pop(0)
        if kind == "error":
            raise PlanError(["no option fits memory"])
        return Decision(switch=kind == "switch", plan=SINGLE if kind == "switch" else running,
                        record={"chosen": kind}, summary=f"chose {kind}")

    replies = ["keep", "error", "switch"]
    path, adapter, notes = _adapter(tmp_path, replan)
    assert adapter.check(3) is False and answers == []  # nothing changed
    rewrite(path, SLOW_WAN)
    assert adapter.check(3) is False and answers == [(RUNNING, 17)]
    assert adapter.cluster.bandwidth.min() < 1e6 and notes[-1].endswith("chose keep")
    spec = copy.deepcopy(SLOW_WAN)
    spec["network"]["default"]["latency_ms"] = 900
    rewrite(path, spec)
    assert adapter.check(5) is False and "re-planning failed" in notes[-1] and "no option fits" in notes[-1]
    spec["network"]["default"]["latency_ms"] = 800
    rewrite(path, spec)
    reshaped = []
    assert adapter.check(6, on_change=reshaped.append) is True and len(reshaped) == 1
    assert adapter.check(7) is True and len(answers) == 3  # pending: no new decision while the workers stop
    assert [r["switch"] for r in adapter.records] == [False, False, True] and adapter.records[-1]["step"] == 6
    pending = adapter.take_switch()
    assert pending.decision.plan is SINGLE and adapter.plan is SINGLE and adapter.pending is None
    assert adapter.take_switch() is None


def test_a_switch_cut_off_by_ctrl_c_is_recorded_as_never_made(tmp_path):
    # its adapt event said "switch": true, with no switched_at, as if the plan had changed
    from spantrain.runtime.adapter import run_adapting
    from spantrain.runtime.config import RunConfig

    path, adapter, notes = _adapter(tmp_path, lambda running, cluster, remaining: Decision(
        switch=True, plan=SINGLE, record={"chosen": "heuristic"}, summary="switching"))
    _, model = write_inputs(tmp_path)
    cfg = RunConfig(cluster_spec=CLUSTER, model=str(model), global_batch=None, plan=RUNNING.to_dict(), steps=20,
                    run_dir=str(tmp_path / "run"), metrics_path=str(tmp_path / "m.jsonl"))

    checkpoint = tmp_path / "ckpt" / "step-00000004"

    def launch(cfg, adapter):
        rewrite(path, SLOW_WAN)
        assert adapter.check(3) is True  # the workers are asked to stop for the switch...
        # ...and Ctrl-C comes first: they stop with a checkpoint of the running plan
        checkpoint.mkdir(parents=True)
        (checkpoint / "plan.json").write_text(RUNNING.to_json())
        Path(cfg.run_dir).mkdir()
        (Path(cfg.run_dir) / "result.json").write_text(json.dumps({
            "start_step": 0, "final_step": 4, "stopped_early": True, "plan": RUNNING.to_dict(), "step_s": 0.1,
            "samples_per_s": 10.0, "predicted_step_s": None, "checkpoint": str(checkpoint)}))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_adapting(cfg, launch, adapter)
    (event,) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert event["event"] == "adapt" and event["switch"] and event["interrupted"] and "switched_at" not in event
    # the decision is kept where a resume looks for the plan to continue on (it went back to the old one)
    assert Plan.from_file(checkpoint / "plan.json") == SINGLE and event["saved_to"] == str(checkpoint)
    assert notes[-1] == ("the new plan was decided before the stop: checkpoint step-00000004 holds it, and --resume "
                         "--adapt continues on it")


def test_ctrl_c_while_the_new_plan_starts_reports_what_the_plans_before_it_trained(tmp_path):
    # the new plan's workers had not trained yet: the command printed no JSON and RUN_DIR/result.json
    # was gone (the new launch clears it), though 4 iterations had been trained
    from spantrain.runtime.adapter import run_adapting
    from spantrain.runtime.config import RunConfig

    path, adapter, _ = _adapter(tmp_path, lambda running, cluster, remaining: Decision(
        switch=True, plan=SINGLE, record={"chosen": "heuristic"}, summary="switching"))
    _, model = write_inputs(tmp_path)
    run_dir, metrics = tmp_path / "run", tmp_path / "m.jsonl"
    cfg = RunConfig(cluster_spec=CLUSTER, model=str(model), global_batch=None, plan=RUNNING.to_dict(), steps=20,
                    run_dir=str(run_dir), metrics_path=str(metrics))
    checkpoint = tmp_path / "ckpt" / "step-00000004"
    launches = []

    def launch(cfg, adapter):
        launches.append(cfg)
        if len(launches) == 2:  # the new plan's launch: its preparation removed the last result, then Ctrl-C
            (run_dir / "result.json").unlink()
            raise KeyboardInterrupt
        rewrite(path, SLOW_WAN)
        assert adapter.check(3) is True
        checkpoint.mkdir(parents=True)
        metrics.write_text("".join(json.dumps({"step": s, "loss": 5.0 - s}) + "\n" for s in range(1, 5)))
        result = {"start_step": 0, "final_step": 4, "stopped_early": True, "plan": RUNNING.to_dict(),
                  "step_s": 0.1, "samples_per_s": 10.0, "predicted_step_s": None, "checkpoint": str(checkpoint)}
        run_dir.mkdir()
        (run_dir / "result.json").write_text(json.dumps(result))
        return result

    with pytest.raises(KeyboardInterrupt):
        run_adapting(cfg, launch, adapter)
    res = json.loads((run_dir / "result.json").read_text())
    assert res["final_step"] == res["steps"] == 4 and res["losses"] == [4.0, 3.0, 2.0, 1.0]
    assert res["checkpoint"] == str(checkpoint) and len(res["segments"]) == 1
    assert res["adaptations"][0]["switched_at"] == 4


def test_a_switch_the_run_ended_before_is_recorded_as_never_made_and_kept_for_a_resume(tmp_path):
    # decided after the last iteration but one: the workers finished the run instead of stopping; the
    # adapt event said "switch": true, no note said otherwise, and the final checkpoint held the old plan
    from spantrain.runtime.adapter import run_adapting
    from spantrain.runtime.config import RunConfig

    path, adapter, notes = _adapter(tmp_path, lambda running, cluster, remaining: Decision(
        switch=True, plan=SINGLE, record={"chosen": "heuristic"}, summary="switching"), steps=6)
    _, model = write_inputs(tmp_path)
    cfg = RunConfig(cluster_spec=CLUSTER, model=str(model), global_batch=None, plan=RUNNING.to_dict(), steps=6,
                    run_dir=str(tmp_path / "run"), metrics_path=str(tmp_path / "m.jsonl"))
    checkpoint = tmp_path / "ckpt" / "step-00000006"
    launches = []

    def launch(cfg, adapter):
        launches.append(cfg)
        rewrite(path, SLOW_WAN)
        assert adapter.check(5) is True  # the workers are asked to stop, and finish the last iteration
        checkpoint.mkdir(parents=True)
        (checkpoint / "plan.json").write_text(RUNNING.to_json())
        return {"start_step": 0, "final_step": 6, "stopped_early": False, "plan": RUNNING.to_dict(), "step_s": 0.1,
                "samples_per_s": 10.0, "predicted_step_s": None, "checkpoint": str(checkpoint)}

    res = run_adapting(cfg, launch, adapter)
    assert len(launches) == 1 and len(res["segments"]) == 1
    (event,) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert event["switch"] and event["run_ended"] and "switched_at" not in event
    assert Plan.from_file(checkpoint / "plan.json") == SINGLE and event["saved_to"] == str(checkpoint)
    assert notes[-1] == ("the run reached its last iteration before it could switch to the new plan: checkpoint "
                         "step-00000006 holds it, and --resume --adapt continues on it")


def test_a_resumed_adapt_job_tracks_the_decisions_of_its_earlier_launches(tmp_path, monkeypatch):
    # a job stopped after a switch (Ctrl-C skips the table) and resumed with --adapt ended with no
    # adapt/decisions table in its W&B run: the resumed launch tabled its own decisions only (none)
    import spantrain.runtime.adapter as adapter_module
    from spantrain.runtime.config import RunConfig

    _, adapter, _ = _adapter(tmp_path, lambda *a: pytest.fail("nothing changed"), steps=20)
    _, model = write_inputs(tmp_path)
    metrics = tmp_path / "m.jsonl"
    earlier = {"step": 1, "source": "file", "chosen": "ppo", "switch": True, "iteration_s_kept": 9.7,
               "iteration_s_new": 0.001, "migration_s": 55.0, "switched_at": 2}
    metrics.write_text(json.dumps({"step": 1, "loss": 5.0}) + "\n" + json.dumps({"event": "adapt", **earlier})
                       + "\n" + json.dumps({"step": 2, "loss": 4.0}) + "\n")
    cfg = RunConfig(cluster_spec=CLUSTER, model=str(model), global_batch=None, plan=RUNNING.to_dict(), steps=20,
                    run_dir=str(tmp_path / "run"), metrics_path=str(metrics), resume=True, track=True)
    tracked = []
    monkeypatch.setattr(adapter_module, "_track_decisions", lambda cfg, records, whole: tracked.append(records))

    def launch(cfg, adapter):
        return {"start_step": 2, "final_step": 20, "stopped_early": False, "plan": RUNNING.to_dict(),
                "step_s": 0.1, "samples_per_s": 10.0, "predicted_step_s": None, "checkpoint": None}

    adapter_module.run_adapting(cfg, launch, adapter)
    assert tracked == [[earlier]]


def test_no_decision_when_nothing_is_left_to_run(tmp_path):
    path, adapter, _ = _adapter(tmp_path, lambda *a: pytest.fail("replanned with no iteration left"), steps=10)
    rewrite(path, SLOW_WAN)
    assert adapter.check(10) is False and adapter.records == []


def _run_args(tmp_path: Path, name: str, steps: int, *extra: str) -> list[str]:
    cluster, model = write_inputs(tmp_path)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(RUNNING.to_dict()))
    return ["run", "--cluster", str(cluster), "--model", str(model), "--plan", str(plan_path), "--steps", str(steps),
            "--lr", str(LR), "--adam-eps", str(EXACT_EPS), "--run-dir", str(tmp_path / name), "--json",
            "--no-progress", *extra]


@pytest.mark.slow
def test_run_switches_plans_when_the_cluster_file_changes_and_trains_exactly(tmp_path, wandb_records, wandb_part):
    # margin: the switch lands a few iterations after the change (a launcher poll, a decision, a stop)
    steps = 30
    (tmp_path / "ref").mkdir()
    ref = json.loads(spantrain_here(*_run_args(tmp_path / "ref", "ref", steps))[1])
    cluster = tmp_path / "cluster.json"
    changer = rewrite_after_step(tmp_path / "adapt" / "metrics.jsonl", cluster, 3, SLOW_WAN)
    code, out, err = spantrain_here(*_run_args(tmp_path, "adapt", steps, "--checkpoint-dir", str(tmp_path / "ckpt"),
                                               "--adapt", "--adapt-planner", "heuristic", "--track",
                                               "--keep-checkpoints", "10"))
    changer.join(1)
    assert code == 0, err
    res = json.loads(out)
    # one job, one W&B run: each plan's launch logs to it (they were separate, unlinked runs), and
    # at the end every decision, as a table (a decision to keep the plan reached W&B nowhere)
    parts = sorted((tmp_path / "adapt" / "wandb" / "wandb").glob("offline-run-*"))
    assert len(parts) == 3 and len({p.name.split("-")[-1] for p in parts}) == 1, parts
    assert b"adapt/decisions" in wandb_records(tmp_path / "adapt" / "wandb", b"adapt/decisions")
    assert "the cluster changed after iteration" in err and "switching to the heuristic plan" in err
    assert res["start_step"] == 0 and res["final_step"] == steps and len(res["losses"]) == steps
    assert res["steps"] == steps  # was the last plan's alone
    # and so is W&B's summary, which held the last plan's launch's own figures: each launch counts
    # the run so far
    launches = [wandb_items(wandb_records(p), "loss_first") for p in parts]
    assert sorted(launches) == [[json.dumps(res["losses"][0])]] * 3, launches
    # the decisions' part, the run's last, had an empty name and config, and a summary of the table
    # alone: it is named and configured as the launch before it, and holds the run's final summary
    first_plan, last_plan, decisions = (wandb_part(p) for p in parts)
    assert decisions["name"] == first_plan["name"] == last_plan["name"] == "rt-small on rt-test: adapt"
    assert decisions["config"] == last_plan["config"] and decisions["config"]["plan"] == res["segments"][1]["plan"]
    final = {k: v for k, v in last_plan["summary"].items() if k in ("steps", "loss_first", "loss_last", "step_s",
                                                                     "samples_per_s", "stopped_early", "final_step")}
    assert final == {k: decisions["summary"][k] for k in final} and len(final) == 7
    assert final["steps"] == res["steps"] == steps and final["loss_last"] == res["losses"][-1]
    assert "adapt/decisions/_type" in decisions["summary"]
    assert res["wandb"] == str(parts[2])  # the closing line names that part
    # the run directory's result is the whole run's too, not the last plan's (it said "resumed from")
    machine = ("cpu_cores", "oversubscribed", "emulated")  # what the command adds to the file's result
    assert json.loads((tmp_path / "adapt" / "result.json").read_text()) == {k: v for k, v in res.items()
                                                                          if k not in machine}
    assert res["resumed_from"] is None
    first, second = res["segments"]
    assert first["plan"] == RUNNING.to_dict() and first["final_step"] == second["start_step"]
    assert 3 <= first["final_step"] < steps and res["world_size"] == len(Plan.from_dict(second["plan"]).devices) < 4
    (decision,) = res["adaptations"]
    assert decision["switch"] and decision["chosen"] == "heuristic" and decision["switched_at"] == first["final_step"]
    # the switch's checkpoint names the plan to continue on, the new one: a resume after a crash
    # before the new plan's first checkpoint went back to the plan left, without a word
    switch_ckpt = tmp_path / "ckpt" / f"step-{first['final_step']:08d}"
    assert json.loads((switch_ckpt / "plan.json").read_text())["pipelines"] == second["plan"]["pipelines"]
    assert decision["iteration_s_kept"] > 100 * decision["iteration_s_new"]
    # each plan's own prediction, on the cluster it was chosen for: the decision's figures
    assert first["predicted_step_s"] == pytest.approx(ref["predicted_step_s"])
    assert second["predicted_step_s"] == pytest.approx(decision["iteration_s_new"])
    scalars = adaptation_scalars(decision)  # what the new plan's rank 0 logs to W&B
    assert scalars["adapt/switched_at"] == first["final_step"] and scalars["adapt/migration_s"] >= 0
    assert {"adapt/iteration_s_kept", "adapt/iteration_s_new", "adapt/remaining_steps"} <= set(scalars)
    assert not any(k in scalars for k in ("adapt/switch", "adapt/options", "adapt/plan"))
    # Same samples in the same order, the state carried over by the checkpoint: the same losses.
    assert res["losses"] == pytest.approx(ref["losses"], rel=1e-5)
    events = [json.loads(x) for x in (tmp_path / "adapt" / "metrics.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events if e.get("event") in ("start", "end", "adapt")] == [
        "start", "end", "adapt", "start", "end"]
    assert first["final_step"] in [e["step"] for e in events if e.get("event") == "checkpoint"]
    # the same command resumed goes on on the plan adaptation chose (it went back to --plan's, 17x
    # slower on the cluster it had switched for, and never re-planned)
    args = _run_args(tmp_path, "adapt", steps + 2, "--checkpoint-dir", str(tmp_path / "ckpt"), "--adapt",
                     "--adapt-planner", "heuristic", "--resume", "--keep-checkpoints", "10")
    cluster.write_text(json.dumps(SLOW_WAN))  # as the first run left it (_run_args wrote the original)
    code, out, err = spantrain_here(*args)
    assert code == 0, err
    assert f"--adapt: resuming on the plan checkpoint step-{steps:08d} was trained on" in err, err
    resumed = json.loads(out)
    assert resumed["start_step"] == steps and resumed["world_size"] == len(Plan.from_dict(second["plan"]).devices)
    assert "resuming on another plan" not in err


@pytest.mark.slow
def test_a_switch_the_workers_cannot_reach_in_time_continues_from_the_last_checkpoint(tmp_path, monkeypatch):
    import spantrain.runtime.launcher as launcher

    monkeypatch.setattr(launcher, "_STOP_GRACE_S", 0.0)  # as if the iteration in flight crawled on the new links
    cluster = tmp_path / "cluster.json"
    rewrite_after_step(tmp_path / "adapt" / "metrics.jsonl", cluster, 5, SLOW_WAN)
    code, out, err = spantrain_here(*_run_args(tmp_path, "adapt", 16, "--checkpoint-dir", str(tmp_path / "ckpt"),
                                               "--checkpoint-every", "4", "--adapt", "--adapt-planner", "heuristic"))
    assert code == 0, err
    res = json.loads(out)
    assert "did not finish their iteration" in err and "continuing from the checkpoint of iteration" in err
    first, second = res["segments"]
    assert first["final_step"] % 4 == 0 and first["final_step"] >= 4 and second["start_step"] == first["final_step"]
    assert res["final_step"] == 16 and len(res["losses"]) == 16  # retrained iterations counted once


def test_adapt_input_errors_are_one_line(tmp_path):
    code, _, err = spantrain_here(*_run_args(tmp_path, "x", 4, "--adapt"))
    assert code == 2 and "--adapt needs --checkpoint-dir" in err and len(err.strip().splitlines()) == 1
    code, _, err = spantrain_here(*_run_args(tmp_path, "x", 4, "--adapt-planner", "ppo"))
    assert code == 2 and "--adapt-planner only applies with --adapt" in err
    code, _, err = spantrain_here(*_run_args(tmp_path, "x", 4, "--adapt", "--checkpoint-dir", str(tmp_path / "c"),
                                             "--adapt-planner", "nope"))
    assert code == 2 and "nope" in err and len(err.strip().splitlines()) == 1
    # on more devices than exhaustive covers: it ran, and every change's re-plan failed in a note
    cee16 = Path(__file__).resolve().parents[2] / "examples" / "cee-16.yaml"
    code, _, err = spantrain_here("run", "--cluster", str(cee16), "--model", "tiny-gpt", "--planner", "heuristic",
                                  "--steps", "2", "--run-dir", str(tmp_path / "e"), "--adapt", "--checkpoint-dir",
                                  str(tmp_path / "ce"), "--adapt-planner", "exhaustive")
    assert code == 2 and err == (f"spantrain run: error: --adapt-planner exhaustive covers at most 8 devices and "
                                 f"{cee16} has 16: pick another (--adapt-planner auto, the default, or heuristic)\n")
    assert not (tmp_path / "e").exists()


def test_the_cli_replanner_keeps_a_plan_that_still_fits_and_moves_off_a_dead_link():
    from spantrain.cli.run import _replanner
    from spantrain.policies.heuristic import HeuristicPlanner
    from spantrain.workload import Workload

    # four A100s on a 0.5 Gbit/s LAN, gpt2-xl: the heuristic's plan is a two-stage pipeline
    spec = {"name": "lan", "devices": [{"id": "g", "count": 4, "region": "r", "tflops": 150, "memory_gb": 40}],
            "network": {"regions": {"r": {"gbps": 0.5, "latency_ms": 0.5}}}}
    cluster, gpt2_xl = Cluster.from_spec(spec), Workload.from_preset("gpt2-xl")
    running = HeuristicPlanner().plan(cluster, gpt2_xl)
    assert len(running.devices) == 2
    replan = _replanner("heuristic", cluster, gpt2_xl, running)
    same = replan(running, cluster, 100)
    assert not same.switch and same.plan.to_dict()["pipelines"] == running.to_dict()["pipelines"]
    assert same.summary.startswith("keeping the running plan") and same.record["chosen"] == "keep"
    spec["network"]["regions"]["r"]["gbps"] = 0.0005  # the LAN all but dies: one device alone is best
    moved = replan(running, Cluster.from_spec(spec), 100)
    assert moved.switch and moved.summary.startswith("switching to the heuristic plan")
    assert len(moved.plan.devices) == 1 and moved.record["iteration_s_new"] < moved.record["iteration_s_kept"]
    left = replan(running, cluster.subset([d for d in cluster.ids if d != running.devices[0]]), 100)
    assert left.switch and f"device(s) {running.devices[0]} left the cluster" in left.summary
    # --emulate-network: devices the cluster file gains but the emulator does not run are no place to move
    # to (the run failed with "cannot emulate devices ...: unknown new-0")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        network = Path(tmp) / "network.json"
        network.write_text(json.dumps(spec))
        grown = Cluster.from_spec({**spec, "devices": [*spec["devices"], {"id": "new", "count": 4, "region": "r",
                                                                          "tflops": 1000, "memory_gb": 80}]})
        anywhere = _replanner("heuristic", grown, gpt2_xl, running)(running, grown, 1000)
        assert any(d.startswith("new-") for d in anywhere.plan.devices)  # without the network file it would move
        decision = _replanner("heuristic", grown, gpt2_xl, running, None, str(network))(running, grown, 1000)
        assert not any(d.startswith("new-") for d in decision.plan.devices)
    # the running plan's devices lose memory: a running --adapt job ended in a ZeroDivisionError traceback
    spec["network"]["regions"]["r"]["gbps"] = 0.5
    spec["devices"] = [{"id": "g", "count": 2, "region": "r", "tflops": 150, "memory_gb": 2},
                       {"id": "h", "count": 4, "region": "r", "tflops": 150, "memory_gb": 40}]
    shrunk = Cluster.from_spec(spec)
    running = HeuristicPlanner().plan(Cluster.from_spec({**spec, "devices": [{**spec["devices"][0],
                                                                              "memory_gb": 40}]}), gpt2_xl)
    # nothing fits at all: --adapt's warm-up (it only loads the kernels) refused a run that would start
    # without --adapt; the first re-plan then says why, as a note, and the plan stays
    nowhere = Cluster.from_spec({**spec, "devices": [{**d, "memory_gb": 0.001} for d in spec["devices"]]})
    from spantrain.errors import PlannerError

    replan_nowhere = _replanner("heuristic", nowhere, gpt2_xl, running)
    with pytest.raises(PlannerError, match="fits nowhere") as e:
        replan_nowhere(running, nowhere, 100)
    # tiny figures in MB: "needs 0.0 GB ... but the largest device has 0.0001 GB" said nothing
    assert "0.0 GB" not in str(e.value) and "has 1 MB" in str(e.value), str(e.value)
    unfit = _replanner("auto", shrunk, gpt2_xl, running)(running, shrunk, 100)
    assert unfit.switch and unfit.summary.startswith("the running plan no longer fits memory on the cluster as it "
                                                     "is now: switching to the")
    assert unfit.record["iteration_s_kept"] is None and json.dumps(unfit.record, allow_nan=False)


def test_a_network_file_that_does_not_load_is_named_as_the_emulated_network(tmp_path):
    from spantrain.runtime.adapter import ClusterFile

    path = tmp_path / "net.yaml"
    path.write_text(json.dumps(CLUSTER))
    notes: list[str] = []
    watched = ClusterFile(path, "the emulated network (--emulate-network)", "the links as they are")
    path.write_text("devices: [")  # mid-rewrite
    assert watched.poll(notes.append) is None
    # it said "the cluster file ... keeping the running plan", of a file that holds no plan
    assert len(notes) == 1 and notes[0].startswith(f"the emulated network (--emulate-network) {path} changed but "
                                                   "does not load (") and notes[0].endswith(
        "keeping the links as they are until it does")


@pytest.mark.slow
def test_ctrl_c_after_a_switch_reports_the_whole_run(tmp_path):
    """The report of a stopped run, on the terminal and in RUN_DIR/result.json, is the command's: it
    was the last plan's part ("trained iterations 5..11", resumed from a checkpoint it never named)."""
    import subprocess
    import sys

    from runtime_helpers import ctrl_c, default_stop_signals

    from spantrain.runtime.metrics import read_step_records

    cluster = tmp_path / "cluster.json"
    rewrite_after_step(tmp_path / "adapt" / "metrics.jsonl", cluster, 3, SLOW_WAN)
    args = _run_args(tmp_path, "adapt", 100000, "--checkpoint-dir", str(tmp_path / "ckpt"), "--adapt",
                     "--adapt-planner", "heuristic")
    proc = subprocess.Popen([sys.executable, "-m", "spantrain", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=default_stop_signals)
    metrics = tmp_path / "adapt" / "metrics.jsonl"

    def two_iterations_into_the_new_plan() -> bool:
        events = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
        starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
        return len(starts) == 2 and sum(1 for e in events[starts[1]:] if "loss" in e) >= 2

    out, err = ctrl_c(proc, two_iterations_into_the_new_plan)
    assert proc.returncode == 130, err
    res = json.loads(out)
    assert json.loads((tmp_path / "adapt" / "result.json").read_text()) == res  # a stopped run's report is the file
    assert res["start_step"] == 0 and res["resumed_from"] is None and res["stopped_early"]
    assert len(res["segments"]) == 2 and res["segments"][1]["final_step"] == res["final_step"]
    steps = {r["step"] for r in read_step_records(tmp_path / "adapt" / "metrics.jsonl")}
    assert res["steps"] == len(res["losses"]) == res["final_step"] == max(steps)



@pytest.mark.slow
def test_an_adapt_resume_notices_a_cluster_file_changed_while_the_run_was_stopped(tmp_path):
    # it went on on the plan it stopped with, 16.9 s an iteration against 0.00012 s, and said nothing
    ckpt = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--adapt", "--adapt-planner", "heuristic"]
    code, out, err = spantrain_here(*_run_args(tmp_path, "adapt", 4, *ckpt))
    assert code == 0, err
    assert (tmp_path / "adapt" / "cluster-seen.sha256").is_file()
    args = _run_args(tmp_path, "adapt", 12, *ckpt, "--resume")
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(SLOW_WAN))  # while the run was stopped
    code, out, err = spantrain_here(*args)
    assert code == 0, err
    assert "the cluster file changed while the run was stopped; noticed after iteration" in err, err
    res = json.loads(out)
    (decision,) = res["adaptations"]
    assert decision["switch"] and decision["iteration_s_kept"] > 2 * decision["iteration_s_new"]
    assert res["final_step"] == 12 and len(res["segments"]) == 2
    # resumed again with the file as the run left it (_run_args wrote the original): nothing to notice
    args = _run_args(tmp_path, "adapt", 14, *ckpt, "--resume")
    cluster.write_text(json.dumps(SLOW_WAN))
    code, out, err = spantrain_here(*args)
    assert code == 0 and "changed while the run was stopped" not in err, err
