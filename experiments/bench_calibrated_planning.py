"""How much planning for the executor matters, by the cost model: the heuristic's plan made
with the built-in constants against its plan made with a calibration profile, both scored
with that profile (the executor the plans will run on).

Cases: the three calibration clusters (``examples/calibration/``) and generated clusters of
8 and 16 devices of every generator profile (seed 3), with tiny-gpt and gpt2-medium. The
gain is the built-in constants' plan's predicted seconds over the calibrated plan's; 1.0
means both made the same choice (or equally fast ones).

Usage: python experiments/bench_calibrated_planning.py [--json] [--calibration FILE]
(default: the emulated runtime's profile, ``examples/calibration/emulated-cpu.yaml``)
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from spantrain.cli import OneLineParser
from spantrain.cli._common import load_calibration
from spantrain.cluster import Cluster
from spantrain.env.calibration import EMULATED_CPU, Calibration
from spantrain.env.costmodel import estimate
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.profiler.topology import generate
from spantrain.workload import Workload

__all__ = ["cases", "compare_case", "main"]

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("tiny-gpt", "gpt2-medium")


def cases() -> list[tuple[str, Cluster]]:
    """(name, cluster) of every case's cluster."""
    out = [(name, Cluster.from_file(ROOT / "examples" / "calibration" / f"{name}.yaml"))
           for name in ("two-region", "three-site", "cloud-edge-end")]
    out += [(f"{profile}-{n}", generate(n, seed=3, profile=profile))
            for profile in ("cee", "geo", "datacenter") for n in (8, 16)]
    return out


def compare_case(cluster: Cluster, workload: Workload, calibration: Calibration) -> dict:
    """Both plans of one case, scored with `calibration`."""
    planner = HeuristicPlanner()
    builtin = planner.plan(cluster, workload)
    calibrated = planner.plan(cluster, workload, calibration)
    builtin_s = estimate(cluster, workload, builtin, calibration).iteration_s
    calibrated_s = estimate(cluster, workload, calibrated, calibration).iteration_s
    return {"builtin_plan_s": builtin_s, "calibrated_plan_s": calibrated_s, "gain": builtin_s / calibrated_s,
            "same_plan": _layout(builtin) == _layout(calibrated)}


def _layout(plan) -> dict:
    """What a plan does, without the prediction it was made with: that differs between the two
    constants by construction, and the same plan was counted as two ("0 of them" always)."""
    return {k: v for k, v in plan.to_dict().items() if k != "predicted"}


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calibration", type=Path, default=EMULATED_CPU, help="calibration profile (YAML/JSON)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    calibration = load_calibration(str(args.calibration))  # a bad file named by the flag, as in the CLI
    rows = []
    for name, cluster in cases():
        for model in MODELS:
            rows.append({"cluster": name, "model": model,
                         **compare_case(cluster, Workload.from_preset(model), calibration)})
    gains = [r["gain"] for r in rows]
    summary = {"cases": len(rows), "min_gain": min(gains), "median_gain": statistics.median(gains),
               "max_gain": max(gains), "same_plan": sum(r["same_plan"] for r in rows)}
    if args.json:
        print(json.dumps({"calibration": str(args.calibration), "rows": rows, "summary": summary}))
        return 0
    print(f"{'cluster':16s} {'model':12s} {'built-in plan s':>16s} {'calibrated plan s':>18s} {'gain':>6s}")
    for r in rows:
        print(f"{r['cluster']:16s} {r['model']:12s} {r['builtin_plan_s']:16.4g} {r['calibrated_plan_s']:18.4g} "
              f"{r['gain']:6.3f}")
    print(f"gain over {summary['cases']} cases: min {summary['min_gain']:.3f}, median {summary['median_gain']:.3f}, "
          f"max {summary['max_gain']:.3f}; both constants chose the same plan on {summary['same_plan']} of them")
    return 0


if __name__ == "__main__":
    from spantrain.experiments._args import run_script

    raise SystemExit(run_script(main, "bench_calibrated_planning"))
