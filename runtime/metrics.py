"""Per-step training metrics: a JSON-lines file, W&B when tracking is on, and the run summary.

One line per iteration, written by rank 0 after every rank has reported::

    {"step": 3, "step_s": 0.41, "samples": 32, "samples_per_s": 78.0, "loss": 4.12, "cpu_s": 0.7,
     "ranks": [{"rank": 0, "device": "a", "compute_s": 0.30, "p2p_wait_s": 0.07, "sync_s": 0.02,
                "cpu_s": 0.35}, ...]}

``step_s`` is the wall time of the iteration on the slowest rank (all ranks meet at the end
of each iteration). Per rank, ``p2p_wait_s`` is time blocked on activations/gradients from
neighbouring stages, ``sync_s`` time inside data-parallel collectives, and ``compute_s`` the
rest of the rank's iteration (forward, backward, optimizer, framework overhead); ``cpu_s`` is
the CPU time the rank's process used in its iteration (all its threads), and the top-level
``cpu_s`` their sum: unlike wall time it hardly moves when other work shares the cores.

Drift: iterations that become much slower than they were at the start of the plan are
what a changed network or device looks like from inside a run. `DriftWatch` compares
the median of the last few iterations with the median of the first few after warm-up;
when it reaches `DRIFT_FACTOR`, the log gets a ``{"event": "drift", ...}`` line (the
launcher prints it as a note: re-measure, then adapt the plan with ``spantrain plan
--from``), once, and again only if the slowdown doubles. A network that slows before that
baseline is taken hides in it; when the run's prediction holds against its measured times
(`spantrain.runtime.prediction.comparable`), the watch therefore also reports a baseline
that is already `DRIFT_FACTOR` times the cost model's prediction (``"reference":
"prediction"`` in the event).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["MetricsLog", "DriftWatch", "DRIFT_FACTOR", "drift_message", "summarize", "warmup_steps", "read_records",
           "read_step_records", "iteration_totals", "TOTALS_IN_SUMMARY", "run_summary"]

DRIFT_FACTOR = 2.0
"""Slowdown (recent median step time / baseline median) that is reported as drift. High
on purpose: a shared or throttled machine swings by tens of percent on its own, while a
network change that calls for another plan slows iterations several times."""
DRIFT_WINDOW = 5
"""Iterations in the baseline and in the recent median."""


def warmup_steps(n: int) -> int:
    """Iterations left out of medians: the first ones pay for shape inference and connection set-up."""
    return min(2, n // 2)


def period_means(records: list[dict[str, Any]], period: int) -> list[dict[str, Any]]:
    """The records of whole sync periods (local SGD: the iterations whose step, 1-based, is a multiple
    of `period` sync), each period as one record of its iterations' mean step_s, samples_per_s and
    cpu_s; the records themselves when `period` is 1 or no period is whole. One iteration in `period`
    pays for the sync: the median of single iterations was the fast ones' or the syncing ones' by the
    count's parity (0.25 or 2.3 s over a 2-period run alternating the two)."""
    if period <= 1:
        return records
    out, periods = [], _Periods(period)
    for r in records:
        if block := periods.add(r["step"], r):
            mean = {k: statistics.fmean(b[k] for b in block) for k in ("step_s", "samples_per_s", "cpu_s")
                    if all(k in b for b in block)}
            out.append({**r, **mean})
    return out or records


class _Periods:
    """Consecutive iterations in whole local-SGD sync periods (the one whose 1-based step is a
    multiple of the period syncs): `add` returns a period's items as its last one comes, else None;
    a gap in the steps, or a period cut short (by the warm-up), gives none."""

    def __init__(self, period: int):
        self.period = period
        self._block: list[tuple[int, Any]] = []

    def add(self, step: int, item: Any) -> list[Any] | None:
        if self._block and step != self._block[-1][0] + 1:  # a gap: not one period
            self._block = []
        self._block.append((step, item))
        if step % self.period:
            return None
        block, self._block = self._block, []
        return [x for _, x in block] if len(block) == self.period else None


def summarize(records: list[dict[str, Any]], period: int = 1) -> dict[str, Any]:
    """Medians after warm-up, first and last loss, over the step records of one run; with a local-SGD
    sync `period`, medians of whole periods' means (`period_means`)."""
    if not records:
        return {"steps": 0, "samples_per_s": None, "step_s": None, "cpu_s": None, "loss_first": None,
                "loss_last": None}
    steady = period_means(records[warmup_steps(len(records)):], period)
    step_s = statistics.median(r["step_s"] for r in steady)
    batches = {r.get("samples") for r in steady}
    # one batch: batch / median seconds, so the two figures a report prints agree (over an even
    # count the median of per-step rates is not the rate of the median step: 51.1 against 50.9)
    (batch,) = batches if len(batches) == 1 else (None,)
    return {"steps": len(records),
            "samples_per_s": batch / step_s if batch and step_s > 0 else
            statistics.median(r["samples_per_s"] for r in steady),
            "step_s": step_s,
            "cpu_s": statistics.median(r["cpu_s"] for r in steady) if all("cpu_s" in r for r in steady) else None,
            "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"],
            "warmup_steps": warmup_steps(len(records))}


class DriftWatch:
    """Tells when iterations have become `factor` times slower than at the start (module docstring)."""

    def __init__(self, factor: float = DRIFT_FACTOR, window: int = DRIFT_WINDOW, warmup: int = 2,
                 expected: float | None = None, period: int = 1):
        self.factor, self.window, self.warmup = factor, window, warmup
        self.period = period
        """Local SGD's sync period: the watch compares whole periods' mean iteration times, since
        one iteration in a period syncs (single iterations alternating fast and slow read as drift)."""
        self._periods = _Periods(period)
        self.expected = expected
        """The cost model's seconds per iteration, when they hold against this run's."""
        self.baseline: float | None = None
        self.reference_name = "start"
        """What the last reported slowdown is relative to: ``start`` (`baseline`) or ``prediction`` (`expected`)."""
        self._seen = 0
        self._recent: deque[float] = deque(maxlen=window)  # a long run keeps only these
        self._next = factor

    @property
    def reference(self) -> float | None:
        """The seconds the last reported slowdown is relative to."""
        return self.expected if self.reference_name == "prediction" else self.baseline

    def add(self, step_s: float, step: int | None = None) -> float | None:
        """Record one iteration's seconds (`step`: its 1-based number, needed with a sync period);
        the slowdown when it crosses the next report level, else None."""
        self._seen += 1
        if self._seen <= self.warmup:
            return None
        if self.period > 1 and step is not None:
            block = self._periods.add(step, step_s)
            if block is None:  # mid-period, or a period cut by the warm-up
                return None
            step_s = statistics.fmean(block)
        self._recent.append(step_s)
        if self.baseline is None:
            if len(self._recent) == self.window:
                self.baseline = statistics.median(self._recent)
                # slow from the start: the baseline cannot show it, the prediction can
                if self.expected and self.baseline >= self.factor * self.expected:
                    self.reference_name = "prediction"
                    return self.baseline / self.expected
            return None
        recent = statistics.median(self._recent)
        ratio = recent / self.baseline if self.baseline > 0 else 0.0
        if ratio >= self._next:
            self.reference_name = "start"
            self._next = 2 * ratio  # once per doubling, not on every slow iteration
            return ratio
        return None


def drift_message(event: dict[str, Any], cluster_file: str | None = None, measuring: bool = False,
                  last_step: int | None = None) -> str:
    """What to tell the user about a ``drift`` event; `cluster_file`: the file an ``--adapt`` run
    follows; `measuring`: the run measures its links in-band on drift (``--measure-links``), after
    the iteration after the drifting one, which asks for it, unless that one is `last_step`, the run's last."""
    measuring = measuring and (last_step is None or event["step"] < last_step - 1)
    period = event.get("sync_period", 1)
    over = f"the last {DRIFT_WINDOW}" + (f" sync periods of {period} iterations" if period > 1 else "")
    if event.get("reference") == "prediction":
        what = (f"iterations are {event['slowdown']:.1f}x slower than the cost model predicts for this plan "
                f"(median {event['recent_step_s']:.3g} s over {over}, predicted "
                f"{event['baseline_step_s']:.3g} s; iteration {event['step']})")
    else:
        what = (f"iterations are {event['slowdown']:.1f}x slower than at the start of this plan (median "
                f"{event['recent_step_s']:.3g} s over {over}, was "
                f"{event['baseline_step_s']:.3g} s; iteration {event['step']})")
    if measuring:
        return what + ": measuring the plan's links after the next iteration"
    what += ": if links or devices changed, "
    if cluster_file is not None:
        return what + (f"re-measure them into {cluster_file} (spantrain profile -o {cluster_file}); this run "
                       "adapts its plan when the file changes")
    return what + ("re-measure them (spantrain profile) and adapt the plan (spantrain plan --from PLAN), then "
                   "continue with spantrain run --resume")


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a metrics file, in file order. Whole lines only: the writer may be half-way
    through the last one, and a killed writer may have left one cut."""
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    records = []
    for line in text[:text.rfind("\n") + 1].splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records


def read_step_records(path: str | Path) -> list[dict[str, Any]]:
    """The iteration records of a metrics file, in file order (events left out; `read_records`)."""
    return [rec for rec in read_records(path) if "loss" in rec and "step" in rec]


TOTALS_IN_SUMMARY = ("start_step", "steps", "loss_first", "loss_last", "skipped_steps")
"""The `iteration_totals` a W&B run's summary shows: the whole run's, where a launch's own
medians (step_s, samples_per_s) stay its own."""


def run_summary(result: dict[str, Any], totals: dict[str, Any]) -> dict[str, Any]:
    """A W&B run's summary at the end of a launch: the launch's own medians (`summarize`'s figures
    in its `result`), the whole run's `totals` (`iteration_totals` from the run's first
    iteration), and where it stopped. The same values whichever part of the run writes them."""
    own = {k: result.get(k) for k in ("steps", "samples_per_s", "step_s", "cpu_s", "loss_first", "loss_last",
                                      "warmup_steps")}
    return {**{k: v for k, v in own.items() if v is not None},
            **{k: totals[k] for k in TOTALS_IN_SUMMARY if totals[k] is not None},
            "stopped_early": result["stopped_early"], "final_step": result["final_step"]}


def iteration_totals(path: str | Path, end: int, start: int | None = None) -> dict[str, Any]:
    """The iterations (start, end] of a metrics file, each as last trained (a resumed run trains
    the ones after its checkpoint again; they count once): ``start_step``, ``steps``, ``losses``,
    ``loss_first``, ``loss_last`` and ``skipped_steps`` (fp16 overflows). `start` None: where
    the file's first iteration began, so the whole run that resumed launches continue (a new run
    refuses a metrics file that holds another run's iterations)."""
    by_step = {rec["step"]: rec for rec in read_step_records(path)}
    if start is None:
        start = min((s for s in by_step if s <= end), default=end + 1) - 1
    kept = [by_step[s] for s in range(start + 1, end + 1) if s in by_step]
    losses = [r["loss"] for r in kept]
    return {"start_step": start, "steps": len(kept), "losses": losses,
            "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
            "skipped_steps": sum(1 for r in kept if r.get("overflow"))}


def _ends_cut(path: Path) -> bool:
    """Whether the file's last line has no newline (a writer stopped half-way through it)."""
    with open(path, "rb") as f:
        if f.seek(0, os.SEEK_END) == 0:
            return False
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\n"


class MetricsLog:
    """Appends step records to a JSON-lines file and mirrors scalars to a `Tracker`."""

    def __init__(self, path: str | Path, tracker: Any | None = None,
                 announce: Callable[[str], None] | None = None, predicted_step_s: float | None = None,
                 prediction_holds: bool = False, sync_period: int = 1):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")  # noqa: SIM115 -- appended to for the whole run, closed by close()
        if _ends_cut(self.path):  # a full disk or a kill cut the last line: this run's first one stays whole
            self._file.write("\n")
        self.tracker = tracker
        self.records: list[dict[str, Any]] = []
        self.drift = DriftWatch(expected=predicted_step_s if prediction_holds else None, period=sync_period)
        self.sync_period = sync_period
        """Local SGD's sync period (1 otherwise): the medians are of whole periods (`summarize`)."""
        self.drift_pending = False
        """Set when a drift event was written; whoever re-measures the links clears it."""
        self.measuring = False
        """Whether the run measures its links on drift (the drift note then says so)."""
        self.last_step: int | None = None
        """The run's last iteration: no measurement follows a drift there."""
        self.announce = announce
        """Called with `drift_message` on drift (torchrun's rank 0; local runs' launcher reads the event)."""
        self.predicted_step_s = predicted_step_s
        """The cost model's seconds per iteration, drawn on W&B's chart beside the measured ones."""
        self.write_error: str | None = None
        """Why the file could not be written (a full disk); nothing more is written to it then."""

    def event(self, name: str, **fields: Any) -> None:
        """A non-iteration line: start, checkpoint, end."""
        self._write({"event": name, **fields})

    def step(self, record: dict[str, Any]) -> None:
        """One iteration's record (see the module docstring)."""
        self.records.append(record)
        self._write(record)
        slowdown = self.drift.add(record["step_s"], record.get("step"))
        if slowdown is not None:
            reference = self.drift.reference
            event = {"step": record["step"], "slowdown": slowdown, "baseline_step_s": reference,
                     "recent_step_s": slowdown * reference,
                     "reference": self.drift.reference_name,
                     **({"sync_period": self.sync_period} if self.sync_period > 1 else {})}
            self.event("drift", **event)
            self.drift_pending = True
            if self.tracker is not None:
                self.tracker.log({"drift_slowdown": slowdown}, step=record["step"])
            if self.announce is not None:
                self.announce(drift_message(event, measuring=self.measuring, last_step=self.last_step))
        if self.tracker is not None:
            scalars = {k: record[k] for k in ("loss", "step_s", "samples_per_s", "loss_scale") if k in record}
            if "overflow" in record:  # fp16: this update was skipped (1) or made (0)
                scalars["skipped_update"] = int(record["overflow"])
            if self.predicted_step_s is not None:
                scalars["predicted_step_s"] = self.predicted_step_s
            for r in record.get("ranks", []):
                for k in ("compute_s", "p2p_wait_s", "sync_s"):
                    scalars[f"rank{r['rank']}/{k}"] = r[k]
            self.tracker.log(scalars, step=record["step"])

    def _write(self, obj: dict[str, Any]) -> None:
        if self.write_error is not None:
            return
        try:
            self._file.write(json.dumps(obj) + "\n")
            self._file.flush()  # the launcher's progress bar and a dying run both read this file
        except OSError as e:  # a full disk: the worker stops the run with a checkpoint, not with this error
            self.write_error = f"cannot write {self.path} ({e.strerror or e})"

    def close(self) -> None:
        with contextlib.suppress(OSError):  # what a failed write left in the buffer cannot go either
            self._file.close()
