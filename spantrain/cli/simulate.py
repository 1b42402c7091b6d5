"""`spantrain simulate`: predict one iteration of a plan with the cost model."""

from __future__ import annotations

import argparse

from spantrain._spec import readable
from spantrain.cli._common import (
    add_calibration_arg,
    add_cluster_arg,
    add_json_arg,
    add_model_args,
    load_calibration,
    load_cluster,
    load_model,
    load_plan,
    note_cpu_devices,
    print_json,
    stdout_console,
    styled,
)
from spantrain.cli._figure import FIGURE_FORMATS, check_figure_path
from spantrain.estimate import fmt_gb

__all__ = ["register", "run"]

def register(p: argparse.ArgumentParser) -> None:
    add_cluster_arg(p)
    add_model_args(p)
    p.add_argument("--plan", "-p", required=True, metavar="FILE", help="plan JSON file")
    add_json_arg(p)
    p.add_argument("--timeline", metavar="PNG",
                   help=f"also draw a Gantt chart of the iteration to this file ({', '.join(FIGURE_FORMATS)})")
    add_calibration_arg(p, "for the prediction")
    p.set_defaults(func=run)


def _stage_rows(model, plan, stage_out):
    """Per pipeline, per stage: the figures the table and the JSON show."""
    out = []
    g = 0
    for pipe in plan.pipelines:
        rows = []
        for st in pipe.stages:
            d = model.device_index(st.device)
            f, b, w, _, held, mem = stage_out[g, :6].tolist()
            rows.append({"device": st.device, "layers": list(st.layers), "f_ms": f * 1e3, "b_ms": b * 1e3,
                         "w_ms": w * 1e3, "in_flight": int(held), "memory_gb": mem / 1e9,
                         "capacity_gb": model.memory_capacity(d) / 1e9})
            g += 1
        out.append({"micro_batch_size": pipe.micro_batch_size, "num_micro_batches": pipe.num_micro_batches,
                    "stages": rows})
    return out


def run(args: argparse.Namespace) -> int:
    from spantrain.env.costmodel import CostModel

    if args.timeline:
        check_figure_path(args.timeline, "--timeline")
    cluster = load_cluster(args.cluster)
    workload = load_model(args)
    calibration = load_calibration(args.calibration)
    note_cpu_devices(cluster, args.calibration)
    plan = load_plan(args.plan, cluster, workload, args.global_batch)
    model = CostModel(cluster, workload, calibration, memo=False)
    arrays = model.flatten(plan)  # raises PlanError naming every problem
    stage_out, pipe_out, scalars = model.evaluate(arrays)
    est = model._to_estimate(arrays, stage_out, pipe_out, scalars)
    _note_other_prediction(plan, est.iteration_s, args.calibration)
    pipes = _stage_rows(model, plan, stage_out)
    if args.timeline:
        from spantrain.env.reference import trace
        from spantrain.env.timeline import draw_timeline

        draw_timeline(trace(cluster, workload, plan, model.calibration), args.timeline,
                      f"{workload.name} on {cluster.name}: {plan.schedule}, {plan.sync.mode} sync, "
                      f"{est.iteration_s:.3g} s/iteration")
    if args.json:
        obj = est.to_dict()
        obj.update({"schedule": plan.schedule, "sync": plan.sync.to_dict(), "batch": plan.batch,
                    "global_batch": workload.global_batch, "pipelines": pipes, "calibration": args.calibration})
        if args.timeline:
            obj["timeline"] = args.timeline
        print_json(obj)
        return 0
    _print_human(est, plan, workload, pipes, args.timeline, args.calibration, model.calibration.sync_overlap)
    return 0


def _note_other_prediction(plan, iteration_s: float, calibration: str | None) -> None:
    """A note on stderr when the plan file's `predicted` time differs from this one: the plan
    was made for other inputs (a model of as many layers, another batch, other constants)."""
    from spantrain._say import say

    before = (plan.predicted or {}).get("iteration_s")
    if not isinstance(before, (int, float)) or before <= 0 or abs(iteration_s / before - 1) <= 1e-6:
        return
    say(f"spantrain simulate: note: the plan file predicted {before:.4g} s/iteration, the cost model gives "
        f"{iteration_s:.4g} s here: it was planned for another cluster, model, batch or --calibration than "
        f"these ({f'--calibration {calibration}' if calibration else 'the built-in constants, no --calibration'})")


def _print_human(est, plan, workload, pipes, timeline, calibration: str | None = None, overlap: bool = True) -> None:
    from rich.table import Table

    con = stdout_console()
    times, bubbles, rest = est.as_run(overlap)
    for p, pipe in enumerate(pipes):
        t = Table(title=f"pipeline {p}: micro-batch {pipe['micro_batch_size']} x {pipe['num_micro_batches']}, "
                        f"{readable(times[p])} s/iteration, bubble {bubbles[p]:.1%}",
                  title_justify="left")
        for col in ("stage", "device", "layers", "F ms", "B ms", "W ms", "in flight", "memory GB"):
            t.add_column(col, justify="left" if col in ("device", "layers") else "right")
        for s, row in enumerate(pipe["stages"]):
            over = row["memory_gb"] > row["capacity_gb"]
            mem = f"{fmt_gb(row['memory_gb'])} / {fmt_gb(row['capacity_gb'])}"
            t.add_row(str(s), row["device"], f"[{row['layers'][0]}, {row['layers'][1]})", readable(row["f_ms"]),
                      readable(row["b_ms"]), readable(row["w_ms"]), str(row["in_flight"]),
                      styled((mem, "bold red")) if over else mem)
        con.print(t)
    con.print(f"schedule {plan.schedule}, sync {plan.sync.mode}"
              + (f" every {plan.sync.period}" if plan.sync.mode == "local-sgd" else ""))
    con.print(f"iteration  {est.iteration_s:.4g} s = slowest pipeline {max(times):.4g} s"
              f" + exposed sync {est.exposed_comm_s:.4g} s + optimizer and overhead {rest:.4g} s"
              f"  (sync alone {est.sync_s:.4g} s)")
    note = "" if plan.batch == workload.global_batch else f" (workload's global batch is {workload.global_batch})"
    con.print(f"batch      {plan.batch} samples{note}")
    if est.feasible:
        con.print(f"throughput {est.samples_per_s:.4g} samples/s")
    else:
        con.print(styled(("infeasible", "bold red"), ": " + "; ".join(est.reasons)))
    con.print(f"constants  {calibration or 'built-in (GPU executors that overlap sync with the backward pass)'}")
    if timeline:
        con.print(f"timeline   {timeline}", soft_wrap=True)
