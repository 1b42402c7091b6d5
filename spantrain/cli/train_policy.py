"""`spantrain train-policy`: train the PPO scheduling policy in the environment (W&B tracked)."""

from __future__ import annotations

import argparse
import sys

from spantrain.cli._common import add_json_arg, print_json

__all__ = ["register", "run", "PREVIOUS_POLICY"]

PREVIOUS_POLICY = "ppo-policy.prev.pt"
"""Beside the shipped policy: the one the last --ship replaced."""


def register(p: argparse.ArgumentParser) -> None:
    from spantrain.cli._dataclass_args import add_dataclass_args
    from spantrain.policies.train_config import TrainConfig

    add_dataclass_args(p, TrainConfig, skip={"extra"})
    p.add_argument("--ship", action="store_true",
                   help="also copy the best policy (best-policy.pt: the best held-out evaluation) into the "
                        "package, what `ppo`/`auto` load by default (the one it replaces is kept as "
                        f"{PREVIOUS_POLICY})")
    add_json_arg(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import shutil

    from spantrain.cli._dataclass_args import dataclass_from_args, flags_in_errors
    from spantrain.env.plan_env import EnvConfig
    from spantrain.policies.ppo import SHIPPED_POLICY
    from spantrain.policies.train_config import TrainConfig
    from spantrain.policies.training import train
    from spantrain.runtime import stop_signals

    with flags_in_errors(TrainConfig, EnvConfig):
        config = _resumed_config(args) if args.resume else dataclass_from_args(TrainConfig, args)
        _check_dirs(config)
        if args.ship:
            _check_ship(SHIPPED_POLICY)
        # `kill`, a scheduler's SIGTERM or a closed terminal stop the run as Ctrl-C does,
        # saving what it learned, instead of ending it where it stands
        signals = stop_signals.install()
        try:
            summary = train(config)
        except KeyboardInterrupt as stop:
            report = getattr(stop, "report", None)
            if args.ship and report and report.get("policy"):
                if report.get("phase") == "finishing":  # trained and saved: shipping is a copy away
                    how = f"copy {stop.path} to {SHIPPED_POLICY} to ship it"
                else:  # --ship is not saved with the run: the command that continues it must say it again
                    how = "add --ship to the command that continues it"
                stop.args = (f"{stop}; nothing was shipped: {how}",)
                report["message"] = str(stop)
            elif args.ship:  # no policy yet (it said only "interrupted", where --ship was asked for)
                stop.args = (f"{stop or 'before any policy was saved'}; nothing was shipped",)
                if report:
                    report["message"] = str(stop)
            if args.json:  # stdout still holds one JSON object: what was kept and how to go on
                print_json(report or {"interrupted": True, "policy": None,
                                      "message": str(stop) or "interrupted before any policy was saved"})
            raise
        finally:
            stop_signals.restore(signals)
    if args.ship:
        # the policy it replaces is kept (in a pip install, nothing else has it)
        if SHIPPED_POLICY.exists():
            previous = SHIPPED_POLICY.with_name(PREVIOUS_POLICY)
            shutil.copyfile(SHIPPED_POLICY, previous)
            summary["shipped_previous"] = str(previous)
        # whole or not at all: `ppo` and `auto` load this file
        tmp = SHIPPED_POLICY.with_suffix(".pt.tmp")
        shutil.copyfile(summary["best"]["policy"], tmp)
        tmp.replace(SHIPPED_POLICY)
        summary["shipped"] = str(SHIPPED_POLICY)
    # The human summary goes to one stream: stdout, or stderr with --json (stdout then holds
    # only the JSON object).
    out = sys.stderr if args.json else sys.stdout
    final = summary["final"]
    took = summary["train_s"]  # a smoke run's "0.0 min" said nothing
    took = f"{took / 60:.1f} min" if took >= 60 else f"{took:.1f} s"
    print(f"trained in {took} (heuristic starts {summary['starts_s']:.0f} s); "
          f"policy {summary['policy']}", file=out)
    print(f"held-out (heuristic plans to improve, and to adapt to a network change): effective throughput "
          f"vs the start median {final['median_ratio']:.4f}, geomean {final['geomean_ratio']:.4f} (planning "
          f"{final['planning_geomean']:.4f}, adaptation {final['adaptation_geomean']:.4f}), >= 1% better on "
          f"{final['better_1pct']:.0%} of {final['cases']} cases (one row each in {summary['final_rows']})", file=out)
    best = summary["best"]
    print(f"best held-out evaluation at step {best['steps']} (geomean {best['geomean_ratio']:.4f}): "
          f"{best['policy']}", file=out)
    if args.ship:
        kept = f"; the policy it replaced is kept as {summary['shipped_previous']}" if "shipped_previous" in summary \
            else ""
        print(f"shipped it to {summary['shipped']}, which `ppo` and `auto` load{kept}", file=out)
    from spantrain.tracking import print_run_line

    print_run_line(summary["wandb"], file=out)
    if args.json:
        print_json(summary)
    return 0


def _resumed_config(args: argparse.Namespace):
    """With --resume, the flags not given keep the run's own settings (so the command needs
    only --resume and --out-dir); `ResumeState.check_config` then names any given flag
    that may not change."""
    from spantrain.cli._dataclass_args import given_args
    from spantrain.policies.resume import ResumeState
    from spantrain.policies.train_config import TrainConfig

    given = given_args(TrainConfig, args)
    saved = ResumeState.from_dir(given.get("out_dir", TrainConfig.out_dir)).config
    return TrainConfig.from_dict({**saved, "init_policy": None, **given})


def _check_dirs(config) -> None:
    """Output directories that exist as files fail now, not after the heuristic starts."""
    from spantrain.cli._common import check_dir_option

    for name in ("out_dir", "cache_dir"):
        check_dir_option(f"TrainConfig.{name}", getattr(config, name))


def _check_ship(target) -> None:
    """--ship writes into the package (which may be installed read-only): a directory this
    user cannot write fails now, not after the whole training."""
    from spantrain._spec import require_writable_dir
    from spantrain.errors import SpantrainError

    require_writable_dir(target.parent, "--ship: the package's policy directory", SpantrainError,
                         fix=f"train without --ship, then copy best-policy.pt to {target} as a user who can")
