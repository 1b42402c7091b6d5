"""``spantrain run --adapt``: follow the cluster file while training, switch plans when it changes.

The cluster file given to ``spantrain run --cluster`` is the run's picture of the cluster;
whoever measures the cluster rewrites it when links or devices change (``spantrain profile
-o FILE``, a monitoring job, a person). With ``--adapt`` the launcher looks at the file
while the workers train (a ``stat`` per poll; it reads the file only when that changed):

1. A new cluster is read. A file that does not load is reported once and ignored until it
   changes again; the run goes on with its plan.
2. The re-planner weighs keeping the running plan against moving it, over the iterations
   still to run (`spantrain.policies.adapt`: remaining x predicted seconds + migration).
3. **Keep**: one note, and training goes on undisturbed. **Switch**: the workers finish
   the current iteration together, checkpoint and exit; the run continues from that
   checkpoint on the new plan and the new cluster. The checkpoint is resharded onto the
   new stages, so training goes on exactly where it stopped (same weights, optimizer
   state, data position and random state).

The run's own measurements are a second source (``--measure-links``, on with ``--adapt``):
when iterations drift, the workers measure the plan's links in-band and write the cluster
as measured to ``RUN_DIR/cluster-measured.json`` (`spantrain.runtime.linkprobe`); a new
content there goes through steps 2-3 like a new cluster file, so a network that changed
without anyone rewriting the file is noticed too.

A re-planning error (no option fits the new cluster, say) is a note, and the running plan
stays. Every decision is an ``adapt`` event in the metrics file, a note on stderr, a set
of ``adapt/*`` values in W&B (logged by the next segment's rank 0) and an entry of the
result's ``adaptations``.

The runtime does not plan: the CLI hands in the re-planner (`Replan`), so this module
depends on the core types only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spantrain._spec import write_text_atomic
from spantrain.cluster import Cluster
from spantrain.errors import ExecutionError, SpantrainError
from spantrain.plan import Plan
from spantrain.runtime.checkpoint import PLAN_FILE
from spantrain.runtime.config import RunConfig
from spantrain.runtime.metrics import iteration_totals, read_records, run_summary

__all__ = ["Decision", "Replan", "ClusterFile", "Adapter", "StopTimedOut", "run_adapting", "adaptation_scalars",
           "CLUSTER_SEEN_FILE"]

CLUSTER_SEEN_FILE = "cluster-seen.sha256"
"""In the run directory: the digest of the cluster file's content an ``--adapt`` run last acted on."""


class StopTimedOut(ExecutionError):
    """The workers did not finish their iteration in time to stop for a switch (a very slow network)."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What the re-planner chose when the cluster changed."""

    switch: bool
    """True: move to `plan`; False: keep the running plan."""
    plan: Plan
    """The plan to continue with (the running one when keeping)."""
    record: dict[str, Any]
    """JSON-able details (the options weighed), for the metrics file and the result."""
    summary: str
    """One line for the user."""


Replan = Callable[[Plan, Cluster, int], Decision]
"""``replan(running_plan, cluster_now, remaining_iterations) -> Decision``; raises
`SpantrainError` when it cannot plan."""


class ClusterFile:
    """A cluster spec file that may be rewritten while a run goes on."""

    def __init__(self, path: str | Path, what: str = "the cluster file", keeping: str = "the running plan", *,
                 record: Path | None = None, resume: bool = False):
        """`what` names the file in notes, `keeping` what stays while it does not load.

        `record`: a file keeping the digest of the content the run last acted on. With `resume`,
        content other than the recorded is a change the first `poll` reports, as if it came
        while the run went on: a cluster file changed while the run was stopped went unnoticed
        (it continued on a plan predicted at 16.9 s an iteration against 0.00012 s)."""
        self.path = Path(path)
        self.what, self.keeping = what, keeping
        self.record = record
        self._stat = self._signature()
        self._digest = self._read_digest()
        self._reported: str | None = None
        self._unreadable_polls = 0
        self._seen = self._digest is not None
        self.changed_while_stopped = False
        """The recorded content differs from the file's at start: the first change reported is that one."""
        last = self._recorded() if resume else None
        if last is not None and self._digest is not None and last != self._digest:
            self._digest, self._stat, self.changed_while_stopped = last, None, True
        else:
            self._write_record()

    def _recorded(self) -> str | None:
        if self.record is None:
            return None
        try:
            return self.record.read_text().strip() or None
        except OSError:
            return None

    def _write_record(self) -> None:
        if self.record is not None and self._digest is not None:
            write_text_atomic(self.record, self._digest + "\n")

    def _signature(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _read_digest(self) -> str | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError:
            return None

    def poll(self, note: Callable[[str], None]) -> Cluster | None:
        """The cluster the file describes now, if its content changed since the last poll; else None.

        A changed file that cannot be read or loaded is reported through `note` once (per
        content) and gives None: a writer may be half-way through it, or it may be wrong.
        """
        sig = self._signature()
        unreadable = sig is None or not self.path.is_file()
        self._unreadable_polls = self._unreadable_polls + 1 if unreadable else 0
        # a file that was there (not one yet to be written, as the measured links are), and not for a
        # writer's moment in between: deleted, moved, a directory now
        if self._unreadable_polls == 2 and self._seen:
            note(f"{self.what} {self.path} is gone or no file now; keeping {self.keeping} until it is back")
        self._seen = self._seen or not unreadable
        if sig == self._stat:
            return None
        self._stat = sig
        digest = self._read_digest()
        if digest is None or digest == self._digest:
            return None  # touched, or gone for a moment while being replaced
        try:
            cluster = Cluster.from_file(self.path)
        except SpantrainError as e:
            if self._reported != digest:
                self._reported = digest
                note(f"{self.what} {self.path} changed but does not load ({e}); keeping {self.keeping} until it does")
            return None
        self._digest = digest
        self._write_record()
        return cluster


@dataclass
class _Pending:
    step: int
    decision: Decision
    cluster: Cluster


@dataclass
class Adapter:
    """Polled by the launcher while workers train; decides, and tells the launcher when to stop them."""

    cluster_file: ClusterFile
    plan: Plan
    """The running plan."""
    cluster: Cluster
    """The cluster it runs on, as last read."""
    steps: int
    """The run's target iteration count."""
    replan: Replan
    note: Callable[[str], None]
    measured_file: ClusterFile | None = None
    """``RUN_DIR/cluster-measured.json``: the cluster as the workers measured their links
    (``--measure-links``), a second source of changes; it is an observation, so the emulator
    is not reshaped to it."""
    records: list[dict[str, Any]] = field(default_factory=list)
    """Every decision so far (``adapt`` events), in order."""
    pending: _Pending | None = None
    """A switch waiting for the workers to stop."""

    def check(self, step: int, on_change: Callable[[Cluster], None] | None = None) -> bool:
        """Look at the cluster file after iteration `step`; True when the workers should stop for a switch.

        `on_change(cluster)` runs first for every new cluster (the emulator reshapes its links)."""
        if self.pending is not None:
            return True
        stopped = self.cluster_file.changed_while_stopped
        cluster = self.cluster_file.poll(self.note)
        what, source = "the cluster changed", "file"
        if cluster is not None and stopped:
            self.cluster_file.changed_while_stopped = False
            what = f"{self.cluster_file.what} changed while the run was stopped; noticed"
        if cluster is not None and on_change is not None:
            on_change(cluster)
        if cluster is None and self.measured_file is not None:
            cluster = self.measured_file.poll(self.note)
            what, source = "the links measured in-band differ from the cluster", "measured"
        if cluster is None:
            return False
        remaining = self.steps - step
        if remaining < 1:  # the run is ending anyway
            self.cluster = cluster
            return False
        try:
            decision = self.replan(self.plan, cluster, remaining)
        except SpantrainError as e:
            self.note(f"{what} after iteration {step} but re-planning failed ({e}); keeping the running plan")
            self.records.append({"step": step, "source": source, "switch": False, "error": str(e)})
            self.cluster = cluster
            return False
        self.records.append({"step": step, "source": source, **decision.record, "switch": decision.switch,
                             "plan": decision.plan.to_dict() if decision.switch else None})
        self.note(f"{what} after iteration {step}: {decision.summary}")
        if not decision.switch:
            self.cluster = cluster
            return False
        self.pending = _Pending(step=step, decision=decision, cluster=cluster)
        return True

    def take_switch(self) -> _Pending | None:
        """The switch the workers stopped for (None if none); from now on its plan is the running one."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self.plan, self.cluster = pending.decision.plan, pending.cluster
        return pending


def _keep_decision(adapter: Adapter, checkpoint: str | None, workload, data: str | None,
                   cut_off: str = "the new plan was decided before the stop") -> None:
    """A switch decided but cut off by Ctrl-C (or by the run's end): its plan goes into the checkpoint
    the workers stopped with, as a made switch's does, so that ``--resume`` continues on it (it went
    back to a plan 168 s an iteration on the changed network, against 0.0002 s, and never re-planned)."""
    from spantrain.runtime.preflight import check_run

    pending = adapter.pending
    if pending is None or checkpoint is None:
        return
    try:
        check_run(pending.cluster, workload, pending.decision.plan, data=data)
    except SpantrainError:  # the resume re-plans, or names why the plan cannot run
        return
    pending.decision.plan.save(Path(checkpoint) / PLAN_FILE)
    adapter.records[-1]["saved_to"] = checkpoint
    adapter.note(f"{cut_off}: checkpoint {Path(checkpoint).name} holds it, and --resume --adapt continues on it")


def run_adapting(cfg: RunConfig, launch: Callable[[RunConfig, Adapter], dict[str, Any]],
                 adapter: Adapter) -> dict[str, Any]:
    """Run `cfg` with `launch`, continuing on a new plan after every switch `adapter` decides.

    The workers normally stop for a switch at the end of an iteration, with a checkpoint.
    When they cannot finish it in time (the network became very slow), they are killed and
    the run continues from the last checkpoint (``--checkpoint-every``), or from its start
    when there is none; the iterations after it are trained again, on the new plan.

    The result is the last launch's, with ``start_step`` and ``losses`` over the whole run,
    ``adaptations`` (every decision) and ``segments`` (one per plan: iterations, plan, medians).
    """
    from spantrain.runtime.checkpoint import latest_checkpoint
    from spantrain.runtime.prediction import comparable, predicted_step_s
    from spantrain.runtime.preflight import check_run
    from spantrain.runtime.zb_order import run_orders
    from spantrain.workload import load_workload

    workload = load_workload(cfg.model, global_batch=cfg.global_batch)
    first_step = _checkpoint_step(latest_checkpoint(cfg.checkpoint_dir)) if cfg.resume and cfg.checkpoint_dir else 0
    segments: list[dict[str, Any]] = []
    written = 0
    # the job's decisions before this launch (a resumed --adapt job): its W&B table holds them too
    earlier = _logged_decisions(cfg.metrics_path) if cfg.resume else []
    resumed_from = None  # the first launch's: the later ones resume from the switches' checkpoints

    def add_segment(result: dict[str, Any]) -> None:
        nonlocal resumed_from
        if not segments:
            resumed_from = result.get("resumed_from")
        segments.append({k: result[k] for k in ("start_step", "final_step", "plan", "step_s", "samples_per_s",
                                                "predicted_step_s")})

    def whole_run(result: dict[str, Any]) -> dict[str, Any]:
        # steps: the whole run's (the last plan's result counted its own only); step_s, samples_per_s:
        # the last plan's, each plan's in segments
        return {**result, **iteration_totals(cfg.metrics_path, result["final_step"], first_step),
                "resumed_from": resumed_from, "adaptations": adapter.records, "segments": segments}

    try:
        while True:
            try:
                result = launch(cfg, adapter)
            except KeyboardInterrupt:
                # the workers stopped and wrote their plan's result: the one the command reports is the whole run's
                partial = Path(cfg.run_dir) / "result.json"
                stopped = json.loads(partial.read_text()) if partial.exists() else None
                if adapter.pending is not None:  # decided, never made: the run stopped first
                    adapter.records[-1]["interrupted"] = True
                    _keep_decision(adapter, (stopped or {}).get("checkpoint"), workload, cfg.data)
                if stopped is not None:
                    add_segment(stopped)
                    _write_result(cfg, whole_run(stopped))
                elif segments:  # stopped while the new plan's workers started: the plans before it trained
                    _write_result(cfg, whole_run(result))
                raise
            except StopTimedOut as e:
                latest = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
                step = _checkpoint_step(latest)
                adapter.note(f"{e}: they were stopped; continuing from "
                             + (f"the checkpoint of iteration {step}" if latest else "the start (no checkpoint yet)"))
                result = {"start_step": segments[-1]["final_step"] if segments else first_step, "final_step": step,
                          "stopped_early": True, "plan": cfg.plan, "step_s": None, "samples_per_s": None,
                          "checkpoint": str(latest) if latest else None, "predicted_step_s": cfg.predicted_step_s,
                          "prediction_calibration": cfg.prediction_calibration,
                          "prediction_comparable": cfg.prediction_comparable}
            add_segment(result)
            if adapter.pending is not None and not result["stopped_early"]:
                # the workers were in the last iteration when asked to stop: the switch was never made
                adapter.records[-1]["run_ended"] = True
                _keep_decision(adapter, result.get("checkpoint"), workload, cfg.data,
                               "the run reached its last iteration before it could switch to the new plan")
                break
            switch = adapter.take_switch()
            if switch is None or not result["stopped_early"]:
                break
            adapter.records[-1]["switched_at"] = result["final_step"]  # no decision is made while one is pending
            plan, cluster = switch.decision.plan, switch.cluster
            try:
                check_run(cluster, workload, plan, data=cfg.data)
            except SpantrainError as e:
                raise ExecutionError(f"the new plan cannot run ({e}); the last checkpoint is "
                                     f"{result['checkpoint']} (continue with --resume)") from None
            if result["checkpoint"] is not None:  # the plan to continue on from here: a resume after a
                # crash before the new plan's first checkpoint must not go back to the one left
                plan.save(Path(result["checkpoint"]) / PLAN_FILE)
            calibration = cfg.cost_constants()
            orders, source = run_orders(cluster, workload, plan, calibration)
            cfg = dataclasses.replace(cfg, plan=plan.to_dict(), cluster_spec=cluster.to_spec(),
                                      resume=result["checkpoint"] is not None, rank_map=None, zb_orders=orders,
                                      zb_order_source=source, adaptation=adapter.records[-1],
                                      predicted_step_s=predicted_step_s(cluster, workload, plan, calibration),
                                      # adapting runs are local or emulated: the new plan's devices decide
                                      prediction_comparable=cfg.prediction_comparable
                                      and comparable(cluster, workload, plan, where="emulated"))
            adapter.note(f"continuing from iteration {result['final_step']} on the new plan "
                         f"({len(plan.devices)} device(s): {', '.join(plan.devices)})")
            written = _log_decisions(cfg.metrics_path, adapter.records, written)
    finally:
        _log_decisions(cfg.metrics_path, adapter.records, written)
    whole = whole_run(result)
    if cfg.track and (earlier or adapter.records):  # a run that ends normally: not in the way of a Ctrl-C
        # the run's last part now: the one to name (offline, it holds the final summary and the table)
        whole["wandb"] = _track_decisions(cfg, earlier + adapter.records, whole) or whole.get("wandb")
    _write_result(cfg, whole)  # RUN_DIR/result.json held the last plan's part alone
    return whole


def _write_result(cfg: RunConfig, result: dict[str, Any]) -> None:
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)  # removed mid-run: the training is done
    write_text_atomic(Path(cfg.run_dir) / "result.json", json.dumps(result, indent=1) + "\n")


def _checkpoint_step(path: Path | None) -> int:
    return int(json.loads((path / "train_state.json").read_text())["step"]) if path is not None else 0


def _log_decisions(path: str, records: list[dict[str, Any]], written: int) -> int:
    """Append the decisions not yet in the metrics file as ``adapt`` events (while no worker writes it)."""
    if len(records) > written:  # no decision, no file touched (a run that failed early may have none)
        with open(path, "a") as f:
            for rec in records[written:]:
                f.write(json.dumps({"event": "adapt", **rec}) + "\n")
    return len(records)


def _logged_decisions(path: str) -> list[dict[str, Any]]:
    """The ``adapt`` events a metrics file holds (whole lines only), as decision records."""
    return [{k: v for k, v in rec.items() if k != "event"} for rec in read_records(path) if rec.get("event") == "adapt"]


DECISION_COLUMNS = ("step", "source", "switch", "chosen", "iteration_s_kept", "iteration_s_new", "migration_s",
                    "switched_at", "error")
"""Columns of the ``adapt/decisions`` W&B table: every decision of an ``--adapt`` run, kept plans too."""


def _track_decisions(cfg: RunConfig, records: list[dict[str, Any]], whole: dict[str, Any]) -> str:
    """Every decision as one W&B table in the job's run (`cfg.wandb_id`), at the end: the new
    plans' ranks 0 log a switch's numbers as it starts, but a decision to keep the plan has no
    launch of its own to log it. This last part of the run starts with the name and config of the
    launch before it (they were empty), and writes the run's final summary again (`whole`: the
    last launch's medians, the whole run's totals): offline each part has its own summary, and
    this part is the one the run's closing line names. Returns where the part is."""
    from spantrain.tracking import Tracker, part_settings

    out = Path(cfg.run_dir) / "wandb"
    with Tracker(job_type="run", dir=out, run_id=cfg.wandb_id, **part_settings(out, cfg.wandb_id)) as tracker:
        tracker.log_table("adapt/decisions", list(DECISION_COLUMNS),
                          [[r.get(c) for c in DECISION_COLUMNS] for r in records],
                          step=0)  # the tracker moves it past the iterations the run logged
        tracker.summary(run_summary(whole, iteration_totals(cfg.metrics_path, whole["final_step"])))
        return tracker.url_or_dir


def adaptation_scalars(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of a decision record, as ``adapt/*`` W&B values (logged when the new plan starts)."""
    return {f"adapt/{k}": float(v) for k, v in record.items()
            if isinstance(v, int | float) and not isinstance(v, bool)}
