"""Figures and output of `calibrate`: per-plan rows, error summary, ranking check, table, plot.

Errors are relative: (predicted - measured) / measured. A plan's `spread` is how much its
repeated runs disagree, (slowest - fastest) / median: the noise floor of the measurement
itself, which no cost model can get under (on a shared or virtualized machine it is large).
The ranking compares samples/s (plans of one cluster may train different batches):
preserved when the plan predicted to be fastest is measured fastest or within
`RANK_TOLERANCE` of the fastest.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from spantrain.experiments.plotting import save_figure

__all__ = ["RANK_TOLERANCE", "plan_row", "cluster_summary", "suite_summary", "print_table", "scatter_plot"]

RANK_TOLERANCE = 0.05


def plan_row(name: str, plan: dict[str, Any], predicted: dict[str, Any], default_s: float | None,
             measured_s: float, runs_s: list[float]) -> dict[str, Any]:
    """One plan's line of the report (`default_s`: the uncalibrated prediction, if made)."""
    batch = sum(p["micro_batch_size"] * p["num_micro_batches"] for p in plan["pipelines"])
    pred = predicted["iteration_s"]
    sync = plan["sync"]["mode"]
    return {"plan": name, "schedule": plan["schedule"],
            "sync": sync + (f"/{plan['sync']['period']}" if sync == "local-sgd" else ""),
            "pipelines": len(plan["pipelines"]), "stages": max(len(p["stages"]) for p in plan["pipelines"]),
            "batch": batch, "predicted_s": pred, "measured_s": measured_s, "error": (pred - measured_s) / measured_s,
            "default_s": default_s,
            "default_error": None if default_s is None else (default_s - measured_s) / measured_s, "runs_s": runs_s,
            "spread": (max(runs_s) - min(runs_s)) / measured_s,
            "predicted_parts": {k: v for k, v in predicted.items() if k != "iteration_s"}}


def cluster_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the plan predicted fastest (samples/s) is measured fastest or within `RANK_TOLERANCE`."""
    pred = {r["plan"]: r["batch"] / r["predicted_s"] for r in rows}
    meas = {r["plan"]: r["batch"] / r["measured_s"] for r in rows}
    best_pred = max(pred, key=pred.get)
    best_meas = max(meas, key=meas.get)
    gap = 1.0 - meas[best_pred] / meas[best_meas]
    return {"predicted_best": best_pred, "measured_best": best_meas, "gap": gap,
            "preserved": gap <= RANK_TOLERANCE}


def suite_summary(clusters: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for c in clusters for r in c["plans"]]
    errs = [abs(r["error"]) for r in rows]
    default = [abs(r["default_error"]) for r in rows if r["default_error"] is not None]
    spreads = sorted(r["spread"] for r in rows)
    return {"plans": len(rows), "mape": sum(errs) / len(errs), "max_abs_error": max(errs),
            "median_spread": spreads[len(spreads) // 2],
            "ranking_preserved": all(c["ranking"]["preserved"] for c in clusters),
            "default_mape": sum(default) / len(default) if default else None,
            "default_max_abs_error": max(default) if default else None}


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 150)
    cores = f"{report['cpus']:g}"
    cores += " core" if cores == "1" else " cores"
    t = Table(title=f"cost model vs emulated runs ({report['model']}, {cores})", title_justify="left")
    for col in ("cluster", "plan", "schedule", "sync", "P x S", "batch", "predicted s", "measured s", "error",
                "uncalibrated s", "error", "run spread"):
        t.add_column(col, justify="left" if col in ("cluster", "plan", "schedule", "sync") else "right")
    for c in report["clusters"]:
        for r in c["plans"]:
            t.add_row(c["cluster"], r["plan"], r["schedule"], r["sync"], f"{r['pipelines']} x {r['stages']}",
                      str(r["batch"]), f"{r['predicted_s']:.3f}", f"{r['measured_s']:.3f}", f"{r['error']:+.1%}",
                      f"{r['default_s']:.3f}", f"{r['default_error']:+.1%}",
                      f"{r['spread']:.0%}" if len(r["runs_s"]) > 1 else "- (1 run)")  # one run spreads over nothing
    con.print(t)
    for c in report["clusters"]:
        k = c["ranking"]
        con.print(f"{c['cluster']}: predicted fastest {k['predicted_best']}, measured fastest {k['measured_best']} "
                  f"({'preserved' if k['preserved'] else 'NOT preserved'}, gap {k['gap']:.1%})")
    con.print(f"MAPE {report['mape']:.1%}, max error {report['max_abs_error']:.1%}, ranking "
              f"{'preserved' if report['ranking_preserved'] else 'NOT preserved'}; uncalibrated MAPE "
              f"{report['default_mape']:.1%}, max {report['default_max_abs_error']:.1%}; median run-to-run spread "
              + (f"{report['median_spread']:.0%}" if any(len(r["runs_s"]) > 1 for c in report["clusters"]
                                                         for r in c["plans"]) else "- (one run per plan)")
              + "; load average "
              + "-".join(f"{x:.2f}" for x in report.get("loadavg", [])))


def scatter_plot(report: dict[str, Any], path: Path) -> None:
    """Predicted against measured seconds per iteration, one colour per cluster, +-10 % and +-25 % bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(c["cluster"], r) for c in report["clusters"] for r in c["plans"]]
    values = [v for _, r in rows for v in (r["predicted_s"], r["measured_s"], r["default_s"])]
    lo, hi = min(values) * 0.8, max(values) * 1.25
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1, label="exact")
    ax.fill_between(xs, [x * 0.9 for x in xs], [x * 1.1 for x in xs], color="tab:green", alpha=0.15, label="+-10 %")
    ax.fill_between(xs, [x * 0.75 for x in xs], [x * 1.25 for x in xs], color="tab:orange", alpha=0.08,
                    label="+-25 %")
    colours = {}
    for cluster, r in rows:
        col = colours.setdefault(cluster, f"C{len(colours)}")
        ax.scatter([r["measured_s"]], [r["default_s"]], marker="x", color=col, alpha=0.45)
        ax.scatter([r["measured_s"]], [r["predicted_s"]], color=col, edgecolor="black", zorder=3,
                   label=cluster if cluster not in ax.get_legend_handles_labels()[1] else None)
        ax.annotate(r["plan"], (r["measured_s"], r["predicted_s"]), fontsize=7, xytext=(4, -3),
                    textcoords="offset points")
    ax.scatter([], [], marker="x", color="grey", label="uncalibrated")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured s / iteration (emulated run)")
    ax.set_ylabel("predicted s / iteration (cost model)")
    ax.set_title(f"{report['model']}: MAPE {report['mape']:.1%}, max {report['max_abs_error']:.1%} "
                 f"(uncalibrated {report['default_mape']:.1%})", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="both", alpha=0.3)
    save_figure(fig, path, dpi=120)


if __name__ == "__main__":  # run as a script it printed nothing and exited 0, even for --help
    print("calibrate_report: error: a module of experiments/calibrate.py, not a script: run python "
          "experiments/calibrate.py --help", file=__import__("sys").stderr)
    raise SystemExit(2)
