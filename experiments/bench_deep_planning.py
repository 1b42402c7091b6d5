"""Planning deep models: the heuristic's time, peak memory and plan for models of hundreds
to thousands of layers, with the partition DP on coarse cut positions (the default above
`spantrain.env.partition.COARSE_CUTS` layers) against the exact DP on every layer boundary.

Each plan is made in a process of its own, so its peak memory (max RSS) is its own. The
model is a GPT of d_model 256 with `--layers` layers in all (embedding and head included),
global batch 32; the clusters are the shipped examples ``cee-16`` and ``datacenter-32``.
``ratio`` is the predicted iteration time of the coarse plan over the exact one's (< 1: the
coarse plan is faster; its search may take another path). A plan that takes longer than
``--timeout`` is a result, not a failure: its row says ``{"timed_out_s": T}`` ("over T s").

Usage: python experiments/bench_deep_planning.py [--layers 1024 4096] [--exact-up-to 1024] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from spantrain.cli import OneLineParser
from spantrain.errors import SpantrainError

__all__ = ["plan_once", "main"]

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ("cee-16", "datacenter-32")


def _workload(layers: int):
    from spantrain.workload import Workload

    arch = {"family": "gpt2", "vocab_size": 32000, "d_model": 256, "n_layers": layers - 2, "n_heads": 4,
            "d_ff": 1024, "max_seq_len": 1024}
    return Workload.from_spec({"name": f"gpt-{layers}", "global_batch": 32, "seq_len": 512,
                               "architecture": arch}, "model")


def plan_once(cluster_name: str, layers: int, exact: bool) -> dict:
    """Plan in this process: seconds, peak RSS in MB, predicted seconds per iteration."""
    import resource
    import time

    from spantrain.cluster import Cluster
    from spantrain.env import partition
    from spantrain.env.costmodel import estimate
    from spantrain.policies.heuristic import HeuristicPlanner

    if exact:
        partition.COARSE_CUTS = 10**9
    cluster = Cluster.from_file(ROOT / "examples" / f"{cluster_name}.yaml")
    workload = _workload(layers)
    t0 = time.perf_counter()
    plan = HeuristicPlanner().plan(cluster, workload)
    seconds = time.perf_counter() - t0
    return {"plan_s": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "iteration_s": estimate(cluster, workload, plan).iteration_s}


def _in_child(cluster_name: str, layers: int, exact: bool, timeout_s: float) -> dict:
    """The child's figures, or ``{"timed_out_s": timeout_s}`` when it took longer (it is killed):
    one case over the cap ended the whole run in a `TimeoutExpired` traceback."""
    try:
        proc = subprocess.run([sys.executable, __file__, "--one", cluster_name, str(layers), str(int(exact))],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"timed_out_s": timeout_s}
    if proc.returncode != 0:
        # one line (its last: the child's error), not a RuntimeError traceback around its traceback
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no error output"
        raise SpantrainError(f"planning {cluster_name} at {layers} layers failed (exit {proc.returncode}): {last}")
    return json.loads(proc.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[1024, 2048, 4096],
                    help="model depths, embedding and head included (3-4096; default 1024 2048 4096)")
    ap.add_argument("--exact-up-to", type=int, default=1024,
                    help="also plan with the exact DP up to this depth (default 1024; at 4096 it took 165 s on "
                         "datacenter-32, see the README's Deep models)")
    ap.add_argument("--clusters", nargs="+", default=list(CLUSTERS), choices=CLUSTERS)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per plan (default 1800)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(plan_once(args.one[0], int(args.one[1]), bool(int(args.one[2])))))
        return 0
    from spantrain.workload import MAX_LAYERS

    if any(not 3 <= n <= MAX_LAYERS for n in args.layers):
        raise SpantrainError(f"--layers must be in 3-{MAX_LAYERS}")
    if not args.timeout > 0:  # nan too; 0 or less timed every plan out before it started
        raise SpantrainError(f"--timeout must be a number of seconds above 0, got {args.timeout:g}")
    rows = []
    for name in args.clusters:
        for layers in args.layers:
            row = {"cluster": name, "layers": layers, "coarse": _in_child(name, layers, False, args.timeout)}
            row["exact"] = _in_child(name, layers, True, args.timeout) if layers <= args.exact_up_to else None
            if row["exact"] and "iteration_s" in row["exact"] and "iteration_s" in row["coarse"]:
                row["ratio"] = row["coarse"]["iteration_s"] / row["exact"]["iteration_s"]
            rows.append(row)
            if not args.json:
                c, e = row["coarse"], row["exact"]
                exact = "exact not run" if not e else "exact " + _figures(e, 7)
                if "ratio" in row:
                    exact += f", ratio {row['ratio']:.4f}"
                print(f"{name:14s} {layers:5d} layers: coarse {_figures(c, 6)}; {exact}", flush=True)
    if args.json:
        print(json.dumps({"rows": rows}))
    return 0


def _figures(r: dict, width: int) -> str:
    if "timed_out_s" in r:
        return f"over {r['timed_out_s']:g} s (--timeout)"
    return f"{r['plan_s']:{width}.1f} s {r['peak_mb']:6.0f} MB {r['iteration_s']:.4g} s/it"


if __name__ == "__main__":
    from spantrain.experiments._args import run_script

    raise SystemExit(run_script(main, "bench_deep_planning"))
