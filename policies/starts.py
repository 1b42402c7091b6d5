"""Starting plans for the environment: the heuristic's, cached on disk.

Training draws thousands of episodes from a finite pool of scenarios; planning each
with the heuristic costs 0.05-1 s, so starts are computed once (in parallel, with a
progress bar) and kept as JSON under a cache directory keyed by the scenario and the
heuristic's version. A cached start is re-scored on load, so a changed cost model never
serves stale times.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
from collections.abc import Iterable
from pathlib import Path

from spantrain._spec import write_text_atomic
from spantrain.env.evaluator import Candidate, Evaluator, Knobs
from spantrain.env.plan_env import scenario_workload
from spantrain.errors import SpantrainError
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.profiler.topology import generate

__all__ = ["HeuristicStarts", "default_cache_dir"]

# bump when the heuristic's plans change (v2: long pipelines reordered; v3: and trimmed;
# v4: a zero-bubble second pass when no zero-bubble plan fit; v5: the fastest device alone;
# v6: a ZB-H2 structure pass; v7: a GPipe structure pass; v8: lockstep moves; v9: cut moves;
# v10: uneven twins)
_VERSION = "heuristic-v10"


def default_cache_dir() -> Path:
    """``$SPANTRAIN_CACHE/starts``, else ~/.cache/spantrain/starts. An empty ``SPANTRAIN_CACHE``
    counts as unset: as a path it is the working directory, which got a ``./starts``."""
    root = os.environ.get("SPANTRAIN_CACHE", "").strip()
    return Path(root or Path.home() / ".cache" / "spantrain") / "starts"


def _key_name(key: tuple) -> str:
    text = json.dumps([_VERSION, *key])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _plan_one(args: tuple[tuple, str]) -> tuple[tuple, dict | None]:
    key, cache = args
    profile, n, seed, model, batch_scale = key
    ev = Evaluator(generate(n, seed=seed, profile=profile), scenario_workload(model, batch_scale))
    try:
        cand = HeuristicPlanner().best_candidate(ev)
    except SpantrainError:
        record = None
    else:
        record = {"layout": [list(p) for p in cand.layout], "shares": list(cand.shares),
                  "knobs": {"micro_batch_size": cand.knobs.micro_batch_size, "schedule": cand.knobs.schedule,
                            "sync": cand.knobs.sync, "period": cand.knobs.period}}
    path = Path(cache) / f"{_key_name(key)}.json"
    # a half-written file must not pass for a cached start; and the pool's exit after Ctrl-C
    # terminates its workers (SIGTERM), which mid-write left the temporary file behind
    write_text_atomic(path, json.dumps({"key": list(key), "start": record}), (signal.SIGINT, signal.SIGTERM))
    return key, record


def _worker_signals() -> None:
    """A pool worker leaves Ctrl-C and a hang-up to the parent and dies quietly on the pool's
    SIGTERM: forked from `train-policy`, it inherited handlers that turn SIGTERM and SIGHUP into
    an exception, and every worker printed its traceback when the pool closed, in good runs too.
    A hang-up reaches the whole job; a worker it killed would leave its task unanswered and the
    pool waiting for ever (under nohup, where the parent ignores it); the parent decides, and
    its pool's SIGTERM ends the workers when it stops."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def _cached(path: Path) -> tuple[bool, dict | None]:
    """(found, start) of a cache file; an unreadable one, or one not holding a start (JSON of
    another shape: a hand edit, another tool's file), counts as missing."""
    try:
        record = json.loads(path.read_text())["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return False, None
    return (True, record) if record is None or _is_start(record) else (False, None)


def _is_start(record) -> bool:
    """Whether `record` has the shape `_plan_one` writes: layout (device indices per
    pipeline), shares (one per pipeline) and knobs."""
    def ints(xs) -> bool:
        return isinstance(xs, list) and all(type(x) is int for x in xs)

    try:
        layout, shares, knobs = record["layout"], record["shares"], record["knobs"]
        return (isinstance(layout, list) and all(ints(p) and p for p in layout) and ints(shares)
                and len(shares) == len(layout) and isinstance(knobs, dict) and bool(Knobs(**knobs)))
    except (KeyError, TypeError, ValueError):
        return False


class HeuristicStarts:
    """A `StartProvider`: the heuristic's best candidate for a scenario, cached on disk."""

    def __init__(self, cache_dir: str | Path | None = None):
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self._memory: dict[tuple, dict | None] = {}

    def _record(self, key: tuple) -> dict | None:
        if key in self._memory:
            return self._memory[key]
        found, record = _cached(self.cache_dir / f"{_key_name(key)}.json")
        if not found:
            record = _plan_one((key, str(self.cache_dir)))[1]
        self._memory[key] = record
        return record

    def __call__(self, key: tuple, ev: Evaluator) -> Candidate:
        record = self._record(key)
        if record is None:
            raise SpantrainError(f"scenario {key}: the heuristic finds no feasible plan")
        layout = tuple(tuple(p) for p in record["layout"])
        cand = ev.evaluate(layout, tuple(record["shares"]), Knobs(**record["knobs"]))
        if not cand.feasible:
            raise SpantrainError(f"scenario {key}: cached start no longer fits")
        return cand

    def prepare(self, keys: Iterable[tuple], workers: int = 1, progress: bool = True) -> int:
        """Compute every missing start (in `workers` processes); returns how many were missing."""
        missing = []
        for k in dict.fromkeys(keys):
            found, record = _cached(self.cache_dir / f"{_key_name(k)}.json")
            if found:
                self._memory[k] = record  # read once: `__call__` takes it from here
            else:
                missing.append(k)
        if not missing:
            return 0
        from tqdm import tqdm

        jobs = [(k, str(self.cache_dir)) for k in missing]
        # closed on Ctrl-C too: a message after it then starts on a line of its own
        with tqdm(total=len(missing), desc="heuristic starts", unit="plan", disable=not progress) as bar:
            workers = min(workers, len(missing))  # an idle process only costs memory
            if workers > 1:
                # workers ignore Ctrl-C and the pool's exit terminates them: with a
                # ProcessPoolExecutor, Ctrl-C killed a worker mid-queue and the parent hung waiting
                # for it; here the parent alone raises KeyboardInterrupt, and the starts already
                # written stay cached
                with multiprocessing.Pool(workers, initializer=_worker_signals) as pool:
                    for key, record in pool.imap_unordered(_plan_one, jobs, chunksize=4):
                        self._memory[key] = record
                        bar.update()
            else:
                for job in jobs:
                    key, record = _plan_one(job)
                    self._memory[key] = record
                    bar.update()
        return len(missing)
