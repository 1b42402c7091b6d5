"""A live run adapts to a network change: ``spantrain run --adapt`` on the emulated cee-demo cluster.

The run starts on a two-stage pipeline across the cloud-edge link (cloud-0 -> edge-0,
100 Mbit/s in ``examples/cee-demo.yaml``). Once it has logged iteration ``--change-at``,
this script rewrites the run's cluster file with that link at ``--slow-gbps`` (as a
monitor re-measuring the network would): the emulator reshapes the live link, so the
iteration in flight crawls, and the adapter re-plans and moves the run through a
checkpoint. Printed: seconds per iteration before the change, on the slowed link and on
the new plan (medians, the first two iterations of each plan left out), the iteration the
switch took effect at, the options the adapter weighed (cost-model seconds), the wall
time, and whether every iteration's loss is there exactly once.

``--unannounced``: nobody tells the run. The script changes the emulated network
(``run --emulate-network``) and leaves the run's cluster file as it was; the run notices
by itself: its iterations drift, it measures its links in-band, and re-plans on the
cluster as measured (``--measure-links``, on with ``--adapt``). Then also printed: the
iteration the drift was seen at, and the slowed link as measured.

``--mode netns`` (default) needs root; ``local`` emulates the network in the transport
only (no live reshaping: the change shows from the new plan on); ``none`` runs plain local
processes, no emulation at all (the tests' smoke run: it checks the plumbing, not speeds).

Usage: python experiments/adapt_live.py [--json] [--steps 30] [--change-at 5] [--slow-gbps 0.001]
       [--mode netns|local|none] [--model tiny-gpt] [--planner auto] [--unannounced]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from spantrain.cli import OneLineParser
from spantrain.experiments._args import bad_input

__all__ = ["CLUSTER_FILE", "pipeline_plan", "main"]

CLUSTER_FILE = Path(__file__).resolve().parents[1] / "examples" / "cee-demo.yaml"
"""The cluster of DESIGN.md; its first inter-region link is cloud-a <-> edge-b."""
_WARMUP = 2


def pipeline_plan(num_layers: int, batch: int) -> dict[str, Any]:
    """cloud-0 holds the first half of the layers, edge-0 the rest; 1F1B over up to 8 micro-batches."""
    cut = num_layers // 2
    micro_batches = max(m for m in range(1, 9) if batch % m == 0)
    return {"schedule": "1f1b", "sync": {"mode": "allreduce", "period": 1},
            "pipelines": [{"micro_batch_size": batch // micro_batches, "num_micro_batches": micro_batches,
                           "stages": [{"devices": ["cloud-0"], "layers": [0, cut]},
                                      {"devices": ["edge-0"], "layers": [cut, num_layers]}]}]}


def _swap_when(metrics: Path, step: int, live: Path, slow: dict[str, Any]) -> None:
    """Replace the live cluster file with `slow` once the run has logged iteration `step`."""
    from spantrain.runtime.metrics import read_step_records

    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in read_step_records(metrics)):
            tmp = live.with_suffix(".tmp")
            tmp.write_text(yaml.safe_dump(slow, sort_keys=False))
            os.replace(tmp, live)  # one atomic change, as a careful monitor writes it
            return
        time.sleep(0.02)


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _inputs(args: argparse.Namespace) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(workload, cluster spec, the spec with the slowed link), every flag checked before the run
    (`SpantrainError`): an unknown --model was a traceback, an unknown --planner exit code 1, and a
    --slow-gbps the spec refuses (0, nan) ran the whole run, whose adapter ignored the file it made."""
    from spantrain.cluster import Cluster
    from spantrain.errors import SpantrainError
    from spantrain.plan import Plan
    from spantrain.policies.registry import get_planner
    from spantrain.runtime.preflight import check_run
    from spantrain.workload import load_workload

    if args.unannounced and args.mode != "netns":
        raise SpantrainError(f"--unannounced changes the live network, which only --mode netns reshapes (got --mode "
                             f"{args.mode})")
    if not _WARMUP < args.change_at < args.steps - 2:  # the warm-up iterations are not measured
        raise SpantrainError(f"need {_WARMUP} < --change-at < --steps - 2 (the first {_WARMUP} iterations are "
                             f"warm-up), got --change-at {args.change_at} and --steps {args.steps}")
    workload = load_workload(args.model)
    spec = yaml.safe_load(CLUSTER_FILE.read_text())
    slow = json.loads(json.dumps(spec))
    slow["network"]["links"][0]["gbps"] = args.slow_gbps
    try:
        Cluster.from_spec(slow, "cluster")
    except SpantrainError as e:
        raise SpantrainError(f"--slow-gbps must be a positive link speed in Gbit/s, got {args.slow_gbps:g} "
                             f"({e})") from None
    check_run(Cluster.from_spec(spec, "cluster"),
              workload, Plan.from_dict(pipeline_plan(workload.num_layers, workload.global_batch)), data=None)
    get_planner(args.planner)
    return workload, spec, slow


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--steps", type=int, default=30, help="iterations in all (30)")
    ap.add_argument("--change-at", type=int, default=5, help="change the link after this iteration (5)")
    ap.add_argument("--slow-gbps", type=float, default=0.001, help="the cloud-edge link after the change (0.001)")
    ap.add_argument("--mode", choices=("netns", "local", "none"), default="netns",
                    help="emulator mode, or none for plain local processes (netns)")
    ap.add_argument("--model", default="tiny-gpt", help="workload preset or file (tiny-gpt)")
    ap.add_argument("--planner", default="auto", help="--adapt-planner (auto)")
    ap.add_argument("--unannounced", action="store_true",
                    help="change the emulated network, not the run's cluster file: the run must notice by itself "
                    "(needs --mode netns)")
    args = ap.parse_args(argv)
    from spantrain.errors import SpantrainError

    try:
        workload, spec, slow = _inputs(args)
    except SpantrainError as e:
        return bad_input("adapt_live", e)
    from spantrain.cli import main as spantrain
    from spantrain.runtime.metrics import read_step_records

    with tempfile.TemporaryDirectory(prefix="adapt-live-") as tmp_dir:
        tmp = Path(tmp_dir)
        os.chmod(tmp, 0o755)  # the emulated devices write their checkpoints here
        live, plan_path, run_dir = tmp / "live.yaml", tmp / "plan.json", tmp / "run"
        live.write_text(yaml.safe_dump(spec, sort_keys=False))
        network = tmp / "network.yaml"  # --unannounced: the emulated network, apart from the run's picture
        network.write_text(live.read_text())
        plan_path.write_text(json.dumps(pipeline_plan(workload.num_layers, workload.global_batch)))
        changed = network if args.unannounced else live
        threading.Thread(target=_swap_when, args=(run_dir / "metrics.jsonl", args.change_at, changed, slow),
                         daemon=True).start()
        cmd = ["run", "--cluster", str(live), "--model", args.model, "--plan", str(plan_path), "--steps",
               str(args.steps), "--checkpoint-dir", str(tmp / "ckpt"), "--run-dir", str(run_dir), "--adapt",
               "--adapt-planner", args.planner, "--no-progress", "--json"]
        if args.mode != "none":
            cmd += ["--emulate", "--emulate-mode", args.mode]
        if args.unannounced:
            cmd += ["--emulate-network", str(network)]
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = spantrain(cmd)
        wall = time.monotonic() - t0
        if code != 0:
            raise SystemExit(f"adapt_live: the run failed: {err.getvalue().strip().splitlines()[-1]}")
        result = json.loads(out.getvalue())
        steps = {r["step"]: r["step_s"] for r in read_step_records(run_dir / "metrics.jsonl")}
        events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        events = [e for e in events if "event" in e]
    if not result["adaptations"] or not result["adaptations"][0]["switch"]:
        raise SystemExit("adapt_live: the run did not switch plans; see the notes:\n" + err.getvalue())
    decision = result["adaptations"][0]
    switched = decision["switched_at"]
    new_plan = result["segments"][-1]["plan"]
    figures = {
        "steps": args.steps, "change_at": args.change_at, "switched_at": switched, "mode": args.mode,
        "slow_gbps": args.slow_gbps, "wall_s": round(wall, 1),
        "before_s": _median([steps[s] for s in range(_WARMUP + 1, args.change_at + 1)]),
        "on_slowed_link_s": [steps[s] for s in range(args.change_at + 1, switched + 1)],
        "after_s": _median([steps[s] for s in range(switched + _WARMUP + 1, args.steps + 1)]),
        "new_devices": [st["devices"][0] for p in new_plan["pipelines"] for st in p["stages"]],
        "chosen": decision["chosen"], "options": decision["options"],
        "losses_complete": len(result["losses"]) == args.steps,
        "notes": [line for line in err.getvalue().splitlines()
                  if line.startswith(("spantrain run: note: the cluster", "spantrain run: note: the links"))],
    }
    if args.unannounced:
        drift = next((e for e in events if e["event"] == "drift" and e["step"] > args.change_at), None)
        measured = next((e for e in events if e["event"] == "links" and e["reason"] == "drift"), None)
        link = next((f for f in measured["links"] if {f["a"], f["b"]} == {"cloud-0", "edge-0"}), None) \
            if measured else None
        figures.update(drift_at=drift["step"] if drift else None, measured_at=measured["step"] if measured else None,
                       measure_s=measured["measure_s"] if measured else None,
                       measured_gbps=link["gbps"] if link else None,
                       measured_latency_ms=link["latency_ms"] if link else None, source=decision.get("source"))
    if args.json:
        print(json.dumps(figures))
        return 0
    slowed = ", ".join(f"{x:.2f}" for x in figures["on_slowed_link_s"]) or "none"
    print(f"adapt_live: {args.model} on cee-demo, cloud-0 -> edge-0 pipeline; cloud-edge link 0.1 -> "
          f"{args.slow_gbps:g} Gbit/s after iteration {args.change_at} ({args.mode})")
    print(f"  before the change   {_fmt(figures['before_s'], '.3f')} s/iteration (median)")
    print(f"  on the slowed link  {slowed} s (iterations {args.change_at + 1}..{switched})")
    if args.unannounced and figures["measured_at"] is not None:
        gbps = figures["measured_gbps"]
        print(f"  noticed by itself   drift after iteration {figures['drift_at']}, links measured after iteration "
              f"{figures['measured_at']} in {figures['measure_s']:.1f} s: cloud-0 <-> edge-0 "
              + (f"{gbps * 1e3:.3g} Mbit/s, {figures['measured_latency_ms']:.3g} ms" if gbps is not None else "?"))
    # `switched` is the old plan's last iteration
    print(f"  after the switch    {_fmt(figures['after_s'], '.3f')} s/iteration on {', '.join(figures['new_devices'])} "
          f"(the {decision['chosen']} plan, from iteration {switched + 1})")
    for o in decision["options"]:  # a plan that does not fit has no time (None)
        print(f"  option {o['name']:<10} {_fmt(o['iteration_s'], '.4g')} s/iteration predicted + "
              f"{o['migration_s']:.3g} s to move = {_fmt(o['total_s'], '.4g')} s over {decision['remaining_steps']} "
              "iterations")
    print(f"  every iteration's loss once: {figures['losses_complete']}; wall {wall:.0f} s")
    return 0


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


if __name__ == "__main__":
    from spantrain.experiments._args import run_script

    raise SystemExit(run_script(main, "adapt_live"))
