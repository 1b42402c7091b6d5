"""Calibrate the cost model against real training on local emulated clusters.

For each cluster of the suite (``examples/calibration/suite.yaml``):

1. profile it: ``spantrain profile --cluster SPEC --cpus N`` on the emulator, which writes
   a measured spec (per-layer times of the model on every device under its CPU quota,
   every pair's bandwidth and latency), `profiles` times spread over the cluster's runs
   (before them, then after each repeat) and combined per device by the median of its
   compute figures (`median_profile`): this machine's speed wanders by 10-20 % over tens
   of seconds, all devices together, and one profile's compute phase is a snapshot of
   such a phase (three profiles of one cluster put a device up to 45 % apart);
2. predict every plan with the cost model fed by that measured spec and the calibration
   profile (``--calibration``, default ``examples/calibration/emulated-cpu.yaml``), and
   also with the uncalibrated defaults, to show what calibration changed;
3. run every plan: ``spantrain run --emulate`` on the same emulated cluster, `steps`
   iterations, `repeats` times (plans take turns, so slow phases of a loaded machine hit
   all alike); the measured figure is the median over repeats of each run's steady-state
   step time (the median after the warm-up iterations; for local SGD with period H, the
   median of H-step windows' means, since sync iterations are slower than the others).

Reported per plan: predicted and measured seconds per iteration and the relative error;
overall: mean absolute percentage error (MAPE), the largest error, and per cluster
whether the ranking is preserved (the plan predicted to have the highest samples/s is
measured fastest or within 5 % of it). A rich table on stdout, or with ``--json`` one
object; the raw measurements, the scatter plot of predicted against measured and the
JSON go to ``--out`` (``experiments/results/``: ``calibration[-quick].{json,png}``); W&B
gets the config, the table, the summary and the plot (offline unless logged in).

``--measurements FILE`` re-predicts stored measurements (a previous run's JSON) with the
current cost model and calibration, without running anything: how a model change was
checked against the same measured runs. ``--fit NAMES`` fits those constants to the
measurements (`calibrate_fit`), reports with them and prints a leave-one-cluster-out check;
the values go into the calibration file by hand, with their documentation. ``--quick``
runs the suite's smoke subset.

Usage: python experiments/calibrate.py [--json] [--quick] [--suite FILE] [--calibration FILE]
       [--out DIR] [--measurements FILE] [--fit NAMES] [--repeats N] [--steps N] [--track/--no-track]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spantrain.cli import OneLineParser
from spantrain.cluster import LayerTimes
from spantrain.experiments._args import bad_input
from spantrain.experiments.calibrate_report import (
    cluster_summary,
    plan_row,
    print_table,
    scatter_plot,
    suite_summary,
)

__all__ = ["PlanCase", "ClusterCase", "Suite", "load_suite", "steady_step_s", "median_profile", "predict", "main"]

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "examples" / "calibration" / "suite.yaml"
CALIBRATION = ROOT / "examples" / "calibration" / "emulated-cpu.yaml"
RESULTS = ROOT / "experiments" / "results"


# ---- the suite -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanCase:
    name: str
    plan: dict[str, Any]
    """Plan-file dict."""


@dataclass(frozen=True)
class ClusterCase:
    spec: Path
    plans: list[PlanCase]


@dataclass(frozen=True)
class Suite:
    model: str
    cpus: float
    steps: int
    warmup: int
    repeats: int
    clusters: list[ClusterCase]
    profile_budget_s: float = 60.0
    profiles: int = 1
    """Profiles per cluster, combined by `median_profile` (module docstring)."""


def _plan_dict(compact: Any) -> dict[str, Any]:
    """``[schedule, sync, period, [[mbs, nmb, [[device, first, end], ...]], ...]]`` -> a plan dict,
    or TypeError / ValueError when `compact` has another shape."""
    schedule, sync, period, pipes = compact
    return {"schedule": schedule, "sync": {"mode": sync, "period": int(period)},
            "pipelines": [{"micro_batch_size": int(mbs), "num_micro_batches": int(nmb),
                           "stages": [{"devices": [d], "layers": [int(a), int(b)]} for d, a, b in stages]}
                          for mbs, nmb, stages in pipes]}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# key -> (what it must be, test); the suite's figures and its quick subset's
_SUITE_FIELDS: dict[str, tuple[str, Any]] = {
    "model": ("a model preset or file", lambda v: isinstance(v, str) and bool(v)),
    "cpus": ("a number of cores > 0", lambda v: _is_number(v) and v > 0),
    "steps": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "warmup": ("an integer >= 0", lambda v: _is_int(v) and v >= 0),
    "repeats": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "profile_budget_s": ("a number of seconds > 0", lambda v: _is_number(v) and v > 0),
    "profiles": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
}


def load_suite(path: Path = SUITE, quick: bool = False) -> Suite:
    """The suite file (format in its header); `quick`: its smoke subset. A file that cannot be
    read or is not a suite is a `SpantrainError` naming the path and the problem."""
    import yaml

    from spantrain.errors import SpantrainError

    _refuse_pipes(path, str(path))
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise SpantrainError(f"{path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        first = str(e).strip().splitlines()[0]  # yaml's messages run over lines
        raise SpantrainError(f"{path}: not a calibration suite (not YAML: {first})") from None

    def bad(what: str) -> SpantrainError:
        return SpantrainError(f"{path}: not a calibration suite ({what})")

    def field(obj: dict, key: str, where: str, required: bool = True) -> Any:
        if key not in obj:
            if required:
                raise bad(f"{where}missing {key!r}")
            return None
        what, ok = _SUITE_FIELDS[key]
        if not ok(obj[key]):
            raise bad(f"{where}{key} must be {what}, got {obj[key]!r}")
        return obj[key]

    if not isinstance(raw, dict):
        raise bad(f"expected a mapping, got {type(raw).__name__}")
    if not isinstance(raw.get("clusters"), list) or not raw["clusters"]:
        raise bad("missing 'clusters'" if "clusters" not in raw else "clusters must be a non-empty list")
    base = Path(path).parent
    clusters = []
    for i, c in enumerate(raw["clusters"]):
        where = f"clusters[{i}]"
        if not isinstance(c, dict) or not isinstance(c.get("spec"), str) or not isinstance(c.get("plans"), dict):
            raise bad(f"{where} must be a mapping with spec (a file name) and plans (name: plan)")
        plans = []
        for name, compact in c["plans"].items():
            try:
                plans.append(PlanCase(str(name), _plan_dict(compact)))
            except (TypeError, ValueError) as e:
                raise bad(f"{where} plan {name!r} is not [schedule, sync, period, pipelines]: {e}") from None
        clusters.append(ClusterCase(spec=base / c["spec"], plans=plans))
    suite = Suite(model=field(raw, "model", ""), cpus=float(field(raw, "cpus", "")), steps=field(raw, "steps", ""),
                  warmup=field(raw, "warmup", ""), repeats=field(raw, "repeats", ""), clusters=clusters,
                  profile_budget_s=float(field(raw, "profile_budget_s", "", False) or Suite.profile_budget_s),
                  profiles=field(raw, "profiles", "", False) or Suite.profiles)
    if not quick:
        return suite
    q = raw.get("quick")
    if not isinstance(q, dict):
        raise bad("--quick needs a 'quick' mapping: cluster, plans, steps, warmup, repeats, profile_budget_s")
    case = next((c for c in clusters if c.spec.name == q.get("cluster")), None)
    if case is None:
        raise bad(f"quick: cluster must be the spec of one of clusters, got {q.get('cluster')!r}")
    names = q.get("plans")
    known = {p.name for p in case.plans}
    if not isinstance(names, list) or not names or not set(map(str, names)) <= known:
        raise bad(f"quick: plans must be a list of {case.spec.name}'s plans ({', '.join(sorted(known))}), "
                  f"got {names!r}")
    plans = [p for p in case.plans if p.name in set(map(str, names))]
    return Suite(model=suite.model, cpus=float(field(q, "cpus", "quick: ", False) or suite.cpus),
                 steps=field(q, "steps", "quick: "), warmup=field(q, "warmup", "quick: "),
                 repeats=field(q, "repeats", "quick: "), clusters=[ClusterCase(case.spec, plans)],
                 profile_budget_s=float(field(q, "profile_budget_s", "quick: ")))


# ---- measuring -----------------------------------------------------------------------------------


def _spantrain(*args: str, timeout: float) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "spantrain", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline")})
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"calibrate: `spantrain {' '.join(args[:3])} ...` failed ({proc.returncode}): {tail[0]}")
    return proc


def profile_cluster(spec: Path, suite: Suite, out: Path) -> dict[str, Any]:
    """Profile `spec` on the emulator; the measured spec (as a dict) and the profiler's document."""
    import yaml

    proc = _spantrain("profile", "--cluster", str(spec), "--cpus", str(suite.cpus), "--model", suite.model,
                      "--budget-s", str(suite.profile_budget_s), "-o", str(out), "--json", timeout=600)
    return {"spec": yaml.safe_load(out.read_text()), "document": json.loads(proc.stdout)}


def median_profile(specs: list[dict[str, Any]]) -> dict[str, Any]:
    """Measured specs of one cluster combined: the first, with every device's TFLOP/s and
    per-layer times the median over all (links as the first measured them: the kernel
    shapes them, they do not wander)."""
    import statistics

    if len(specs) == 1:
        return specs[0]
    by_id = [{d["id"]: d for d in s["devices"]} for s in specs]
    devices = []
    for d in specs[0]["devices"]:
        same = [b[d["id"]] for b in by_id]
        d = {**d, "tflops": statistics.median(x["tflops"] for x in same)}
        if "layer_times" in d:
            # in seconds: a profile writes a list in forward_s/backward_s where no ms figure reads back
            times = [{m: LayerTimes(batch=lt["batch"], forward_s=_seconds(lt, "forward"),
                                    backward_s=_seconds(lt, "backward"))
                      for m, lt in x["layer_times"].items()} for x in same]
            d["layer_times"] = {m: LayerTimes(batch=first.batch, **{
                k: tuple(statistics.median(col) for col in zip(*(getattr(t[m], k) for t in times), strict=True))
                for k in ("forward_s", "backward_s")}).to_spec() for m, first in times[0].items()}
        devices.append(d)
    return {**specs[0], "devices": devices}


def _seconds(times: dict[str, Any], which: str) -> tuple[float, ...]:
    """A spec's measured `which` (forward, backward) layer times in seconds, from either key."""
    if f"{which}_s" in times:
        return tuple(float(t) for t in times[f"{which}_s"])
    return tuple(float(t) / 1e3 for t in times[f"{which}_ms"])  # as the cluster spec reads them


def steady_step_s(step_s: list[float], warmup: int, period: int = 1) -> float:
    """Steady-state seconds per iteration of one run: the median, after `warmup` iterations, of the
    means of aligned `period`-iteration windows (each holds one local-SGD sync iteration)."""
    import statistics

    first = -(-warmup // period) * period  # the first window starts on a period boundary
    windows = [step_s[k:k + period] for k in range(first, len(step_s) - period + 1, period)]
    if not windows:
        raise ValueError(f"{len(step_s)} iterations leave no steady-state window after {warmup} warm-up")
    return statistics.median(sum(w) / period for w in windows)


def _period(case: PlanCase) -> int:
    """Iterations of one steady-state window of `case`'s plan (`steady_step_s`)."""
    return case.plan["sync"]["period"] if case.plan["sync"]["mode"] == "local-sgd" else 1


def min_steps(suite: Suite) -> int:
    """The fewest iterations a run of every plan of `suite` needs for one steady-state window."""
    return max(-(-suite.warmup // p) * p + p for p in (_period(c) for cl in suite.clusters for c in cl.plans))


def run_plan(spec: Path, case: PlanCase, suite: Suite, work: Path, repeat: int) -> dict[str, Any]:
    """One emulated run of a plan: its per-iteration seconds, load average and steady-state figure."""
    plan_path = work / f"{case.name}.plan.json"
    plan_path.write_text(json.dumps(case.plan))
    run_dir = work / f"{case.name}-{repeat}"
    load0 = os.getloadavg()
    t0 = time.monotonic()
    _spantrain("run", "--emulate", "--emulate-mode", "netns", "--emulate-cpus", str(suite.cpus), "--cluster",
               str(spec), "--model", suite.model, "--plan", str(plan_path), "--steps", str(suite.steps),
               "--run-dir", str(run_dir), "--no-progress", "--json", timeout=900)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "step_s" in r]
    steps = [r["step_s"] for r in records]
    return {"step_s": steps, "steady_s": steady_step_s(steps, suite.warmup, _period(case)),
            "wall_s": time.monotonic() - t0,
            "loadavg_before": list(load0), "loadavg_after": list(os.getloadavg()),
            "ranks": _rank_medians(records[suite.warmup:])}


def _rank_medians(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank, the median over steady-state iterations of its compute, transfer-wait, sync and CPU seconds."""
    import statistics

    keys = ("compute_s", "p2p_wait_s", "sync_s", "cpu_s")
    return [{"device": r["device"], **{k: statistics.median(rec["ranks"][i][k] for rec in records) for k in keys}}
            for i, r in enumerate(records[0]["ranks"])] if records else []


# ---- predicting ----------------------------------------------------------------------------------


def predict(profiled_spec: dict[str, Any], model: str, plan: dict[str, Any], calibration) -> dict[str, Any]:
    """The cost model's estimate of `plan` on the measured cluster."""
    from spantrain.cluster import Cluster
    from spantrain.env.costmodel import CostModel
    from spantrain.plan import Plan
    from spantrain.workload import load_workload

    cluster = Cluster.from_spec(profiled_spec, "profiled spec")
    est = CostModel(cluster, load_workload(model), calibration, memo=False).estimate(Plan.from_dict(plan, "plan"))
    return {"iteration_s": est.iteration_s, "pipeline_s": list(est.pipeline_s), "sync_s": est.sync_s,
            "exposed_comm_s": est.exposed_comm_s, "optimizer_s": est.optimizer_s}


# ---- the whole suite -----------------------------------------------------------------------------


def measure(suite: Suite, work: Path, log) -> dict[str, Any]:
    """Profile every cluster and run every plan `repeats` times; the raw measurements."""
    out: dict[str, Any] = {"model": suite.model, "cpus": suite.cpus, "steps": suite.steps, "warmup": suite.warmup,
                           "repeats": suite.repeats, "clusters": []}
    for c in suite.clusters:
        cwork = work / c.spec.stem
        cwork.mkdir(parents=True, exist_ok=True)
        profiles: list[dict[str, Any]] = []
        runs: dict[str, list[dict[str, Any]]] = {p.name: [] for p in c.plans}
        for r in range(suite.repeats):
            if len(profiles) < suite.profiles:  # before the runs, then between repeats
                _profile_again(c.spec, suite, cwork, profiles, log)
            for p in c.plans:
                res = run_plan(c.spec, p, suite, cwork, r)
                runs[p.name].append(res)
                log(f"calibrate: {c.spec.stem}/{p.name} run {r + 1}/{suite.repeats}: {res['steady_s']:.3f} s/it "
                    f"(load {res['loadavg_before'][0]:.2f})")
        while len(profiles) < suite.profiles:
            _profile_again(c.spec, suite, cwork, profiles, log)
        prof = {"spec": median_profile([x["spec"] for x in profiles]),
                "document": profiles[0]["document"], "profiles": profiles}
        out["clusters"].append({"spec": str(c.spec.relative_to(ROOT) if c.spec.is_relative_to(ROOT) else c.spec),
                                "spec_data": _read_spec(c.spec), "profile": prof,
                                "plans": [{"name": p.name, "plan": p.plan, "runs": runs[p.name]} for p in c.plans]})
    return out


def _profile_again(spec: Path, suite: Suite, work: Path, profiles: list[dict[str, Any]], log) -> None:
    """Append one more profile of `spec` to `profiles`."""
    log(f"calibrate: profiling {spec.name}, {len(profiles) + 1}/{suite.profiles} "
        f"(load average {os.getloadavg()[0]:.2f})")
    profiles.append(profile_cluster(spec, suite, work / f"profiled-{len(profiles)}.yaml"))


def _read_spec(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())


def evaluate(measured: dict[str, Any], calibration, with_default: bool = True) -> dict[str, Any]:
    """Predictions (with `calibration`, and with the built-in defaults unless `with_default` is
    false) against the measurements, with the summary figures."""
    import statistics

    from spantrain.env.calibration import Calibration

    clusters = []
    for c in measured["clusters"]:
        rows = []
        for p in c["plans"]:
            m = statistics.median(r["steady_s"] for r in p["runs"])
            pred = predict(c["profile"]["spec"], measured["model"], p["plan"], calibration)
            base = predict(c["profile"]["spec"], measured["model"], p["plan"], Calibration()) if with_default \
                else None
            rows.append(plan_row(p["name"], p["plan"], pred, base["iteration_s"] if base else None, m,
                                 [r["steady_s"] for r in p["runs"]]))
        clusters.append({"cluster": c["spec_data"]["name"], "spec": c.get("spec"), "plans": rows,
                         "ranking": cluster_summary(rows)})
    return {"clusters": clusters, **suite_summary(clusters)}


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    ap.add_argument("--quick", action="store_true", help="the suite's smoke subset (one cluster, two plans)")
    ap.add_argument("--suite", type=Path, default=SUITE, help="suite file (default examples/calibration/suite.yaml)")
    ap.add_argument("--calibration", type=Path, default=CALIBRATION,
                    help="calibration profile for the predictions (default examples/calibration/emulated-cpu.yaml)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="where the JSON and the plot go (experiments/results)")
    ap.add_argument("--measurements", type=Path, metavar="FILE",
                    help="re-predict the measurements stored in FILE (a previous run's JSON) instead of running")
    ap.add_argument("--repeats", type=int, help="runs per plan (default: the suite's)")
    ap.add_argument("--steps", type=int, help="iterations per run (default: the suite's)")
    ap.add_argument("--track", action=argparse.BooleanOptionalAction, default=True,
                    help="log to Weights & Biases (offline unless logged in; default on)")
    ap.add_argument("--fit", metavar="NAMES",
                    help="comma-separated calibration constants to fit to the measurements (starting from "
                         "--calibration); prints them with a leave-one-cluster-out check, and reports with them")
    args = ap.parse_args(argv)
    from spantrain.errors import SpantrainError

    try:
        if args.track:  # W&B starts after the whole suite (50 min): a setting it refuses failed only then
            from spantrain.tracking import check_can_track

            check_can_track()
        calibration, measured, suite = _inputs(args)
    except SpantrainError as e:
        return bad_input("calibrate", e)

    log = lambda msg: print(msg, file=sys.stderr, flush=True)
    stem = "calibration-quick" if args.quick else "calibration"
    command = "python experiments/calibrate.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if measured is None:
        from spantrain.runtime.emulator import netns

        reason = netns.unavailable_reason()
        if reason is not None:
            raise SystemExit(f"calibrate: needs the emulator's network namespaces ({reason})")
        if args.repeats or args.steps:
            suite = Suite(**{**suite.__dict__, "repeats": args.repeats or suite.repeats,
                             "steps": args.steps or suite.steps})
        with tempfile.TemporaryDirectory(prefix="spantrain-calibrate-") as tmp:
            os.chmod(tmp, 0o755)  # the emulated devices write their run directories here
            measured = measure(suite, Path(tmp), log)
        measured["command"] = command
    fitted = None
    if args.fit:
        calibration, fitted = _fit(measured, calibration, args.fit, log)
    report = evaluate(measured, calibration)
    if fitted is not None:
        report["fit"] = fitted
    report.update({"command": measured.get("command", command), "calibration_file": str(args.calibration),
                   "calibration": calibration.to_dict(), "model": measured["model"], "cpus": measured["cpus"],
                   "loadavg": _load_range(measured)})
    plot = args.out / f"{stem}.png"
    scatter_plot(report, plot)
    (args.out / f"{stem}.json").write_text(json.dumps({**report, "plot": str(plot), "measurements": measured},
                                                      indent=1) + "\n")
    where = _track(report, plot, args.quick) if args.track else ""
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    from spantrain.tracking import print_run_line

    print_run_line(where, file=sys.stderr if args.json else sys.stdout)
    return 0


def _inputs(args: argparse.Namespace) -> tuple[Any, dict[str, Any] | None, Suite | None]:
    """(calibration, stored measurements or None, suite to measure or None), every flag checked
    before any work (`SpantrainError`): a bad --measurements or --out was a traceback, a bad --fit
    name ended the run only after the whole measurement, and --repeats 0 ran the suite's count."""
    from spantrain.cli._common import check_dir_option, load_calibration
    from spantrain.errors import SpantrainError

    for flag, value in (("--repeats", args.repeats), ("--steps", args.steps)):
        if value is not None and value < 1:
            raise SpantrainError(f"{flag} must be at least 1, got {value}")
    calibration = load_calibration(str(args.calibration))  # a bad file named by the flag, as in the CLI
    if args.fit:
        _fit_names(calibration, args.fit, f"--calibration {args.calibration}")
    check_dir_option("--out", args.out, creatable=True)
    measured = suite = None
    if args.measurements:
        measured = _load_measurements(args.measurements)
    else:
        try:
            suite = load_suite(args.suite, args.quick)
        except SpantrainError as e:  # it names the file
            raise SpantrainError(f"--suite {e}") from None
        if args.steps is not None:  # else each run failed after the whole profiling phase
            need = min_steps(suite)
            if args.steps < need:
                raise SpantrainError(f"--steps must be at least {need} (the suite's {suite.warmup} warm-up iterations, "
                                     f"then one steady-state window of its longest local-SGD period), got {args.steps}")
    check_dir_option("--out", args.out, create=True)  # once every input has loaded: a bad one leaves none behind
    return calibration, measured, suite


def _load_measurements(path: Path) -> dict[str, Any]:
    """The measurements stored in a previous run's JSON (--measurements), or `SpantrainError`."""
    from spantrain.errors import SpantrainError

    _refuse_pipes(path, f"--measurements {path}")
    try:
        measured = json.loads(path.read_text())["measurements"]
    except OSError as e:
        raise SpantrainError(f"--measurements {path}: {e.strerror or e}") from None
    except (ValueError, LookupError, TypeError) as e:
        raise SpantrainError(f"--measurements {path}: not a calibration JSON with measurements "
                             f"({type(e).__name__}: {e}); pass a calibration.json this script wrote") from None
    if not isinstance(measured, dict):
        raise SpantrainError(f"--measurements {path}: not a calibration JSON with measurements; pass a "
                             "calibration.json this script wrote")
    problem = _measurements_problem(measured)
    if problem:  # a trimmed or hand-made file ended in a KeyError or ZeroDivisionError traceback
        raise SpantrainError(f"--measurements {path}: {problem}; pass a calibration.json this script wrote")
    return measured


def _refuse_pipes(path: Path, shown: str) -> None:
    """`SpantrainError` (naming the file as `shown`) for a pipe or device given as a file: reading
    a FIFO waited for a writer forever."""
    import stat

    from spantrain.errors import SpantrainError

    try:
        mode = Path(path).stat().st_mode
    except OSError:  # missing or unreadable: the read says so
        return
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise SpantrainError(f"{shown}: is a pipe or device, not a regular file; save what it gives to a file and "
                             "pass that file's path")


def _measurements_problem(measured: dict[str, Any]) -> str | None:
    """What a stored measurements object lacks that re-predicting it reads, or None."""
    import math

    for key in ("model", "cpus", "clusters"):
        if key not in measured:
            return f"its measurements have no {key!r}"
    clusters = measured["clusters"]
    if not isinstance(clusters, list) or not clusters:
        return "its measurements hold no clusters"
    for i, c in enumerate(clusters):
        where = f"cluster {i}"
        if not isinstance(c, dict) or not isinstance(c.get("spec_data"), dict) or "name" not in c["spec_data"] \
                or not isinstance(c.get("profile"), dict) or "spec" not in c["profile"]:
            return f"{where} lacks its spec_data name or profile spec"
        if not isinstance(c.get("plans"), list) or not c["plans"]:
            return f"{where} holds no plans"
        for j, plan in enumerate(c["plans"]):
            if not isinstance(plan, dict) or "name" not in plan or "plan" not in plan \
                    or not isinstance(plan.get("runs"), list) or not plan["runs"]:
                return f"{where} plan {j} lacks its name, plan or runs"
            for run in plan["runs"]:
                t = run.get("steady_s") if isinstance(run, dict) else None
                if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
                    return f"{where} plan {j}: a run's steady_s is not a positive number of seconds"
                if not isinstance(run.get("loadavg_before"), list) or not run["loadavg_before"]:
                    return f"{where} plan {j}: a run lacks its loadavg_before"
    return None


def _fit_names(calibration, names_arg: str, source: str = "the calibration profile") -> list[str]:
    """--fit's constants, or `SpantrainError` naming those that are not numeric calibration constants."""
    import dataclasses

    from spantrain.errors import SpantrainError

    known = {f.name for f in dataclasses.fields(calibration)}
    names = [n.strip() for n in names_arg.split(",") if n.strip()]
    # a constant the profile leaves unset (None: derived from the model) is numeric, but has no
    # value to start the fit from: it was refused as "not numeric", which sent users looking for a typo
    unset = [n for n in names if n in known and getattr(calibration, n) is None]
    bad = [n for n in names if n not in known or (n not in unset and not isinstance(getattr(calibration, n), float))]
    if bad or not names:
        raise SpantrainError(f"--fit takes numeric calibration constants, not {', '.join(bad) or 'nothing'}")
    if unset:
        raise SpantrainError(f"--fit {', '.join(unset)}: unset in {source} (the cost model derives it from the "
                             f"model), so the fit has no value to start from; set {' and '.join(unset)} in the "
                             "profile, then fit")
    return names


def _fit(measured: dict[str, Any], calibration, names_arg: str, log) -> tuple[Any, dict[str, Any]]:
    """Fit the named constants; the fitted calibration and what to report about the fit."""
    from spantrain.experiments.calibrate_fit import cross_validate, fit

    names = _fit_names(calibration, names_arg)
    cal, mape = fit(measured, calibration, names, evaluate)
    folds = cross_validate(measured, calibration, names, evaluate) if len(measured["clusters"]) > 1 else []
    values = {n: getattr(cal, n) for n in names}
    log("calibrate: fitted " + ", ".join(f"{n} = {v:.4g}" for n, v in values.items()) + f" (MAPE {mape:.1%})")
    for f in folds:
        log(f"calibrate: fitted without {f['held_out']}: MAPE there {f['mape']:.1%} (max {f['max_abs_error']:.1%}), "
            + ", ".join(f"{n} = {f[n]:.4g}" for n in names))
    return cal, {"names": names, "values": values, "mape": mape, "leave_one_cluster_out": folds}


def _load_range(measured: dict[str, Any]) -> list[float]:
    """Lowest and highest 1-minute load average seen at the start of a run."""
    loads = [r["loadavg_before"][0] for c in measured["clusters"] for p in c["plans"] for r in p["runs"]]
    return [min(loads), max(loads)] if loads else []


def _track(report: dict[str, Any], plot: Path, quick: bool) -> str:
    """Log the report to W&B; returns where the run is (`Tracker.url_or_dir`)."""
    from spantrain.tracking import Tracker

    cols = ["cluster", "plan", "schedule", "sync", "pipelines", "stages", "batch", "predicted_s", "measured_s",
            "error", "default_s", "default_error"]
    rows = [[c["cluster"], *[p[k] for k in cols[1:]]] for c in report["clusters"] for p in c["plans"]]
    with Tracker(job_type="calibrate", config={k: report[k] for k in ("command", "calibration", "model", "cpus")},
                 name=f"calibrate: {report['model']}" + (" (quick)" if quick else ""),
                 tags=["quick"] if quick else None) as t:
        t.log_table("calibration", cols, rows)
        t.log_image("predicted_vs_measured", plot)
        t.summary({k: report[k] for k in ("mape", "max_abs_error", "ranking_preserved", "default_mape")})
        return t.url_or_dir


if __name__ == "__main__":
    from spantrain.experiments._args import run_script

    raise SystemExit(run_script(main, "calibrate"))
