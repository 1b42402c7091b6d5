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
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

__all__ = ["MetricsLog", "summarize", "warmup_steps"]


def warmup_steps(n: int) -> int:
    """Iterations left out of medians: the first ones pay for shape inference and connection set-up."""
    return min(2, n // 2)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians after warm-up, first and last loss, over the step records of one run."""
    if not records:
        return {"steps": 0, "samples_per_s": None, "step_s": None, "cpu_s": None, "loss_first": None,
                "loss_last": None}
    steady = records[warmup_steps(len(records)):]
    return {"steps": len(records),
            "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
            "step_s": statistics.median(r["step_s"] for r in steady),
            "cpu_s": statistics.median(r["cpu_s"] for r in steady) if all("cpu_s" in r for r in steady) else None,
            "loss_first": records[0]["loss"], "loss_last": records[-1]["loss"],
            "warmup_steps": warmup_steps(len(records))}


class MetricsLog:
    """Appends step records to a JSON-lines file and mirrors scalars to a `Tracker`."""

    def __init__(self, path: str | Path, tracker: Any | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a")  # noqa: SIM115 -- appended to for the whole run, closed by close()
        self.tracker = tracker
        self.records: list[dict[str, Any]] = []

    def event(self, name: str, **fields: Any) -> None:
        """A non-iteration line: start, checkpoint, end."""
        self._write({"event": name, **fields})

    def step(self, record: dict[str, Any]) -> None:
        """One iteration's record (see the module docstring)."""
        self.records.append(record)
        self._write(record)
        if self.tracker is not None:
            scalars = {k: record[k] for k in ("loss", "step_s", "samples_per_s") if k in record}
            for r in record.get("ranks", []):
                for k in ("compute_s", "p2p_wait_s", "sync_s"):
                    scalars[f"rank{r['rank']}/{k}"] = r[k]
            self.tracker.log(scalars, step=record["step"])

    def _write(self, obj: dict[str, Any]) -> None:
        self._file.write(json.dumps(obj) + "\n")
        self._file.flush()  # the launcher's progress bar and a dying run both read this file

    def close(self) -> None:
        self._file.close()
