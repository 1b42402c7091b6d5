"""Evaluate the learned planner against the heuristic, ga and the baselines.

    python -m spantrain.experiments.eval_policy [--policy FILE] [--json] [--quick] [--no-track]
        [--batch-scale N]

Planning: clusters whose seeds training never draws (`EVAL_SEED_RANGE`), at training
sizes (8-32 devices) and beyond them (64 and 128), every generator profile, gpt2-medium /
gpt2-xl / llama2-7b. For each case: `ppo` (the policy improving the heuristic's plan),
`auto` (the default planner), `ppo-alone` (the policy from a planner-free start: the
better of one pipeline through all devices and plain data parallelism), `heuristic`,
`ga` and the baselines, all re-estimated by one cost model; ratios are heuristic
iteration time over the planner's (> 1 is better than the heuristic); plan latency is
wall time, for heuristic, ppo and auto the median of `--latency-repeats` runs (the
slowest single run is reported too).

Adaptation: held-out scenarios where a region's links change under a running plan;
effective throughput over the remaining iterations, migration included, of keeping the
plan, re-planning with the heuristic (and migrating), and letting the policy adapt it;
and what users run, `spantrain plan --from` (`spantrain.policies.adapt`: the best of
keeping the plan exactly as it runs, the policy's move and the heuristic's re-plan).

Headroom, from the same start (the heuristic's plan), with the cost model as the judge:
`lookahead`, the expert the policy imitates (`spantrain.policies.imitation`: every
valid move tried, the best taken while it gains, up to the episode length), at every
size; `beam`, a beam search over the same moves (`--beam-width` plans a level, as deep
as an episode, passing through worse plans) at training sizes (8-32 devices; at 64 and
more its hundreds of thousands of cost-model calls take minutes a case). What they
cannot find within an episode's moves, a policy over those moves cannot reach either.
`anneal` (with `--anneal-steps`), simulated annealing over the same moves with no
episode limit, at every size: a wider bound still (its moves hit the cost model's memo
mostly, so it stays affordable at 128 devices where the beam does not).

Every case trains each preset's global batch, or `--batch-scale` times it (training
episodes draw 1x and 4x); a scaled run writes its files with a ``_batchN`` suffix.

Sample efficiency comes from the policy file's training curve. Writes plots and a
markdown table under experiments/results/ (``--quick``: out/eval_policy_quick/), logs to
W&B (offline by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from spantrain.cli import OneLineParser
from spantrain.cli._common import check_dir_option
from spantrain.env.evaluator import Evaluator
from spantrain.env.plan_env import (
    EnvConfig,
    PlanEnv,
    Scenario,
    as_running,
    held_layers,
    network_change,
    scenario_workload,
    simple_start,
)
from spantrain.errors import SpantrainError
from spantrain.experiments._args import bad_input
from spantrain.experiments.plotting import save_figure
from spantrain.policies.adapt import adapt_plan
from spantrain.policies.compare import run_planner
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.policies.imitation import anneal, beam_search, expert_rollout
from spantrain.policies.ppo import PPOPlanner, load_policy
from spantrain.policies.training import EVAL_SEED_RANGE
from spantrain.profiler.topology import PROFILES, generate
from spantrain.tracking import Tracker, print_run_line

__all__ = ["plan_cases", "adaptation_cases", "summarize", "summary_tables", "markdown", "plots", "main"]

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("gpt2-medium", "gpt2-xl", "llama2-7b")
TRAIN_SIZES = (8, 16, 24, 32)
BEYOND_SIZES = (64, 128)
BASELINES = ("ddp", "gpipe", "megatron")
PLANNERS = ("ppo", "auto", "ppo-alone", "lookahead", "beam", "anneal", "ga", *BASELINES)
"""Rows of the planning table, in order (headroom searches and baselines included)."""
BEAM_MAX_DEVICES = 32
"""Largest cluster the beam search runs on (its cost grows with devices squared)."""
TIMED_PLANNERS = ("heuristic", "ppo", "auto")
"""Planners whose plan time is the median of `--latency-repeats` runs (this machine's
single-core speed swings by up to 2x within minutes; every run gives the same plan)."""


def _cases(quick: bool) -> list[tuple[str, int, int, str]]:
    rng = np.random.default_rng(2024)
    sizes = (8, 64) if quick else TRAIN_SIZES + BEYOND_SIZES
    profiles = ("cee",) if quick else PROFILES
    models = MODELS[:1] if quick else MODELS
    return [(p, n, int(rng.integers(*EVAL_SEED_RANGE)), m) for n in sizes for p in profiles for m in models]


def _headroom(cluster, workload, searches: dict) -> dict[str, dict]:
    """Each of `searches` (name -> search(env)) from the heuristic's plan, computed once:
    the plan's time, and the wall time with the start's included."""
    t0 = time.perf_counter()
    ev = Evaluator(cluster, workload)
    start = HeuristicPlanner().best_candidate(ev)
    start_s = time.perf_counter() - t0
    out = {}
    for name, search in searches.items():
        t0 = time.perf_counter()
        env = PlanEnv(EnvConfig(max_devices=len(cluster), min_devices=2))
        env.load(Scenario(key=("eval",), cluster=cluster, workload=workload, evaluator=ev, start=start))
        out[name] = {"iteration_s": search(env).time, "plan_s": start_s + time.perf_counter() - t0}
    return out


def _timed(name: str, cluster, workload, repeats: int, **options):
    """`run_planner` `repeats` times: the first result with the median plan time, and every time."""
    runs = [run_planner(name, cluster, workload, **options) for _ in range(repeats)]
    assert len({r.iteration_s if r.feasible else None for r in runs}) == 1, f"{name} is not deterministic"
    times = [r.plan_s for r in runs]
    return dataclasses.replace(runs[0], plan_s=float(np.median(times))), times


def plan_cases(policy: str | None, quick: bool, ga_budget_s: float, beam_width: int, progress: bool,
               latency_repeats: int = 1, anneal_steps: int = 0, batch_scale: int = 1) -> list[dict]:
    from tqdm import tqdm

    net, _, _ = load_policy(policy)
    rows = []
    for profile, n, seed, model in tqdm(_cases(quick), desc="planning cases", disable=not progress):
        cluster = generate(n, seed=seed, profile=profile)
        workload = scenario_workload(model, batch_scale)
        row = {"profile": profile, "devices": n, "seed": seed, "model": model, "batch": workload.global_batch}
        results = {name: run_planner(name, cluster, workload) for name in BASELINES}
        results["ga"] = run_planner("ga", cluster, workload, budget_s=ga_budget_s)
        runs = {}
        for name in TIMED_PLANNERS:
            options = {"policy": policy} if policy and name != "heuristic" else {}
            results[name], runs[name] = _timed(name, cluster, workload, latency_repeats, **options)
        if results["heuristic"].feasible:
            searches = {"lookahead": expert_rollout}
            if beam_width and n <= BEAM_MAX_DEVICES:
                searches["beam"] = lambda env: beam_search(env, beam_width)
            if anneal_steps:
                searches["anneal"] = lambda env, s=seed: anneal(env, anneal_steps, seed=s)
            row.update(_headroom(cluster, workload, searches))
        # the policy by itself, from a planner-free start
        t0 = time.perf_counter()
        try:
            ev = Evaluator(cluster, workload)
            alone = PPOPlanner(policy=policy).best_candidate(ev, start=simple_start(("eval",), ev))
            row["ppo-alone"] = {"iteration_s": alone.time, "plan_s": time.perf_counter() - t0}
        except SpantrainError as e:
            row["ppo-alone"] = {"iteration_s": math.inf, "plan_s": time.perf_counter() - t0, "reason": str(e)}
        for name, r in results.items():
            row[name] = {"iteration_s": r.iteration_s if r.feasible else math.inf, "plan_s": r.plan_s,
                         "feasible": r.feasible}
            if name in runs:
                row[name]["plan_s_runs"] = runs[name]
        rows.append(row)
    del net
    return rows


def adaptation_cases(policy: str | None, quick: bool, progress: bool, batch_scale: int = 1) -> list[dict]:
    from tqdm import tqdm

    from spantrain.policies.ppo import improve

    net, settings, _ = load_policy(policy)
    rng = np.random.default_rng(77)
    count = 6 if quick else 36
    rows = []
    # closed on Ctrl-C too: an open bar glued "interrupted" onto itself and redrew after it
    with tqdm(total=count, desc="adaptation cases", disable=not progress) as bar:
        while len(rows) < count:
            profile = PROFILES[len(rows) % 3]
            n = int(rng.integers(8, 33))
            seed = int(rng.integers(*EVAL_SEED_RANGE))
            model = MODELS[int(rng.integers(len(MODELS)))]
            cluster = generate(n, seed=seed, profile=profile)
            workload = scenario_workload(model, batch_scale)
            try:
                running = HeuristicPlanner().best_candidate(Evaluator(cluster, workload))
            except SpantrainError:
                continue
            changed, what = network_change(cluster, rng)
            ev = Evaluator(changed, workload)
            now = as_running(ev, running)
            scenario = Scenario(key=(profile, n, seed, model), cluster=changed, workload=workload, evaluator=ev,
                                start=now, running=held_layers(running, workload.num_layers), change=what)
            env = PlanEnv(EnvConfig(max_devices=n, min_devices=2, horizon=int(settings.get("horizon", 500))))
            env.load(scenario)
            replanned = HeuristicPlanner().best_candidate(ev)
            t0 = time.perf_counter()
            adapted = improve(net, scenario, steps=int(settings.get("max_steps", 12)), samples=4, seed=0,
                              horizon=env.config.horizon)
            ppo_s = time.perf_counter() - t0
            looked = expert_rollout(env)
            # what users run, end to end from the plan file (it re-plans and re-runs the policy
            # itself, and scores keeping the plan with its own layer ranges, not re-partitioned)
            deployed = adapt_plan(changed, workload, ev.to_plan(running), remaining_steps=env.config.horizon,
                                  policy=policy)
            chosen = deployed.option(deployed.chosen)
            rows.append({"auto": workload.global_batch * env.config.horizon / chosen.total_s,
                         "auto_keep": workload.global_batch * env.config.horizon / deployed.option("keep").total_s,
                         "auto_chosen": deployed.chosen,
                         "profile": profile, "devices": n, "seed": seed, "model": model, "change": what,
                         "keep": env._effective(now), "heuristic": env._effective(replanned),
                         "heuristic_migration_s": env.migration_s(replanned), "ppo": env._effective(adapted),
                         "ppo_migration_s": env.migration_s(adapted), "ppo_s": ppo_s,
                         "lookahead": env._effective(looked)})
            bar.update()
    return rows


def _strict(value):
    """`value` as strict JSON takes it: NumPy numbers as Python's, NaN and infinities (a geomean
    over no feasible plan) as None; json wrote them as bare NaN, which strict parsers (JavaScript's, Go's) refuse."""
    if isinstance(value, dict):
        return {k: _strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _geomean(x) -> float:
    x = np.asarray([v for v in x if np.isfinite(v) and v > 0])
    return float(np.exp(np.mean(np.log(x)))) if len(x) else float("nan")


def summarize(rows: list[dict], adapt: list[dict]) -> dict:
    out: dict = {"planning": {}, "adaptation": {}}
    buckets = {"training sizes (8-32)": [r for r in rows if r["devices"] <= 32],
               "64 devices": [r for r in rows if r["devices"] == 64],
               "128 devices": [r for r in rows if r["devices"] == 128]}
    for label, group in buckets.items():
        group = [r for r in group if np.isfinite(r["heuristic"]["iteration_s"])]
        if not group:
            continue
        entry = {"cases": len(group)}
        for name in PLANNERS:
            if any(name not in r for r in group):
                continue
            ratios = [r["heuristic"]["iteration_s"] / r[name]["iteration_s"] if np.isfinite(r[name]["iteration_s"])
                      else 0.0 for r in group]
            entry[name] = {"median_ratio": float(np.median(ratios)), "geomean_ratio": _geomean(ratios),
                           "better_1pct": float(np.mean([x >= 1.01 for x in ratios])),
                           "worse": float(np.mean([x < 1 - 1e-9 for x in ratios])),
                           "median_plan_s": float(np.median([r[name]["plan_s"] for r in group])),
                           "max_plan_s": float(np.max([r[name]["plan_s"] for r in group])),
                           "max_single_plan_s": float(np.max([t for r in group
                                                              for t in r[name].get("plan_s_runs", [])]
                                                             or [r[name]["plan_s"] for r in group]))}
        out["planning"][label] = entry
    out["headroom"] = _headroom_bound(rows)
    cee = [r for r in rows if r["profile"] == "cee"]
    best_base = [max((1 / r[b]["iteration_s"] for b in BASELINES if np.isfinite(r[b]["iteration_s"])), default=0)
                 for r in cee]
    out["auto_over_best_baseline_cee"] = _geomean([(1 / r["auto"]["iteration_s"]) / b
                                                   for r, b in zip(cee, best_base) if b > 0])
    if adapt:
        out["adaptation"] = {
            "cases": len(adapt),
            "ppo_over_keep": _geomean([a["ppo"] / a["keep"] for a in adapt]),
            "ppo_over_heuristic_replan": _geomean([a["ppo"] / a["heuristic"] for a in adapt]),
            "heuristic_replan_over_keep": _geomean([a["heuristic"] / a["keep"] for a in adapt]),
            "ppo_at_least_heuristic": float(np.mean([a["ppo"] >= a["heuristic"] * (1 - 1e-9) for a in adapt])),
            "ppo_better_1pct_than_heuristic": float(np.mean([a["ppo"] >= a["heuristic"] * 1.01 for a in adapt])),
            "median_ppo_s": float(np.median([a["ppo_s"] for a in adapt])),
            "lookahead_over_keep": _geomean([a["lookahead"] / a["keep"] for a in adapt]),
            "lookahead_over_heuristic_replan": _geomean([a["lookahead"] / a["heuristic"] for a in adapt]),
            "plan_affected": float(np.mean([max(a["heuristic"], a["lookahead"]) > a["keep"] * 1.001
                                            for a in adapt])),
            "auto_over_keep": _geomean([a["auto"] / a["auto_keep"] for a in adapt]),
            "auto_over_heuristic_replan": _geomean([a["auto"] / a["heuristic"] for a in adapt]),
            "auto_switched": float(np.mean([a["auto_chosen"] != "keep" for a in adapt])),
            "auto_chose_ppo": float(np.mean([a["auto_chosen"] == "ppo" for a in adapt])),
            "auto_below_keep_or_replan": float(np.mean([a["auto"] < max(a["auto_keep"], a["heuristic"]) * (1 - 1e-9)
                                                        for a in adapt])),
        }
    return out


def summary_tables(summary: dict) -> dict[str, tuple[list[str], list[list]]]:
    """The README's tables as W&B tables, by key: (columns, rows). A nested summary shows in
    W&B as one opaque value."""
    figures = ["median_ratio", "geomean_ratio", "better_1pct", "worse", "median_plan_s", "max_plan_s"]
    out = {"planners": (["cases", "planner", *figures],
                        [[label, planner, *(entry[planner][f] for f in figures)]
                         for label, entry in summary["planning"].items() for planner in PLANNERS if planner in entry])}
    if summary["adaptation"]:
        out["adaptation"] = (["figure", "value"], [[k, float(v)] for k, v in summary["adaptation"].items()])
    return out


def _fmt(x: float) -> str:
    return "none feasible" if math.isnan(x) else f"{x:.3f}"


def _headroom_bound(rows: list[dict]) -> dict:
    """How many cases (with a feasible heuristic plan) any planner or search of this run
    beats the heuristic on by >= 1 %: a bound, as far as these searches reach, on the
    share any improver of the heuristic's plan can score on the ">= 1 % better" target."""
    feasible = [r for r in rows if np.isfinite(r["heuristic"]["iteration_s"])]
    found = []
    for r in feasible:
        best = min((r[name]["iteration_s"] for name in PLANNERS if name in r), default=math.inf)
        if r["heuristic"]["iteration_s"] / best >= 1.01:
            found.append(f"{r['profile']}-{r['devices']} {r['model']}")
    ppo = sum(r["heuristic"]["iteration_s"] / r["ppo"]["iteration_s"] >= 1.01 for r in feasible)
    return {"cases": len(feasible), "any_better_1pct": len(found), "ppo_better_1pct": int(ppo), "where": found}


def markdown(summary: dict) -> str:
    lines = ["| cases | planner | median ratio to heuristic | geomean (feasible plans) | >= 1% better | worse "
             "| median plan s | max plan s |", "|---|---|---|---|---|---|---|---|"]
    for label, entry in summary["planning"].items():
        for name in PLANNERS:
            if name not in entry:
                continue
            e = entry[name]
            lines.append(f"| {label} ({entry['cases']}) | {name} | {e['median_ratio']:.3f} | "
                         f"{_fmt(e['geomean_ratio'])} | {e['better_1pct']:.0%} | {e['worse']:.0%} | "
                         f"{e['median_plan_s']:.2f} | {e['max_plan_s']:.2f} |")
    a = summary.get("adaptation") or {}
    if a:
        lines += ["", "| adaptation ({} cases) | geomean |".format(a["cases"]), "|---|---|",
                  f"| ppo adapting vs keeping the plan | {a['ppo_over_keep']:.3f} |",
                  f"| ppo adapting vs heuristic re-plan (+ migration) | {a['ppo_over_heuristic_replan']:.3f} |",
                  f"| heuristic re-plan vs keeping the plan | {a['heuristic_replan_over_keep']:.3f} |",
                  f"| ppo at least as good as heuristic re-plan | {a['ppo_at_least_heuristic']:.0%} of cases |",
                  f"| ppo >= 1% better than heuristic re-plan | {a['ppo_better_1pct_than_heuristic']:.0%} of cases |",
                  f"| lookahead expert vs keeping the plan | {a['lookahead_over_keep']:.3f} |",
                  f"| lookahead expert vs heuristic re-plan (+ migration) | "
                  f"{a['lookahead_over_heuristic_replan']:.3f} |",
                  f"| cases where re-planning or the expert gains > 0.1 % | {a['plan_affected']:.0%} |",
                  f"| `plan --from` (best of keep, ppo, heuristic re-plan) vs keeping the plan | "
                  f"{a['auto_over_keep']:.3f} |",
                  f"| `plan --from` vs heuristic re-plan (+ migration) | {a['auto_over_heuristic_replan']:.3f} |",
                  f"| `plan --from` switched plans / chose the policy's | {a['auto_switched']:.0%} / "
                  f"{a['auto_chose_ppo']:.0%} of cases |",
                  f"| `plan --from` below keeping or re-planning | {a['auto_below_keep_or_replan']:.0%} of cases |"]
    h = summary.get("headroom")
    if h and h["cases"]:
        where = f" ({', '.join(h['where'])})" if h["where"] else ""
        lines.append(f"\nany planner or search in the table >= 1 % better than heuristic: {h['any_better_1pct']} of "
                     f"{h['cases']} cases ({h['any_better_1pct'] / h['cases']:.0%}){where}; ppo: "
                     f"{h['ppo_better_1pct']} of {h['cases']} ({h['ppo_better_1pct'] / h['cases']:.0%})")
    lines.append(f"\nauto over the best of ddp/gpipe/megatron on cee (geomean): "
                 f"{summary['auto_over_best_baseline_cee']:.2f}x")
    if summary.get("batch_scale", 1) != 1:
        lines.append(f"\nglobal batch: each preset's x{summary['batch_scale']}")
    repeats = summary.get("latency_repeats", 1)
    if repeats > 1:
        slowest = {label: entry["ppo"]["max_single_plan_s"] for label, entry in summary["planning"].items()
                   if "ppo" in entry}
        lines.append(f"\nplan s of {', '.join(TIMED_PLANNERS)}: median of {repeats} timed runs per case; ppo's "
                     "slowest single run: " + ", ".join(f"{v:.2f} s ({k})" for k, v in slowest.items()))
    return "\n".join(lines)


def plots(rows: list[dict], meta: dict, out: Path, suffix: str = "") -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    sizes = sorted({r["devices"] for r in rows})
    fig, ax = plt.subplots(figsize=(9, 4))
    for k, name in enumerate(("ppo", "ppo-alone", "ga")):
        data = [[r["heuristic"]["iteration_s"] / r[name]["iteration_s"] for r in rows
                 if r["devices"] == n and np.isfinite(r["heuristic"]["iteration_s"])] for n in sizes]
        pos = np.arange(len(sizes)) + (k - 1) * 0.25
        ax.boxplot(data, positions=pos, widths=0.2, patch_artist=True,
                   boxprops={"facecolor": f"C{k}", "alpha": 0.6}, medianprops={"color": "k"})
        ax.plot([], [], color=f"C{k}", lw=6, alpha=0.6, label=name)
    ax.axhline(1.0, color="0.5", lw=0.8)
    ax.set_xticks(np.arange(len(sizes)), [str(n) for n in sizes])
    ax.set_xlabel("devices (64 and 128: beyond training sizes)")
    ax.set_ylabel("heuristic time / planner time")
    ax.set_title("held-out clusters: plans relative to the heuristic")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: boxes reach every corner
    paths.append(save_figure(fig, out / f"policy_ratios{suffix}.png", dpi=110))

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("heuristic", "ppo", "ga"):
        med = [np.median([r[name]["plan_s"] for r in rows if r["devices"] == n]) for n in sizes]
        ax.plot(sizes, med, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("devices")
    ax.set_ylabel("median plan latency (s)")
    ax.legend(fontsize=8)
    ax.set_title("plan latency")
    paths.append(save_figure(fig, out / f"policy_latency{suffix}.png", dpi=110))

    curve = meta.get("curve") or []
    if curve:
        fig, ax = plt.subplots(figsize=(6, 4))
        steps = [p["steps"] for p in curve]
        ax.plot(steps, [p["geomean_ratio"] for p in curve], marker="o", label="geomean ratio to heuristic")
        ax.plot(steps, [p["better_1pct"] for p in curve], marker="^", label="share >= 1% better")
        ax.set_xlabel("environment steps")
        ax.set_title("sample efficiency (held-out evaluation during training)")
        ax.legend(fontsize=8)
        paths.append(save_figure(fig, out / f"policy_sample_efficiency{suffix}.png", dpi=110))
    return paths


def _check_inputs(args: argparse.Namespace, out: Path) -> dict:
    """The policy's metadata, every flag checked first (`SpantrainError`), --out made last."""
    if args.beam_width < 0:
        raise SpantrainError(f"--beam-width must be >= 0, got {args.beam_width}")
    if args.anneal_steps < 0:
        raise SpantrainError(f"--anneal-steps must be >= 0, got {args.anneal_steps}")
    if not 1 <= args.batch_scale <= 64:
        raise SpantrainError(f"--batch-scale must be an integer from 1 to 64, got {args.batch_scale}")
    if args.latency_repeats < 1:
        raise SpantrainError(f"--latency-repeats must be >= 1, got {args.latency_repeats}")
    if not 0 < args.ga_budget_s <= 3600:  # per case: 1e300 s ran for ever (nan fails both comparisons)
        raise SpantrainError(f"--ga-budget-s must be a number of seconds in (0, 3600], got {args.ga_budget_s:g}")
    _, _, meta = load_policy(args.policy)
    if not args.no_track:  # W&B starts after the whole evaluation: a setting it refuses failed only then
        from spantrain.tracking import check_can_track

        check_can_track()
    check_dir_option("--out", out, create=True)
    return meta


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", help="policy file (default: the shipped policy)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--quick", action="store_true", help="a few cases only (smoke test)")
    p.add_argument("--ga-budget-s", type=float, default=2.0, help="ga time budget per case (default 2 s)")
    p.add_argument("--beam-width", type=int, default=8,
                   help="plans per level of the headroom beam search (default 8; 0: skip it)")
    p.add_argument("--anneal-steps", type=int, default=0,
                   help="moves per chain of a headroom simulated annealing (4 chains) at every size "
                        "(default 0: skip it; 10000 takes ~15-25 min more on one core)")
    p.add_argument("--latency-repeats", type=int, default=3,
                   help="timed runs of heuristic, ppo and auto per case; their plan time is the median "
                        "(default 3)")
    p.add_argument("--batch-scale", type=int, default=1,
                   help="multiply each preset's global batch by N (default 1; training draws 1 and 4); "
                        "files get a _batchN suffix")
    p.add_argument("--out", metavar="DIR", help="where plots and tables go (default experiments/results; "
                   "out/eval_policy_quick with --quick)")
    p.add_argument("--no-track", action="store_true", help="do not log to W&B")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    # a smoke run must not overwrite the committed plots: they keep their names for any case set
    out = Path(args.out) if args.out is not None else (Path("out/eval_policy_quick") if args.quick else RESULTS)
    try:
        if args.out is not None and not args.out.strip():  # it wrote to the default directory unsaid
            raise SpantrainError("--out is empty: give a directory name, or leave --out out for the default")
        meta = _check_inputs(args, out)
    except SpantrainError as e:
        return bad_input("eval_policy", e)
    progress = not args.no_progress
    t0 = time.perf_counter()
    rows = plan_cases(args.policy, args.quick, args.ga_budget_s, args.beam_width, progress, args.latency_repeats,
                      args.anneal_steps, args.batch_scale)
    adapt = adaptation_cases(args.policy, args.quick, progress, args.batch_scale)
    summary = summarize(rows, adapt)
    summary["latency_repeats"] = args.latency_repeats
    summary["batch_scale"] = args.batch_scale
    summary["wall_s"] = time.perf_counter() - t0
    summary["policy_meta"] = {k: meta.get(k) for k in ("timesteps", "train_s", "starts_s")}
    curve = meta.get("curve") or []
    table = markdown(summary)
    suffix = f"_batch{args.batch_scale}" if args.batch_scale != 1 else ""
    stem = "eval_policy" + suffix + ("_quick" if args.quick else "")
    (out / f"{stem}.md").write_text(table + "\n")
    (out / f"{stem}.json").write_text(json.dumps({"summary": summary, "cases": rows, "adaptation": adapt},
                                                 indent=1, default=float))
    images = plots(rows, {"curve": curve}, out, suffix)
    name = f"eval_policy: {Path(args.policy).name if args.policy else 'shipped policy'}" + (" (quick)" if args.quick
                                                                                               else "")
    with Tracker(job_type="eval-policy", config=vars(args), enabled=not args.no_track, name=name) as tracker:
        tracker.summary({"summary": json.loads(json.dumps(summary, default=float))})
        for key, (columns, table_rows) in summary_tables(summary).items():
            tracker.log_table(key, columns, table_rows)
        cols = ["profile", "devices", "seed", "model", "heuristic_s", "ppo_s", "auto_s", "ga_s", "ppo_plan_s"]
        tracker.log_table("cases", cols, [[r["profile"], r["devices"], r["seed"], r["model"],
                                           r["heuristic"]["iteration_s"], r["ppo"]["iteration_s"],
                                           r["auto"]["iteration_s"], r["ga"]["iteration_s"], r["ppo"]["plan_s"]]
                                          for r in rows])
        for img in images:
            tracker.log_image(img.stem, img)
        where = tracker.url_or_dir
    if args.json:
        print(json.dumps(_strict(summary), allow_nan=False, default=float))
    else:
        print(table)
    print_run_line(where, file=sys.stderr if args.json else sys.stdout)
    return 0


if __name__ == "__main__":
    from spantrain.experiments._args import run_script

    raise SystemExit(run_script(main, "eval_policy"))
