"""Time the cost model on a 16-device plan: 4 pipelines x 4 stages, 32 micro-batches,
gpt2-medium, zb-h1, hierarchical sync, pinned to one core.

Every figure is the median over repeats (the machine may be shared; repeats take turns
so load from other work hits all figures alike):

- ``evals_per_s`` (the headline): `CostModel.estimate(plan)` with the per-pipeline memo
  disabled, so every pipeline's schedule is simulated every time, as for the new plans
  the RL environment and the planners mostly evaluate.
- ``evals_per_s_fast``: the same, through `CostModel.estimate_fast(plan)` (the three
  numbers a search ranks by, no `Estimate`).
- ``evals_per_s_arrays_fast``: `estimate_fast` of already flattened `PlanArrays`
  (searches that build candidates with `CostModel.arrays` skip `Plan` objects).
- ``evals_per_s_neighbour``: memo enabled, each estimate changes one pipeline's layer
  cut (a local-search or RL move): one pipeline simulated, three from the memo.
- ``evals_per_s_memo_hit``: memo enabled, the same plan again: every pipeline from
  the memo (a search re-checking its incumbent).
- ``cpu_evals_per_s``: the headline per second of this process's CPU time rather than
  wall time (less sensitive to other work on the machine).
- ``kernel_load_s``: the first estimate in this process (loading the compiled kernels
  from numba's cache, or compiling them); ``--compile-time`` also times a first run
  with an empty cache in a fresh process (``compile_s``).

Usage: python experiments/bench_costmodel.py [--json] [--repeats 7] [--seconds 0.5] [--compile-time]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

__all__ = ["bench_plan", "main"]


def bench_plan(cluster, workload, shift: int = 0):
    """4 pipelines x 4 stages over the 16 devices, layer cuts weighted by device speed."""
    from spantrain.plan import Pipeline, Plan, Stage, Sync

    ids = cluster.ids
    L = workload.num_layers
    pipes = []
    for p in range(4):
        devs = [ids[p + 4 * s] for s in range(4)]
        speed = [cluster.device(d).tflops for d in devs]
        cuts = [0]
        for s in range(3):
            share = round(L * sum(speed[: s + 1]) / sum(speed))
            cuts.append(min(max(share, cuts[-1] + 1), L - (3 - s)))
        cuts.append(L)
        if p == 0 and shift:
            cuts[2] = min(max(cuts[2] + shift, cuts[1] + 1), cuts[3] - 1)
        pipes.append(Pipeline(stages=tuple(Stage(devices=(d,), layers=(cuts[i], cuts[i + 1]))
                                           for i, d in enumerate(devs)),
                              micro_batch_size=1, num_micro_batches=32))
    return Plan(pipelines=tuple(pipes), schedule="zb-h1", sync=Sync(mode="hierarchical"))


def _rate(fn, seconds: float, clock=time.perf_counter) -> float:
    n = 0
    t0 = clock()
    while True:
        for _ in range(50):
            fn()
        n += 50
        dt = clock() - t0
        if dt >= seconds:
            return n / dt


_FIRST_RUN = """
import time
t0 = time.perf_counter()
from spantrain.experiments.bench_costmodel import bench_plan
from spantrain.env.costmodel import CostModel
from spantrain.profiler.topology import generate
from spantrain.workload import Workload
cluster = generate(16, seed=0, profile="cee")
workload = Workload.from_preset("gpt2-medium")
t1 = time.perf_counter()
CostModel(cluster, workload).estimate(bench_plan(cluster, workload))
print(time.perf_counter() - t1)
"""


def compile_seconds() -> float:
    """Seconds of the first estimate in a fresh process with an empty numba cache."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        out = subprocess.run([sys.executable, "-c", _FIRST_RUN], env=env, cwd=root, check=True,
                             capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from spantrain.cli import OneLineParser

    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=7, help="timing repeats; figures are their median (default 7)")
    ap.add_argument("--seconds", type=float, default=0.5, help="seconds one timing repeat lasts (0.5)")
    ap.add_argument("--compile-time", action="store_true",
                    help="also time a first run with an empty numba cache (fresh process)")
    args = ap.parse_args(argv)
    from spantrain.experiments._args import bad_input

    # checked before any work: no repeats has no median, and an infinite or nan length never ends
    if args.repeats < 1:
        return bad_input("bench_costmodel", f"--repeats must be >= 1, got {args.repeats}")
    if not 0 <= args.seconds <= 60:  # one repeat's length: 1e300 ran for ever (nan fails both comparisons)
        return bad_input("bench_costmodel", f"--seconds must be from 0 to 60, got {args.seconds:g}")
    compile_s = compile_seconds() if args.compile_time else None
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core

    from spantrain.env.costmodel import CostModel
    from spantrain.profiler.topology import generate
    from spantrain.workload import Workload

    cluster = generate(16, seed=0, profile="cee")
    workload = Workload.from_preset("gpt2-medium")
    plan = bench_plan(cluster, workload)
    neighbours = [bench_plan(cluster, workload, shift) for shift in (-2, -1, 1, 2)]
    t0 = time.perf_counter()
    warm = CostModel(cluster, workload)
    est = warm.estimate(plan)  # loads (or compiles) the kernels
    load_s = time.perf_counter() - t0
    cold = CostModel(cluster, workload, memo=False)
    if cold.estimate(plan) != est or cold.estimate_fast(plan) != (est.iteration_s, est.samples_per_s, est.feasible):
        raise SystemExit("memo and cold paths disagree")
    arrays = cold.flatten(plan)

    state = {"i": 0}
    moved = [warm.flatten(q).keys[:1] for q in neighbours]  # the changed pipeline of each neighbour

    def neighbour():
        state["i"] += 1
        k = state["i"] % len(neighbours)
        warm.clear_memo(moved[k])  # as if this cut had never been tried: simulate it
        warm.estimate(neighbours[k])

    figures = {
        "evals_per_s": lambda: cold.estimate(plan),
        "evals_per_s_fast": lambda: cold.estimate_fast(plan),
        "evals_per_s_arrays_fast": lambda: cold.estimate_fast(arrays),
        "evals_per_s_neighbour": neighbour,
        "evals_per_s_memo_hit": lambda: warm.estimate(plan),
    }
    res: dict[str, list[float]] = {k: [] for k in [*figures, "cpu_evals_per_s"]}
    for _ in range(args.repeats):
        for name, fn in figures.items():
            if name == "evals_per_s_memo_hit":
                warm.clear_memo()
                warm.estimate(plan)
            res[name].append(_rate(fn, args.seconds))
        res["cpu_evals_per_s"].append(_rate(figures["evals_per_s"], args.seconds, time.process_time))
    out: dict[str, object] = {k: statistics.median(v) for k, v in res.items()}
    out.update({"repeats": args.repeats, "kernel_load_s": load_s, "compile_s": compile_s,
                "plan_iteration_s": est.iteration_s, "devices": len(cluster), "pipelines": 4, "stages": 4,
                "micro_batches": 32, "model": workload.name, "schedule": "zb-h1", "sync": "hierarchical",
                "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None})
    if args.json:
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        for k, v in out.items():
            print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    return 0


if __name__ == "__main__":
    from spantrain.experiments._args import run_script

    raise SystemExit(run_script(main, "bench_costmodel"))
