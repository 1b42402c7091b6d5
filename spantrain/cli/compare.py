"""`spantrain compare`: every planner side by side on one cluster and model.

Columns: samples/s, iteration seconds, speed-up over `ddp`, feasible, planning wall
time. ``--json`` prints ``{"planners": {NAME: {"samples_per_s", "iteration_s",
"feasible", "plan_s", "plan": {...}, "speedup_vs_ddp", "reason"?}}, "cluster", "model",
"devices"}``; a planner that fails or finds nothing feasible has ``feasible: false`` and
its reason. Default planners: every registered one, without exhaustive search above 8
devices. Options (``--budget-s``, ``--allow-local-sgd``, ``--policy``) go to the planners
that take them; one that no planner compared takes is an error, as with `spantrain plan`.
"""

from __future__ import annotations

import argparse
import re

from spantrain._spec import plural
from spantrain.cli._common import (
    add_calibration_arg,
    add_cluster_arg,
    add_json_arg,
    add_model_args,
    load_calibration,
    load_cluster,
    load_model,
    note_cpu_devices,
    print_json,
    stdout_console,
    styled,
)
from spantrain.cli.plan import add_planner_option_args, check_policy, planner_options, unused_options

__all__ = ["register", "run"]

_PLAN_ADVICE = re.compile(r"use --planner [\w-]+(?: or [\w-]+)*")


def register(p: argparse.ArgumentParser) -> None:
    add_cluster_arg(p)
    add_model_args(p)
    from spantrain.policies.registry import available_planners

    p.add_argument("--planners", metavar="A,B,...",
                   help=f"planners to run, comma-separated, of {', '.join(available_planners())} (default: all; "
                        "exhaustive only up to 8 devices)")
    add_planner_option_args(p)
    add_calibration_arg(p, "every planner scores plans with, and the table's figures come from")
    add_json_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from spantrain.errors import PlannerError
    from spantrain.policies.compare import default_planners, run_planner, warm_up
    from spantrain.policies.registry import available_planners

    cluster = load_cluster(args.cluster)
    workload = load_model(args)
    calibration = load_calibration(args.calibration)
    note_cpu_devices(cluster, args.calibration)
    if args.planners is not None:  # `--planners ""` is a mistake, not a request for the default list
        names = [n.strip() for n in args.planners.split(",") if n.strip()]
        available = f"(available: {', '.join(available_planners())})"
        if not names:
            raise PlannerError(f"--planners is empty: give planner names, comma-separated {available}")
        unknown = [n for n in names if n not in available_planners()]
        if unknown:
            raise PlannerError(f"unknown planner(s) {', '.join(unknown)} {available}")
        from spantrain.policies.compare import EXHAUSTIVE_MAX_DEVICES

        if "exhaustive" in names and len(cluster) > EXHAUSTIVE_MAX_DEVICES:  # not applicable: no row to fill
            raise PlannerError(f"exhaustive covers at most {EXHAUSTIVE_MAX_DEVICES} devices and {args.cluster} has "
                               f"{len(cluster)}: leave exhaustive out of --planners")
    else:
        names = default_planners(cluster)
    from spantrain.env.costmodel import CostModel

    # the inputs' own errors (measured layer times for another model, ...) are the command's, as
    # in plan and simulate: they filled every planner's row with the same "infeasible" and exit 0
    CostModel(cluster, workload, calibration, memo=False)
    options = {name: planner_options(name, args, strict=False) for name in names}
    unused_options(options, args)
    check_policy(args.policy)
    warm_up()  # plan times below are planning, not the process's kernel loading
    results = {}
    for name in names:
        results[name] = run_planner(name, cluster, workload, calibration=calibration, **options[name])
    ddp = results.get("ddp")
    base = ddp.samples_per_s if ddp is not None and ddp.feasible else None
    rows = {}
    for name, r in results.items():
        row = r.to_dict()
        if "reason" in row:
            row["reason"] = _own_advice(name, row["reason"])
        row["speedup_vs_ddp"] = r.samples_per_s / base if base and r.feasible else None
        rows[name] = row
    if args.json:
        print_json({"planners": rows, "cluster": cluster.name, "model": workload.name, "devices": len(cluster),
                    "calibration": args.calibration})
        return 0
    _print_human(cluster, workload, rows, args.calibration)
    return 0


def _own_advice(name: str, reason: str) -> str:
    """A planner's reason with its advice to `plan --planner OTHER` turned into compare's way:
    here the user picked the planner with --planners, so the fix is to leave it out."""
    return _PLAN_ADVICE.sub(f"leave {name} out of --planners", reason)


def _print_human(cluster, workload, rows, calibration: str | None = None) -> None:
    from rich.table import Table

    con = stdout_console()
    t = Table(title=f"{workload.name} on {cluster.name} ({plural(len(cluster), 'device')}), "
                    f"global batch {workload.global_batch}"
                    + (f", cost-model constants {calibration}" if calibration is not None else ""),
              title_justify="left")
    for col in ("planner", "samples/s", "iteration s", "vs ddp", "feasible", "plan s"):
        t.add_column(col, justify="left" if col == "planner" else "right")
    best = max((r["samples_per_s"] for r in rows.values()), default=0.0)
    for name, r in rows.items():
        sps = f"{r['samples_per_s']:.4g}" if r["feasible"] else "-"
        if r["feasible"] and r["samples_per_s"] == best:
            sps = styled((sps, "bold green"))
        it = f"{r['iteration_s']:.4g}" if r["iteration_s"] is not None and r["feasible"] else "-"
        # .3g past 1,000x: a 56-digit ratio of extreme specs ran out of the table with its "x" cut off
        sp = "-" if r["speedup_vs_ddp"] is None else f"{r['speedup_vs_ddp']:.2f}x" if r["speedup_vs_ddp"] < 1e3 \
            else f"{r['speedup_vs_ddp']:.3g}x"
        t.add_row(name, sps, it, sp, "yes" if r["feasible"] else styled(("no", "red")), f"{r['plan_s']:.2f}")
    con.print(t)
    for name, r in rows.items():
        if not r["feasible"]:
            parts = r.get("reason", "").split("; ")
            more = f"; ... ({len(parts) - 3} more)" if len(parts) > 3 else ""
            con.print(styled((name, "red"), ": " + "; ".join(parts[:3]) + more))
