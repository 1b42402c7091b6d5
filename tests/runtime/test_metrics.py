"""Per-step metrics: the summary and the drift watch that tells a run its network may have changed."""

from __future__ import annotations

import json

import pytest

from spantrain.runtime.launcher import _Progress
from spantrain.runtime.metrics import (
    DRIFT_FACTOR,
    DriftWatch,
    MetricsLog,
    iteration_totals,
    read_records,
    read_step_records,
    summarize,
)


def _record(step: int, step_s: float) -> dict:
    return {"step": step, "step_s": step_s, "samples": 8, "samples_per_s": 8 / step_s, "loss": 1.0, "cpu_s": step_s}


def test_steady_iterations_are_no_drift_and_swings_below_the_factor_neither():
    watch = DriftWatch()
    times = [3.0, 2.0] + [1.0, 1.2, 0.9, 1.1, 1.0] * 8 + [1.9] * 20  # warm-up, baseline 1.0, then 1.9x
    assert all(watch.add(t) is None for t in times)
    assert watch.baseline == 1.0


def test_drift_is_reported_once_the_recent_median_doubles_and_again_only_at_the_next_doubling():
    watch = DriftWatch()
    reports = [(i, r) for i, t in enumerate([5.0, 5.0] + [1.0] * 10 + [3.0] * 10 + [7.0] * 10)
               if (r := watch.add(t)) is not None]
    # the median of the last 5 turns slow on the 3rd slow iteration (index 14), and 7/1 >= 2 x 3 at index 24
    assert [i for i, _ in reports] == [14, 24]
    assert reports[0][1] == 3.0 >= DRIFT_FACTOR and reports[1][1] == 7.0


def test_a_plan_slow_from_the_start_is_drift_against_the_prediction_when_it_holds():
    # the link slowed during warm-up: the baseline already holds the slowdown
    times = [5.0, 5.0] + [3.0] * 10 + [7.0] * 10
    assert all(DriftWatch().add(t) is None for t in times[:12])
    watch = DriftWatch(expected=1.0)
    reports = [(i, r, watch.reference_name) for i, t in enumerate(times) if (r := watch.add(t)) is not None]
    # at the baseline (index 6): 3x the prediction; then 7/3 >= 2x the baseline, as without a prediction
    assert reports == [(6, 3.0, "prediction"), (14, 7.0 / 3.0, "start")]
    # within the factor of the prediction: the baseline alone, as before
    assert all(DriftWatch(expected=1.6).add(t) is None for t in times[:12])


def test_metrics_log_names_the_prediction_it_measured_the_slowdown_against(tmp_path):
    heard = []
    log = MetricsLog(tmp_path / "m.jsonl", announce=heard.append, predicted_step_s=0.5, prediction_holds=True)
    for k, t in enumerate([2.0] * 8):
        log.step(_record(k + 1, t))
    log.close()
    (drift,) = [x for x in map(json.loads, (tmp_path / "m.jsonl").read_text().splitlines()) if x.get("event")]
    assert drift == {"event": "drift", "step": 7, "slowdown": 4.0, "baseline_step_s": 0.5, "recent_step_s": 2.0,
                     "reference": "prediction"}
    assert heard == ["iterations are 4.0x slower than the cost model predicts for this plan (median 2 s over the last "
                     "5, predicted 0.5 s; iteration 7): if links or devices changed, re-measure them (spantrain "
                     "profile) and adapt the plan (spantrain plan --from PLAN), then continue with spantrain run "
                     "--resume"]
    # a prediction that does not hold (a plain local run's) is no reference
    log = MetricsLog(tmp_path / "n.jsonl", predicted_step_s=0.5)
    for k, t in enumerate([2.0] * 8):
        log.step(_record(k + 1, t))
    log.close()
    assert not [x for x in (tmp_path / "n.jsonl").read_text().splitlines() if "drift" in x]


def test_metrics_log_writes_the_drift_event_and_announces_it(tmp_path):
    heard = []
    log = MetricsLog(tmp_path / "m.jsonl", announce=heard.append)
    for k, t in enumerate([1.0] * 7 + [4.0] * 3):
        log.step(_record(k + 1, t))
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    drift = [x for x in lines if x.get("event") == "drift"]
    assert len(drift) == 1 and drift[0]["step"] == 10 and drift[0]["slowdown"] == 4.0
    assert len(heard) == 1 and "4.0x slower" in heard[0] and "spantrain plan --from" in heard[0]
    assert summarize(log.records)["steps"] == 10  # events are not iterations


def test_launcher_progress_turns_the_drift_event_into_a_note(tmp_path):
    path = tmp_path / "m.jsonl"
    notes = []
    watcher = _Progress(path, total=20, start=0, show=False, note=notes.append)
    log = MetricsLog(path)
    for k, t in enumerate([1.0] * 7 + [4.0] * 3):
        log.step(_record(k + 1, t))
    log.close()
    watcher.poll()
    assert watcher.last_step == 10
    assert len(notes) == 1 and notes[0].startswith("spantrain run: note: iterations are 4.0x slower")


@pytest.mark.parametrize("last_step", [12, 11])
def test_a_measuring_run_promises_a_measurement_only_when_an_iteration_follows_the_drift(tmp_path, last_step):
    path = tmp_path / "m.jsonl"
    notes, heard = [], []
    watcher = _Progress(path, total=last_step, start=0, show=False, note=notes.append, measuring=True)
    log = MetricsLog(path, announce=heard.append)  # torchrun's rank 0 announces the drift itself
    log.measuring, log.last_step = True, last_step
    for k, t in enumerate([1.0] * 7 + [4.0] * 3):  # drift at iteration 10
        log.step(_record(k + 1, t))
    log.close()
    watcher.poll()
    promised = last_step > 11  # iteration 11 asks for it, and it is made unless 11 is the last
    for note in (notes[0], heard[0]):
        assert ("measuring the plan's links after the next iteration" in note) == promised, note
        assert ("re-measure them (spantrain profile)" in note) != promised, note


def test_a_new_launch_reads_only_its_own_lines_and_an_adapting_run_names_its_cluster_file(tmp_path):
    from types import SimpleNamespace

    path = tmp_path / "m.jsonl"
    log = MetricsLog(path)  # an earlier launch of the same run drifted
    for k, t in enumerate([1.0] * 7 + [4.0] * 3):
        log.step(_record(k + 1, t))
    notes = []
    adapter = SimpleNamespace(cluster_file=SimpleNamespace(path=tmp_path / "now.yaml"))
    watcher = _Progress(path, total=40, start=10, show=False, note=notes.append, adapter=adapter)
    watcher.poll()
    assert watcher.last_step is None and notes == []  # nothing of the earlier launch
    log.close()
    log = MetricsLog(path)  # this launch's rank 0
    for k, t in enumerate([1.0] * 7 + [4.0] * 3):
        log.step(_record(k + 11, t))
    log.close()
    watcher.poll()
    assert watcher.last_step == 20 and len(notes) == 1
    assert f"re-measure them into {tmp_path / 'now.yaml'}" in notes[0] and "adapts its plan" in notes[0]


def test_every_iteration_sends_the_prediction_to_wandb_beside_the_measured_time(tmp_path):
    class Tracker:
        def __init__(self):
            self.logged: list[tuple[int, dict]] = []

        def log(self, metrics, step=None):
            self.logged.append((step, metrics))

    for predicted in (0.25, None):
        tracker = Tracker()
        log = MetricsLog(tmp_path / "m.jsonl", tracker, predicted_step_s=predicted)
        for k in range(3):
            log.step(_record(k + 1, 0.3))
        log.close()
        assert [step for step, _ in tracker.logged] == [1, 2, 3]
        assert all(m["step_s"] == 0.3 and m.get("predicted_step_s") == predicted for _, m in tracker.logged)
        # no line at all when nothing was predicted, not a line at zero
        assert all(("predicted_step_s" in m) == (predicted is not None) for _, m in tracker.logged)
    # fp16: whether the update was skipped reaches W&B too (metrics.jsonl alone had it)
    tracker = Tracker()
    log = MetricsLog(tmp_path / "fp16.jsonl", tracker)
    for k, overflow in enumerate((False, True)):
        log.step({**_record(k + 1, 0.3), "loss_scale": 2.0**16 / (1 + k), "overflow": overflow})
    log.close()
    assert [m["skipped_update"] for _, m in tracker.logged] == [0, 1]


def test_a_run_after_a_cut_line_starts_on_a_line_of_its_own(tmp_path):
    # a full disk cut iteration 9's line: the resumed run's start event went onto its end, and
    # with it the rule that the lines after the last start event count
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 8, "loss": 1.0, "step_s": 0.1}) + '\n{"step": 9, "lo')
    log = MetricsLog(path)
    log.event("start", step=8)
    log.step({"step": 9, "loss": 0.9, "step_s": 0.1, "samples_per_s": 10.0})
    log.close()
    lines = path.read_text().splitlines()
    assert lines[1] == '{"step": 9, "lo' and json.loads(lines[2]) == {"event": "start", "step": 8}
    assert [r["step"] for r in read_step_records(path)] == [8, 9]
    MetricsLog(tmp_path / "new.jsonl").close()  # a new file gets no empty first line
    assert (tmp_path / "new.jsonl").read_text() == ""


def test_iteration_totals_count_each_iteration_as_last_trained(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [(3, True, 9.0), (4, False, 8.0), (5, True, 7.0), (6, True, 6.0),  # a run resumed at iteration 2
            (6, False, 5.5), (7, True, 5.0), (8, False, 4.0)]  # iteration 6 retrained after a switch or a kill
    path.write_text("".join(json.dumps({"step": s, "loss": x, "step_s": 0.1, "overflow": o}) + "\n"
                            for s, o, x in rows) + '{"event": "end", "final_step": 8}\n')
    whole = iteration_totals(path, 8)  # where the file's first iteration began
    assert whole == {"start_step": 2, "steps": 6, "losses": [9.0, 8.0, 7.0, 5.5, 5.0, 4.0], "loss_first": 9.0,
                     "loss_last": 4.0, "skipped_steps": 3}  # 3, 5 and 7: iteration 6 as last trained
    part = iteration_totals(path, 7, start=4)
    assert part["losses"] == [7.0, 5.5, 5.0] and part["skipped_steps"] == 2 and part["start_step"] == 4
    assert iteration_totals(path, 2)["steps"] == 0
    assert iteration_totals(tmp_path / "none.jsonl", 5)["loss_first"] is None


def test_the_progress_bar_draws_each_iteration_with_its_own_loss(tmp_path, capsys):
    # it drew the new iteration count beside the previous iteration's loss, then redrew
    path = tmp_path / "m.jsonl"
    watcher = _Progress(path, total=5, start=0, show=True)
    watcher.bar.mininterval = watcher.bar.miniters = 0  # every update draws
    log = MetricsLog(path)
    for step, loss in ((1, 5.0), (2, 4.0)):
        log.step({**_record(step, 1.0), "loss": loss})
        watcher.poll()
    log.close()
    watcher.close()
    frames = [f for f in capsys.readouterr().err.split("\r") if "it" in f]
    assert not [f for f in frames if " 2/5 " in f and "loss=5.0000" in f], frames
    assert [f for f in frames if " 2/5 " in f and "loss=4.0000" in f], frames


def test_local_sgd_alternating_fast_and_syncing_iterations_is_no_drift_and_its_median_is_per_period(tmp_path):
    # period 2 across a slow link: 0.25 s, then 2.3 s with the sync. The median of single iterations
    # flipped between the two by the window's parity: "9.2x slower than at the start" on a steady run,
    # and a step_s of 0.25 or 2.3 s by the iteration count's parity
    heard = []
    log = MetricsLog(tmp_path / "m.jsonl", announce=heard.append, sync_period=2)
    times = {s: (2.3 if s % 2 == 0 else 0.25) for s in range(25, 60)}  # resumed at 24: warm-up 25, 26
    for s, t in times.items():
        log.step(_record(s, t))
    log.close()
    assert heard == [] and not [x for x in read_records(tmp_path / "m.jsonl") if x.get("event") == "drift"]
    assert summarize(log.records, 2)["step_s"] == pytest.approx(1.275)
    assert summarize(log.records[:5], 2)["step_s"] == pytest.approx(1.275)  # steps 27, 28 whole; 29 alone is not
    # a real slowdown of whole periods is still drift, named per period
    log = MetricsLog(tmp_path / "n.jsonl", announce=heard.append, sync_period=2)
    for s in range(1, 40):
        log.step(_record(s, (2.3 if s % 2 == 0 else 0.25) * (3 if s > 20 else 1)))
    assert len(heard) == 1 and "median 3.82 s over the last 5 sync periods of 2 iterations, was 1.27 s" in heard[0]


def test_a_local_sgd_runs_step_time_is_the_median_of_whole_sync_periods(tmp_path):
    from runtime_helpers import ASYMMETRIC, plan, run_plan

    result = run_plan(tmp_path, "lsgd", plan("1f1b", "local-sgd", ASYMMETRIC, period=2), 5)
    by_step = {r["step"]: r["step_s"] for r in read_step_records(result["metrics"])}
    assert result["step_s"] == pytest.approx((by_step[3] + by_step[4]) / 2)  # warm-up 1, 2; 5 ends no period
