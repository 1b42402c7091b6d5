"""Time the cost model on a 16-device plan: 4 pipelines x 4 stages, 32 micro-batches,
gpt2-medium, zb-h1, hierarchical sync, on one core.

Three figures, each the median over repeats (the machine may be shared):

- ``evals_per_s``: `CostModel.estimate` of the same plan again and again, as a search
  re-checks its incumbent; every pipeline comes from the per-pipeline memo.
- ``evals_per_s_neighbour``: each estimate changes one pipeline's layer cut (a move of
  a local search / the RL policy): one pipeline simulated, three from the memo.
- ``evals_per_s_cold``: the memo disabled, every pipeline simulated every time.

Usage: python experiments/bench_costmodel.py [--json] [--repeats 7] [--seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
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


def _rate(fn, seconds: float) -> float:
    n = 0
    t0 = time.perf_counter()
    while True:
        for _ in range(50):
            fn()
        n += 50
        dt = time.perf_counter() - t0
        if dt >= seconds:
            return n / dt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.5, help="length of one timing repeat")
    args = ap.parse_args(argv)
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

    state = {"i": 0}
    moved = [warm.flatten(q).keys[:1] for q in neighbours]  # the changed pipeline of each neighbour

    def neighbour():
        state["i"] += 1
        k = state["i"] % len(neighbours)
        warm.clear_memo(moved[k])  # as if this cut had never been tried: simulate it
        warm.estimate(neighbours[k])

    res = {"repeat": [], "neighbour": [], "cold": []}
    for _ in range(args.repeats):
        res["repeat"].append(_rate(lambda: warm.estimate(plan), args.seconds))
        warm.clear_memo()
        warm.estimate(plan)
        res["neighbour"].append(_rate(neighbour, args.seconds))
        res["cold"].append(_rate(lambda: cold.estimate(plan), args.seconds))
    out = {"evals_per_s": statistics.median(res["repeat"]),
           "evals_per_s_neighbour": statistics.median(res["neighbour"]),
           "evals_per_s_cold": statistics.median(res["cold"]),
           "repeats": args.repeats, "kernel_load_s": load_s, "plan_iteration_s": est.iteration_s,
           "devices": len(cluster), "pipelines": 4, "stages": 4, "micro_batches": 32, "model": workload.name,
           "schedule": "zb-h1", "sync": "hierarchical"}
    if args.json:
        sys.stdout.write(json.dumps(out) + "\n")
    else:
        for k, v in out.items():
            print(f"{k:24s} {v:.4g}" if isinstance(v, float) else f"{k:24s} {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
