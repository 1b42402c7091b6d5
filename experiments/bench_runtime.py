"""What the distributed runtime costs over plain training: tiny-gpt (by default) four ways,
and what bf16 mixed precision gains.

1. ``single``: single-process training (`spantrain.runtime.reference`), the whole batch in
   one forward/backward, no torch.distributed at all;
2. ``1x1``: `spantrain run` with one pipeline of one stage (one worker process, gloo, the
   pipelining schedule, metrics all-gather), the batch as one micro-batch: the fixed
   overhead of the runtime;
3. ``1x1-mb``: the same single stage, the batch cut into the 2-stage run's micro-batches:
   what smaller matrix products cost, with no pipeline at all;
4. ``1x2``: `spantrain run` with one pipeline of two stages (two workers, activations and
   gradients sent between them), 1F1B over micro-batches: what pipelining costs on top;
5. ``single-bf16`` and ``1x2-bf16``: 1 and 4 in bf16 mixed precision (``--precision bf16``:
   fp32 weights and AdamW, bf16 compute and activations), against their fp32 twins.

Per configuration: the median over rounds (configurations take turns, so load from other
work hits all alike) of the median step time after warm-up, samples/s and overhead
against ``single``; and the same for CPU seconds per step summed over the processes, which
other work on shared cores disturbs far less than wall time. The runs use the built-in
synthetic corpus and the same seed, so the first losses must agree (printed as a sanity
check). On a machine with fewer cores than workers the processes share cores, so ``1x2``
measures overhead on shared cores, not speed-up.

Usage: python experiments/bench_runtime.py [--json] [--steps 12] [--repeats 3] [--micro-batches 4]
       [--schedule 1f1b] [--model tiny-gpt] [--threads 1] [--track/--no-track]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from spantrain.cli import OneLineParser
from spantrain.experiments._args import bad_input
from spantrain.runtime.config import MAX_THREADS

__all__ = ["bench_cluster", "bench_plan", "main"]

MODEL = "tiny-gpt"
"""The model benchmarked unless --model says otherwise (tests use a smaller one)."""


def bench_cluster() -> dict[str, Any]:
    """Two identical CPU 'devices' in one region."""
    return {"name": "bench-cpu",
            "devices": [{"id": "cpu", "count": 2, "region": "local", "tier": "edge", "tflops": 0.05,
                         "memory_gb": 4}],
            "network": {"regions": {"local": {"gbps": 10, "latency_ms": 0.05}}}}


def bench_plan(stages: int, batch: int, micro_batches: int, schedule: str, n_layers: int) -> dict[str, Any]:
    """One pipeline over `stages` devices, the model's `n_layers` layers cut evenly."""
    cuts = [round(i * n_layers / stages) for i in range(stages + 1)]
    return {"schedule": schedule, "sync": {"mode": "allreduce"},
            "pipelines": [{"micro_batch_size": batch // micro_batches, "num_micro_batches": micro_batches,
                           "stages": [{"devices": [f"cpu-{i}"], "layers": [cuts[i], cuts[i + 1]]}
                                      for i in range(stages)]}]}


def _run(tmp: Path, name: str, model: str, plan: dict[str, Any], steps: int, seed: int, threads: int,
         precision: str) -> dict[str, Any]:
    """`spantrain run` in this process: its workers fork from one fork server that imports torch
    once for all runs (start-up is not what this benchmark measures)."""
    from spantrain.cli import main as spantrain

    plan_path = tmp / f"{name}.json"
    plan_path.write_text(json.dumps(plan))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = spantrain(["run", "--cluster", str(tmp / "cluster.json"), "--model", model, "--plan", str(plan_path),
                          "--steps", str(steps), "--seed", str(seed), "--run-dir", str(tmp / name), "--no-progress",
                          "--threads", str(threads), "--precision", precision, "--json"])
    if code != 0:
        raise SystemExit(f"bench_runtime: {name} failed: {err.getvalue().strip().splitlines()[-1]}")
    return json.loads(out.getvalue())


def _setup(args: argparse.Namespace) -> tuple[str, Any, dict[str, dict[str, Any]]]:
    """(model argument for `spantrain run`, workload, plan of each configuration), every flag checked
    first (`SpantrainError`): a bad one failed with a traceback, or with exit code 1 only after the
    first round's single-process training."""
    from spantrain.cli._common import check_seed
    from spantrain.cluster import Cluster
    from spantrain.errors import SpantrainError
    from spantrain.plan import Plan
    from spantrain.runtime.preflight import check_run
    from spantrain.workload import load_workload

    for flag, value, least in (("--steps", args.steps, 3), ("--repeats", args.repeats, 1),
                               ("--micro-batches", args.micro_batches, 1), ("--threads", args.threads, 1)):
        if value < least:  # --steps: the first iterations are warm-up
            raise SpantrainError(f"{flag} must be at least {least}, got {value}")
    if args.threads > MAX_THREADS:
        raise SpantrainError(f"--threads must be at most {MAX_THREADS}, got {args.threads}")
    check_seed(args.seed)
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    workload = load_workload(model)
    batch, n = workload.global_batch, workload.num_layers
    if batch % args.micro_batches:
        raise SpantrainError(f"--micro-batches must divide the model's batch ({batch}), got {args.micro_batches}")
    configs = {"1x1": bench_plan(1, batch, 1, "gpipe", n),
               "1x1-mb": bench_plan(1, batch, args.micro_batches, "gpipe", n),
               "1x2": bench_plan(2, batch, args.micro_batches, args.schedule, n)}
    configs["1x2-bf16"] = configs["1x2"]
    cluster = Cluster.from_spec(bench_cluster(), "cluster")
    for plan in configs.values():  # an unknown --schedule, a model the runtime cannot build
        check_run(cluster, workload, Plan.from_dict(plan), data=None)
    return model, workload, configs


def main(argv: list[str] | None = None) -> int:
    """Run the configurations round-robin and print their step times."""
    ap = OneLineParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--steps", type=int, default=12, help="iterations per configuration and repeat (12)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds over the configurations (3)")
    ap.add_argument("--micro-batches", type=int, default=4, help="micro-batches of the 2-stage run (4)")
    ap.add_argument("--schedule", default="1f1b", help="schedule of the 2-stage run (1f1b)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=MODEL, help=f"preset or workload file ({MODEL})")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of every process (1: intra-op threads fighting other load for shared "
                         "cores make step times erratic)")
    ap.add_argument("--track", action=argparse.BooleanOptionalAction, default=True,
                    help="log to W&B (offline unless logged in)")
    args = ap.parse_args(argv)
    from spantrain.errors import SpantrainError

    try:
        model, workload, configs = _setup(args)
        if args.track:  # W&B starts after every run: a setting it refuses failed only then
            from spantrain.tracking import check_can_track

            check_can_track()
    except SpantrainError as e:
        return bad_input("bench_runtime", e)

    from spantrain.runtime.metrics import warmup_steps
    from spantrain.runtime.preflight import cpu_cores
    from spantrain.runtime.reference import train_reference
    from spantrain.tracking import Tracker, print_run_line

    batch = workload.global_batch
    skip = warmup_steps(args.steps)
    samples: dict[str, list[float]] = {"single": [], "single-bf16": [], **{k: [] for k in configs}}
    cpu: dict[str, list[float]] = {k: [] for k in samples}
    first_loss: dict[str, float] = {}
    processes = {"single": 1, "single-bf16": 1}
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "cluster.json").write_text(json.dumps(bench_cluster()))
        # Round-robin over the configurations: load from other work on a shared machine then
        # hits all of them alike instead of whichever happened to run at the wrong moment.
        for rep in range(args.repeats):
            for name, precision in (("single", "fp32"), ("single-bf16", "bf16")):
                ref = train_reference(workload, steps=args.steps, batch=batch, seed=args.seed, threads=args.threads,
                                      precision=precision)
                samples[name].append(statistics.median(ref.step_s[skip:]))
                cpu[name].append(statistics.median(ref.cpu_s[skip:]))
                first_loss[name] = ref.losses[0]
            for name, plan in configs.items():
                res = _run(tmp, f"{name}-{rep}", model, plan, args.steps, args.seed, args.threads,
                           "bf16" if name.endswith("-bf16") else "fp32")
                samples[name].append(res["step_s"])
                cpu[name].append(res["cpu_s"])
                first_loss[name] = res["loss_first"]
                processes[name] = res["world_size"]
    rows = [{"config": k, "processes": processes[k], "step_s": statistics.median(v), "step_s_min": min(v),
             "cpu_s": statistics.median(cpu[k]), "loss_first": first_loss[k]} for k, v in samples.items()]
    base, base_cpu = rows[0]["step_s"], rows[0]["cpu_s"]
    for r in rows:
        r["samples_per_s"] = batch / r["step_s"]
        r["overhead_pct"] = 100.0 * (r["step_s"] / base - 1.0)
        r["cpu_overhead_pct"] = 100.0 * (r["cpu_s"] / base_cpu - 1.0)
    out = {"model": workload.name, "batch": batch, "steps": args.steps, "repeats": args.repeats, "warmup_steps": skip,
           "cpu_cores": cpu_cores(), "threads_per_process": args.threads,
           "schedule_1x2": args.schedule, "micro_batches_1x2": args.micro_batches, "rows": rows}

    with Tracker(job_type="bench-runtime", enabled=args.track, config={k: v for k, v in out.items() if k != "rows"},
                 name=f"bench_runtime: {workload.name}") as tracker:
        tracker.log_table("runtime_overhead", list(rows[0]), [list(r.values()) for r in rows])
        tracker.summary({f"{r['config']}/step_s": r["step_s"] for r in rows})
        where = tracker.url_or_dir

    if args.json:
        print(json.dumps(out))
        print_run_line(where, file=sys.stderr)
        return 0
    print(f"{workload.name}, batch {batch}: median over {args.repeats} rounds of the median step time of {args.steps} "
          f"iterations after {skip} warm-up; {args.threads} thread(s) per process, {out['cpu_cores']} CPU cores "
          "(shared with whatever else runs)")
    print(f"{'config':<11} {'procs':>5} {'step s':>9} {'min s':>9} {'samples/s':>10} {'overhead':>9} "
          f"{'CPU s':>8} {'CPU ovh':>8} {'loss[0]':>8}")
    for r in rows:
        print(f"{r['config']:<11} {r['processes']:>5} {r['step_s']:>9.4f} {r['step_s_min']:>9.4f} "
              f"{r['samples_per_s']:>10.1f} {r['overhead_pct']:>8.1f}% {r['cpu_s']:>8.4f} "
              f"{r['cpu_overhead_pct']:>7.1f}% {r['loss_first']:>8.4f}")
    print_run_line(where)
    return 0


if __name__ == "__main__":
    from spantrain.experiments._args import run_script

    raise SystemExit(run_script(main, "bench_runtime"))
