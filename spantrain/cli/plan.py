"""`spantrain plan`: plan a workload on a cluster with a named planner.

Prints the plan readably (pipelines, stages, layers, devices, micro-batches, predicted
throughput and iteration time, memory per device) or, with ``--json``, one object:
``{"plan": {...}, "estimate": {...}, "iteration_s", "samples_per_s", "feasible",
"peak_memory_gb", "planner", "plan_s", "load_s"}`` (``plan_s`` is planning; ``load_s`` the
one-time loading before it: the learned policy, and the cost model's compiled kernels). A
baseline whose arrangement does not fit memory still prints its plan, marked infeasible
(as `simulate` does); a planner that finds nothing feasible is an error (exit 2).

With ``--from RUNNING.json`` it adapts a running plan to the cluster as it is now
(`spantrain.policies.adapt`): keep it, let the policy move it, or re-plan, whichever
finishes the ``--remaining-steps`` soonest with the state migration counted; the JSON
object then also holds ``"adaptation"`` (the options and the choice).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from spantrain._spec import plural, readable
from spantrain.cli._common import (
    add_calibration_arg,
    add_cluster_arg,
    add_json_arg,
    add_model_args,
    check_output_file,
    load_calibration,
    load_cluster,
    load_model,
    note_cpu_devices,
    print_json,
    stdout_console,
    styled,
)
from spantrain.cli._dataclass_args import flag
from spantrain.estimate import fmt_gb

__all__ = ["register", "run", "planner_options", "requested_options", "unused_options", "check_policy",
           "add_planner_option_args", "DEFAULT_PLANNER"]

DEFAULT_PLANNER = "auto"
"""Planner used without --planner."""


def add_planner_option_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-s", type=float, metavar="S", help="search time budget in seconds (ga; default 10)")
    p.add_argument("--allow-local-sgd", action="store_true",
                   help="let search planners pick local-SGD sync (changes training semantics)")
    p.add_argument("--policy", metavar="FILE", help="policy file for ppo/auto (default: the shipped policy)")


def requested_options(args: argparse.Namespace) -> dict[str, Any]:
    """Planner options the user gave on the command line, their values checked."""
    from spantrain.errors import PlannerError

    wanted: dict[str, Any] = {}
    if args.budget_s is not None:
        from spantrain.policies.genetic import MAX_BUDGET_S

        if not 0 < args.budget_s <= MAX_BUDGET_S:
            raise PlannerError(f"--budget-s must be a number of seconds in (0, {MAX_BUDGET_S:g}], "
                               f"got {args.budget_s:g}")
        wanted["budget_s"] = args.budget_s
    if args.allow_local_sgd:
        wanted["allow_local_sgd"] = True
    if getattr(args, "policy", None):
        wanted["policy"] = args.policy
    return wanted


def planner_options(name: str, args: argparse.Namespace, *, strict: bool) -> dict[str, Any]:
    """Keyword options for planner `name` from the command line. With `strict`, an option
    the planner does not take is an error; otherwise it is left out for that planner."""
    from spantrain.errors import PlannerError
    from spantrain.policies.registry import get_planner

    out: dict[str, Any] = {}
    for key, value in requested_options(args).items():
        try:
            get_planner(name, **{key: value})
        except PlannerError:
            if strict:
                raise PlannerError(f"{flag(key)} is not an option of planner {name!r}") from None
            continue
        out[key] = value
    return out


def unused_options(options: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    """Refuse an option the user gave that no planner takes (`options`: planner name ->
    what `planner_options` left it), as `plan` refuses it for its one planner."""
    from spantrain.errors import PlannerError

    names = list(options)
    for key in requested_options(args):
        if not any(key in o for o in options.values()):
            which = f"planner {names[0]!r}" if len(names) == 1 else f"any of the planners {', '.join(names)}"
            raise PlannerError(f"{flag(key)} is not an option of {which}")


def check_policy(path: str | None) -> None:
    """A policy file the user named must load: the heuristic fallback of `auto` is for the
    shipped policy only (`PolicyError` in one line otherwise)."""
    if path:
        from spantrain.policies.ppo import load_policy

        load_policy(path)


def register(p: argparse.ArgumentParser) -> None:
    add_cluster_arg(p)
    add_model_args(p)
    from spantrain.policies.registry import available_planners

    p.add_argument("--planner", default=DEFAULT_PLANNER, metavar="NAME",
                   help=f"planner: {', '.join(available_planners())} ({DEFAULT_PLANNER} by default; `spantrain "
                        "compare` runs them side by side)")
    add_planner_option_args(p)
    p.add_argument("--from", dest="running", metavar="FILE",
                   help="adapt this running plan to the cluster as it is now (keep it, re-cut its layers, move "
                        "it or re-plan, migration counted) instead of planning from scratch")
    p.add_argument("--remaining-steps", type=int, metavar="N",
                   help="with --from: iterations the run still has to go, over which a migration must pay "
                        "(default 500)")
    add_calibration_arg(p, "the planner scores plans with")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the plan JSON here")
    add_json_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from spantrain.env.costmodel import CostModel
    from spantrain.errors import PlannerError
    from spantrain.planner import plan_with, prepare
    from spantrain.policies.compare import warm_up
    from spantrain.policies.registry import get_planner

    if args.remaining_steps is not None and not args.running:
        raise PlannerError("--remaining-steps needs --from RUNNING_PLAN")
    if args.output:
        check_output_file(args.output, "-o", reads={"--cluster": args.cluster, "--model": args.model,
                                                    "--from": args.running, "--policy": args.policy,
                                                    "--calibration": args.calibration})
    cluster = load_cluster(args.cluster)
    workload = load_model(args)
    calibration = load_calibration(args.calibration)
    note_cpu_devices(cluster, args.calibration)
    options = planner_options(args.planner, args, strict=True)
    check_policy(args.policy)  # options passed the check: a planner that takes it
    t0 = time.perf_counter()
    adaptation = None
    planner = get_planner(args.planner, **options)
    prepare(planner)  # loading the policy (and torch) is not planning: timed apart (--from's too)
    warm_up()  # nor is loading the cost model's compiled kernels (0.3-0.5 s; `compare` takes it out too)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    if args.running:
        adaptation, workload = _adapt(args, cluster, workload, planner, calibration)
        plan = adaptation.plan
    else:
        plan = plan_with(planner, cluster, workload, calibration)
    plan_s = time.perf_counter() - t0
    model = CostModel(cluster, workload, calibration, memo=False)
    est = model.estimate(plan)
    if args.output:
        plan.save(args.output)
    if not est.feasible:
        print(f"spantrain plan: warning: the {args.planner} plan does not fit: " + "; ".join(est.reasons),
              file=sys.stderr)
    if args.json:
        out = {"plan": plan.to_dict(), "estimate": est.to_dict(), "iteration_s": est.iteration_s,
               "samples_per_s": est.samples_per_s, "feasible": est.feasible,
               "peak_memory_gb": est.peak_memory_gb, "planner": args.planner, "plan_s": plan_s,
               "load_s": load_s, "calibration": args.calibration}
        if adaptation is not None:
            out["adaptation"] = adaptation.to_dict()
        print_json(out)
        return 0
    label = args.planner
    if adaptation is not None:
        _print_adaptation(adaptation, args.output)
        label = adaptation.chosen  # "keep plan for ...", "heuristic plan for ..."
    _print_human(cluster, workload, plan, est, model, label, plan_s, load_s, args.output, args.calibration)
    return 0


def _adapt(args: argparse.Namespace, cluster, workload, planner, calibration):
    from spantrain.errors import PlanError
    from spantrain.plan import Plan
    from spantrain.policies.adapt import DEFAULT_REMAINING_STEPS, adapt_plan

    steps = DEFAULT_REMAINING_STEPS if args.remaining_steps is None else args.remaining_steps
    if steps < 1:
        raise PlanError(f"--remaining-steps must be a positive integer, got {steps}")
    running = Plan.from_file(args.running)
    if wrong := running.other_models_layers(workload):
        raise PlanError(f"running plan {args.running} {wrong}: pass {running.model_to_pass()} (the model the run "
                        "trains)")
    if args.global_batch is None and not running.problems(None, workload) and running.batch != workload.global_batch:
        # the run trains the plan's batch, not the model's default: re-planning keeps it (an explicit
        # --global-batch of another size is still refused by adapt_plan)
        from spantrain._say import note
        from spantrain.workload import load_workload

        note(f"re-planning at the running plan's batch of {running.batch} samples ({workload.name}'s default is "
             f"{workload.global_batch})")
        workload = load_workload(args.model, global_batch=running.batch)
    try:
        adaptation = adapt_plan(cluster, workload, running, remaining_steps=steps, planner=planner,
                                calibration=calibration)
    except PlanError as e:
        raise PlanError(f"running plan {args.running}: {e}") from None
    if adaptation.missing:
        gone = adaptation.missing
        one = len(gone) == 1
        print(f"spantrain plan: warning: the running plan's device{'' if one else 's'} {', '.join(gone)} "
              f"{'is' if one else 'are'} not in {args.cluster}; planning afresh ({'its' if one else 'their'} layers "
              "come back from the run's last checkpoint)", file=sys.stderr)
    return adaptation, workload


def _print_adaptation(a, output: str | None) -> None:
    from rich.table import Table

    con = stdout_console()
    t = Table(title_justify="left", title=f"adapting the running plan: {plural(a.remaining_steps, 'iteration')} to go")
    for col in ("option", "s/iter", "migration s", "total s", ""):
        t.add_column(col, justify="left" if col in ("option", "") else "right")
    for o in a.options:
        t.add_row(o.name, f"{o.iteration_s:.4g}", f"{o.migration_s:.4g}", f"{o.total_s:.5g}",
                  styled(("chosen", "bold")) if o.name == a.chosen else "")
    con.print(t)
    if a.missing:
        con.print("decision   plan afresh (devices left the cluster)")
        # where the user most needs it: the running plan cannot go on
        # soft_wrap: a long path stays on one line, to copy (wrapped at 120 columns it broke in two)
        con.print(f"next       spantrain run ... --resume --plan {output or 'PLAN (write it with -o)'}",
                  soft_wrap=True)
    elif a.switch:
        keep, new = a.option("keep"), a.option(a.chosen)
        if math.isfinite(keep.total_s):
            sooner = readable(keep.total_s - new.total_s)
            con.print(f"decision   switch to the {a.chosen} plan: done {sooner} s sooner, migration included")
        else:
            con.print(f"decision   switch to the {a.chosen} plan: the running plan no longer fits memory here")
        # soft_wrap: a long path stays on one line, to copy (wrapped at 120 columns it broke in two)
        con.print(f"next       spantrain run ... --resume --plan {output or 'PLAN (write it with -o)'}",
                  soft_wrap=True)
    else:
        con.print("decision   keep the running plan (nothing finishes sooner once migration is paid)")


def _print_human(cluster, workload, plan, est, model, planner, plan_s, load_s, output,
                 calibration: str | None = None) -> None:
    from rich.table import Table

    con = stdout_console()
    con.print(styled((planner, "bold"), f" plan for {workload.name} on {cluster.name} "
                     f"({plural(len(cluster), 'device')}, {len(plan.devices)} used), found in {plan_s:.2f} s"
                     + (f" (+ {load_s:.1f} s one-time loading)" if load_s >= 0.05 else "")))
    t = Table(title_justify="left", title=f"{len(plan.pipelines)} pipeline(s), {len(plan.devices)} stage(s)")
    for col in ("pipeline", "micro-batch", "s/iter", "stage", "device", "region", "TFLOP/s", "layers",
                "memory GB"):
        t.add_column(col, justify="left" if col in ("device", "region", "layers") else "right")
    times, _, rest = est.as_run(model.calibration.sync_overlap)
    for p, pipe in enumerate(plan.pipelines):
        for s, st in enumerate(pipe.stages):
            d = cluster.device(st.device)
            need = est.peak_memory_gb.get(st.device, 0.0)
            mem = f"{fmt_gb(need)} / {readable(d.memory_gb)}"  # a profiled spec's figures carry 6 digits
            first = s == 0
            t.add_row(str(p) if first else "",
                      # size x count, as `simulate` prints it
                      f"{pipe.micro_batch_size} x {pipe.num_micro_batches}" if first else "",
                      f"{times[p]:.4g}" if first else "",
                      str(s), st.device, d.region, readable(d.tflops),
                      f"[{st.layers[0]}, {st.layers[1]}) ({st.num_layers})",
                      styled((mem, "bold red")) if need > d.memory_gb else mem,
                      end_section=s == len(pipe.stages) - 1 and len(pipe.stages) > 1)
    con.print(t)
    idle = [d for d in cluster.ids if d not in set(plan.devices)]
    if idle:
        shown = ", ".join(idle[:12]) + (f", ... ({len(idle)} in all)" if len(idle) > 12 else "")
        con.print(f"idle       {shown}")
    con.print(f"schedule   {plan.schedule}, sync {plan.sync.mode}"
              + (f" every {plural(plan.sync.period, 'iteration')}" if plan.sync.mode == "local-sgd" else ""))
    note = "" if plan.batch == workload.global_batch else f" (workload's global batch is {workload.global_batch})"
    con.print(f"batch      {plan.batch} samples{note}")
    con.print(f"iteration  {est.iteration_s:.4g} s (slowest pipeline {max(times):.4g} s, "
              f"exposed sync {est.exposed_comm_s:.4g} s, optimizer and overhead {rest:.4g} s)")
    if est.feasible:
        con.print(f"throughput {est.samples_per_s:.4g} samples/s")
    else:
        con.print(styled(("infeasible", "bold red"), ": " + "; ".join(est.reasons)))
    if calibration is not None:
        con.print(f"constants  {calibration} (the figures above and the planner's choice)")
    if output:
        con.print(f"written    {output}", soft_wrap=True)
