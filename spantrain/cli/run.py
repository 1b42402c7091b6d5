"""`spantrain run`: real training of a plan (from a file or a planner) with torch.distributed.

Local runs start one process per plan device on this machine; under torchrun (one process
per device, any number of nodes) every process runs this same command and becomes the rank
torchrun gave it; with ``--emulate`` the plan's devices run on the local emulated cluster
(their own namespaces, link shaping and CPU quotas, `spantrain.runtime.emulator`). Every
input is checked before any process starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spantrain._interrupt import INTERRUPTED
from spantrain._say import say
from spantrain._spec import plural, readable
from spantrain.cli._common import (
    add_calibration_arg,
    add_cluster_arg,
    add_json_arg,
    add_model_args,
    check_dir_option,
    check_finite,
    check_seed,
    file_read_by,
    load_calibration,
    load_cluster,
    load_model,
    load_plan,
    print_json,
)
from spantrain.errors import ExecutionError, RunFailed, SpantrainError
from spantrain.runtime.config import MAX_THREADS

__all__ = ["register", "ADAPT_CHECKPOINT_EVERY", "other_data_note", "other_optim_note"]

_OPTIM_DEFAULTS = {"lr": 1e-3, "weight_decay": 0.1, "eps": 1e-8}
"""AdamW settings a run takes when --lr, --weight-decay or --adam-eps is left out."""

MIN_TIMEOUT_S = 1.0
"""Smallest --timeout: below it gloo aborts the workers (SIGABRT) before they have even met."""
MAX_TIMEOUT_S = 7 * 86400.0
"""Largest --timeout: a week (a longer wait is a hang; huge values overflow the process group's timer)."""
ADAPT_CHECKPOINT_EVERY = 10
"""``--adapt``'s default checkpoint period: a switch the workers cannot finish in time (the
network became very slow) continues from the last checkpoint, losing at most this many iterations."""


def register(p: argparse.ArgumentParser) -> None:
    """Add `spantrain run`'s arguments."""
    add_cluster_arg(p)
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", metavar="FILE", help="plan JSON (as written by `spantrain plan -o`)")
    from spantrain.policies.registry import available_planners

    src.add_argument("--planner", metavar="NAME",
                     help=f"make the plan with this planner ({', '.join(available_planners())})")
    p.add_argument("--steps", type=int, required=True, metavar="N",
                   help="train until N iterations in total (a resumed run continues up to N)")
    p.add_argument("--data", metavar="PATH", help="text file whose bytes are the tokens (default: built-in "
                   "synthetic corpus)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="write checkpoints here (and resume from here)")
    p.add_argument("--checkpoint-every", type=int, metavar="K",
                   help="checkpoint every K iterations (default: only at the end and on Ctrl-C; with --adapt "
                   f"every {ADAPT_CHECKPOINT_EVERY})")
    p.add_argument("--keep-checkpoints", type=int, default=2, metavar="N", help="complete checkpoints kept (2)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --checkpoint-dir")
    p.add_argument("--lr", type=float, default=_OPTIM_DEFAULTS["lr"],
                   help=f"AdamW learning rate ({_OPTIM_DEFAULTS['lr']:g})")
    p.add_argument("--weight-decay", type=float, default=_OPTIM_DEFAULTS["weight_decay"],
                   help=f"AdamW weight decay on matrices ({_OPTIM_DEFAULTS['weight_decay']:g})")
    p.add_argument("--adam-eps", type=float, default=_OPTIM_DEFAULTS["eps"], metavar="EPS",
                   help=f"AdamW epsilon ({_OPTIM_DEFAULTS['eps']:g})")
    p.add_argument("--seed", type=int, default=0, help="initialisation and data-order seed (0)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="train in fp32, or in bf16 or fp16 mixed precision: fp32 weights and AdamW, half-precision "
                   "compute and activations; fp16 with a dynamic loss scale all ranks agree on, for GPUs without "
                   "bf16 (default: the model's precision; fp16 models train in bf16)")
    p.add_argument("--loss-scale", type=float, metavar="S",
                   help="with --precision fp16: the loss scale to start from (65536; halved on overflow)")
    p.add_argument("--run-dir", metavar="DIR", help="metrics, logs and result of this run "
                   "(default runs/run-TIMESTAMP-PID)")
    p.add_argument("--metrics", metavar="FILE", help="per-iteration JSON lines (default RUN_DIR/metrics.jsonl)")
    p.add_argument("--track", action=argparse.BooleanOptionalAction, default=False,
                   help="log to Weights & Biases (offline unless logged in; default off)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="fail a transfer or collective that waits longer than S seconds; a local run also stops "
                   "when no iteration completes for S + 60 seconds (300)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="torch CPU threads per worker (default: this machine's cores / its workers)")
    p.add_argument("--rank-map", metavar="FILE", help="device -> rank mapping file, {device: rank} or a list of "
                   "devices in rank order (default under torchrun: the cluster's host/local_rank records, else plan "
                   "order; local runs: plan order)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: when stderr is a terminal)")
    p.add_argument("--emulate", action="store_true",
                   help="run the plan's devices on the local emulated cluster of --cluster: one network namespace, "
                   "bandwidth shaper and CPU quota per device, latency added per message (needs root; otherwise "
                   "plain processes with the network emulated in the transport)")
    p.add_argument("--emulate-cpus", type=float, metavar="N",
                   help="with --emulate: cores the whole cluster's devices share in proportion to their TFLOP/s, as "
                   "in `spantrain profile --cluster C --cpus N` (default: all cores)")
    p.add_argument("--emulate-mode", choices=("auto", "netns", "local"), default="auto",
                   help="with --emulate: netns (namespaces or fail), local (plain processes), auto (default)")
    p.add_argument("--emulate-network", metavar="FILE",
                   help="with --emulate: emulate this cluster file's devices and links, and follow its changes, "
                   "instead of --cluster's; the run plans and adapts on --cluster as on a real cluster whose spec is "
                   "out of date (what --measure-links finds out)")
    p.add_argument("--adapt", action="store_true",
                   help="follow the --cluster file while training: when it changes (spantrain profile -o FILE, a "
                   "monitor, an edit), re-plan from the running plan and, if moving pays off over the iterations "
                   "left, continue from a checkpoint on the new plan (needs --checkpoint-dir; local and --emulate "
                   "runs; with --emulate the file is also the emulated network)")
    p.add_argument("--measure-links", action=argparse.BooleanOptionalAction, default=None,
                   help="measure the plan's links in-band after the first iteration and whenever iterations drift, "
                   "and write the links that changed into RUN_DIR/cluster-measured.json; with --adapt the run "
                   "re-plans on it (--emulate and torchrun runs; default: on with --adapt)")
    p.add_argument("--policy", metavar="FILE",
                   help="policy file for --planner and --adapt-planner ppo or auto, e.g. one `spantrain train-policy` "
                   "wrote (default: the shipped policy)")
    p.add_argument("--adapt-planner", default="auto", metavar="NAME",
                   help="with --adapt: who proposes the new plan: auto (the policy and the heuristic, default), "
                   "ppo, heuristic or any planner of `spantrain compare`")
    add_calibration_arg(p, "for --planner's and --adapt's plans and the run's predicted s/iteration (reported "
                        "beside the measured one)",
                        default="with --emulate emulated-cpu; otherwise the built-in constants")
    add_json_arg(p)
    p.set_defaults(func=_run)


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (or another launcher that sets the env:// variables)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _check_numbers(args: argparse.Namespace) -> None:
    if args.steps <= 0:
        raise ExecutionError(f"--steps must be a positive integer, got {args.steps}")
    if args.checkpoint_every is None:
        args.checkpoint_every = ADAPT_CHECKPOINT_EVERY if args.adapt and args.checkpoint_dir else 0
    if args.checkpoint_every < 0:
        raise ExecutionError(f"--checkpoint-every must be >= 0, got {args.checkpoint_every}")
    if args.keep_checkpoints < 1:
        raise ExecutionError(f"--keep-checkpoints must be >= 1, got {args.keep_checkpoints}")
    check_finite("--lr", args.lr, "> 0", args.lr > 0)
    check_finite("--weight-decay", args.weight_decay, ">= 0", args.weight_decay >= 0)
    if args.lr * args.weight_decay >= 1:  # AdamW scales the weights by 1 - lr * weight decay each step
        raise ExecutionError(f"--weight-decay times --lr must be below 1 (AdamW shrinks the weights by that "
                             f"fraction each step), got {args.weight_decay:g} x {args.lr:g}: lower --weight-decay")
    check_finite("--adam-eps", args.adam_eps, "> 0", args.adam_eps > 0)
    check_seed(args.seed)
    if args.loss_scale is not None:
        check_finite("--loss-scale", args.loss_scale, "in [1, 2^40]", 1 <= args.loss_scale <= 2.0**40)
    if args.threads is not None and not 1 <= args.threads <= MAX_THREADS:
        raise ExecutionError(f"--threads must be from 1 to {MAX_THREADS}, got {args.threads}")
    check_finite("--timeout", args.timeout, f"of seconds in [{MIN_TIMEOUT_S:g}, {MAX_TIMEOUT_S:g}]",
                  MIN_TIMEOUT_S <= args.timeout <= MAX_TIMEOUT_S)
    if args.checkpoint_every and not args.checkpoint_dir:
        raise ExecutionError("--checkpoint-every needs --checkpoint-dir")
    if not args.emulate and (args.emulate_cpus is not None or args.emulate_mode != "auto"):
        raise ExecutionError("--emulate-cpus and --emulate-mode only apply with --emulate")
    if args.emulate_cpus is not None:
        check_finite("--emulate-cpus", args.emulate_cpus, "> 0", args.emulate_cpus > 0)
    if args.emulate and under_torchrun():
        raise ExecutionError("--emulate starts its own processes: run it directly, not under torchrun")
    if args.adapt and under_torchrun():
        raise ExecutionError("--adapt restarts the workers on a new plan, which torchrun's processes cannot do: run "
                             "without torchrun, or follow the drift note (spantrain plan --from, then --resume)")
    if args.adapt and not args.checkpoint_dir:
        raise ExecutionError("--adapt needs --checkpoint-dir DIR: a plan switch carries the training state over "
                             "through a checkpoint")
    if args.adapt_planner != "auto" and not args.adapt:
        raise ExecutionError("--adapt-planner only applies with --adapt")
    if args.adapt:
        from spantrain.policies.registry import get_planner

        get_planner(args.adapt_planner)  # an unknown name fails now, not at the first change
    if args.policy is not None:
        users = [f for f, name in (("--planner", args.planner), ("--adapt-planner", args.adapt and args.adapt_planner))
                 if name in _POLICY_PLANNERS]
        if not users:
            raise ExecutionError("--policy is for the policy's planners: add --planner ppo or auto, or --adapt "
                                 "(whose --adapt-planner auto uses it), or leave it out")
        from spantrain.cli.plan import check_policy

        check_policy(args.policy)  # a file that does not load fails now, not at the first change


def _check_paths(args: argparse.Namespace) -> None:
    """Directories the run writes that exist as files: refused now, not by a worker mid-run."""
    for flag, path in (("--checkpoint-dir", args.checkpoint_dir), ("--run-dir", args.run_dir)):
        check_dir_option(flag, path, full=True)  # a full disk: the run failed at its first records
    if args.checkpoint_dir:
        _check_not_one_checkpoint(Path(args.checkpoint_dir))
    if args.metrics and Path(args.metrics).is_dir():
        raise ExecutionError(f"--metrics {args.metrics} is a directory: pass a file path")
    if args.metrics:
        _check_metrics_is_no_other_file(args)


def _check_metrics_is_no_other_file(args: argparse.Namespace) -> None:
    """--metrics naming the run directory (not made yet: "Is a directory" from a worker) or a file the
    run reads (refused as "another run's metrics ... continue that run with --resume")."""
    metrics = Path(args.metrics)
    for flag, path in (("--run-dir", args.run_dir), ("--checkpoint-dir", args.checkpoint_dir)):
        if path and metrics.resolve() == Path(path).resolve():
            raise ExecutionError(f"--metrics {args.metrics} is the {flag} directory: pass a file path (by default "
                                 "the metrics go to RUN_DIR/metrics.jsonl)")
    reads = {"--cluster": args.cluster, "--model": args.model, "--plan": args.plan, "--data": args.data,
             "--calibration": args.calibration, "--rank-map": args.rank_map,
             "--emulate-network": args.emulate_network}
    flag = file_read_by(metrics, reads)
    if flag:
        raise ExecutionError(f"--metrics {args.metrics} is the file {flag} reads: pass another file for the metrics")


def _check_not_one_checkpoint(path: Path) -> None:
    """Refuse a --checkpoint-dir that is one checkpoint (the ``step-N`` directory a run prints as
    "checkpoint: ..."): with --resume it holds no checkpoint to find, and without it the run would
    write its own checkpoints inside that one."""
    if (path / "train_state.json").is_file() or (path / "meta.json").is_file():
        raise ExecutionError(f"--checkpoint-dir {path} is one checkpoint, not a checkpoint directory: pass the "
                             f"directory that holds it, {path.resolve().parent} (--resume continues from its latest "
                             "checkpoint)")


def other_data_note(before: str | None, now: str | None) -> str | None:
    """A note when a resumed run trains on other data than the checkpoint's run did: allowed
    (fine-tuning on new data is a reason to resume), but the sample sequence changes."""
    if before == now:
        return None
    now_s, before_s = (d or "the built-in synthetic corpus" for d in (now, before))
    return f"resuming on {now_s}, where the checkpoint's run trained on {before_s}: the sample sequence changes"


_OPTIM_FLAGS = {"lr": "--lr", "weight_decay": "--weight-decay", "eps": "--adam-eps"}


def other_optim_note(before: dict[str, Any] | None, now: dict[str, float]) -> str | None:
    """A note when a resumed run trains with other AdamW settings than the checkpoint's run: allowed
    (a new learning rate is a reason to resume), but a flag left out takes its default, not the
    checkpoint's value, and the run would otherwise change its learning rate without a word. That
    reason is given only when a changed setting is at its default: one passed on purpose needs
    no explanation."""
    if not isinstance(before, dict):
        return None
    changed = [key for key in _OPTIM_FLAGS
               if isinstance(before.get(key), (int, float)) and before[key] != now[key]]
    if not changed:
        return None
    note = "resuming with " + ", ".join(f"{_OPTIM_FLAGS[key]} {now[key]:g} (the checkpoint's run: {before[key]:g})"
                                        for key in changed)
    if any(now[key] == _OPTIM_DEFAULTS[key] for key in changed):
        note += "; AdamW settings left out take their defaults, not the checkpoint's"
    return note


def _other_plan_note(checkpoint: Path, plan, trained_on: dict | None = None, cluster=None) -> str | None:
    """A note when a resumed run trains on another plan than the checkpoint's run continued on:
    allowed (a run resumes onto any plan), but after `--adapt` switched plans the command's own
    --plan is the abandoned one (a resume went back to a 17x slower plan unsaid). The plan is
    the checkpoint's plan file, else (older checkpoints) `trained_on`, its train state's."""
    from spantrain.plan import Plan
    from spantrain.runtime.checkpoint import PLAN_FILE

    path = checkpoint / PLAN_FILE
    try:
        last = Plan.from_file(path) if path.exists() else Plan.from_dict(trained_on) if trained_on else None
    except SpantrainError:  # not readable: nothing to compare with
        return None
    if last is None or _same_plan(last, plan):
        return None
    gone = [d for d in last.devices if cluster is not None and d not in cluster]
    if gone:  # that plan cannot run here: naming it for --plan sent the user into an error
        how = f"that plan needs device(s) --cluster no longer has ({', '.join(gone)})"
    elif path.exists():
        how = f"pass --plan {path} to continue on that one"
    else:
        how = "its plan is in its train_state.json"
    return f"resuming on another plan than the run of checkpoint {checkpoint.name} continued on: {how}"


def _same_plan(a, b) -> bool:
    """Whether two plans train alike (what each predicted and the model it names aside)."""
    return dataclasses.replace(a, predicted=None, model=None) == dataclasses.replace(b, predicted=None, model=None)


def _plan_adapted_to(checkpoint_dir: Path, make_plan: Callable[[], Any], cluster, workload, flag: str,
                     global_batch: int | None = None):
    """Under --adapt, a resume continues on the plan its last checkpoint was trained on (the one an
    adaptation switched to), not on the command's own (`make_plan()`): it went back to the abandoned
    plan, 9.7 s an iteration against 7e-05, and never re-planned (its cluster file had changed
    before it started); and a command whose plan lost a device was refused. The command's plan
    when the checkpoint's cannot run here (devices gone, another model, another `global_batch`
    than --global-batch asks for: it trained the checkpoint's batch, and every re-plan failed)."""
    from spantrain.runtime.checkpoint import PLAN_FILE, latest_checkpoint

    latest = latest_checkpoint(checkpoint_dir)
    path = latest / PLAN_FILE if latest is not None else None
    if path is None or not path.is_file():
        return make_plan()
    try:
        last = load_plan(str(path), cluster, workload, global_batch)
    except SpantrainError:  # _other_plan_note says why it cannot be continued on
        return make_plan()
    try:
        plan = make_plan()
    except SpantrainError as e:
        _note(f"--adapt: resuming on the plan checkpoint {latest.name} was trained on ({path}): {flag}'s cannot run "
              f"here ({e})")
        return last
    if _same_plan(last, plan):
        return plan
    _note(f"--adapt: resuming on the plan checkpoint {latest.name} was trained on ({path}), not {flag}'s: "
          "adaptation chose it; it goes on re-planning from there")
    return last


def _job_paths(state: dict[str, Any]) -> tuple[Path, Path | None] | None:
    """The checkpoint's job's run directory and metrics file, while that directory is still the
    job's own: found relative to the checkpoints (a copied project continues in the copy) and
    holding the job's id (another job's directory made in the same place since is not taken over)."""
    rel, job, metrics = state.get("run_dir"), state.get("job_id"), state.get("metrics_path")
    if not (isinstance(rel, str) and rel and isinstance(job, str) and job):
        return None
    base = Path(state["path"]).parent
    run_dir = (base / rel).resolve()
    if _job_of(run_dir) != job:
        return None
    return run_dir, (base / metrics).resolve() if isinstance(metrics, str) and metrics else None


def _job_of(run_dir: Path) -> str | None:
    """The id of the job whose run directory `run_dir` is (None: none recorded, or unreadable)."""
    from spantrain.runtime.launcher import JOB_ID_FILE

    try:
        return (run_dir / JOB_ID_FILE).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _check_not_another_jobs(run_dir: Path, state: dict[str, Any]) -> None:
    """Refuse to resume into a run directory another job made: its metrics, job id, result and W&B
    run would take this one's records (and that job's own --resume would no longer find it). A
    directory without a job id (new, or from before runs kept theirs) is not refused."""
    job = state.get("job_id")
    theirs = _job_of(run_dir)
    if isinstance(job, str) and job and theirs is not None and theirs != job:
        own = _job_paths(state)
        instead = (f"leave --run-dir out to continue in the checkpoint's own, {own[0]}" if own is not None else
                   "pass a new --run-dir")
        raise ExecutionError(f"--run-dir {run_dir} holds another run's records (job {theirs}; the checkpoint's run "
                             f"is job {job}): {instead}")


def _check_checkpoint_dir(path: str, resume: bool) -> None:
    """Refuse now, not at the first checkpoint (without --checkpoint-every, the end of the run:
    all of its training lost), a checkpoint directory that cannot be written; and, without
    --resume, one holding a run's checkpoints, which this run would overwrite step by step."""
    from spantrain._spec import require_writable_dir
    from spantrain.runtime.checkpoint import latest_checkpoint

    pointer = Path(path) / "latest"  # the file every save replaces: in its place a directory failed the run at its end
    if pointer.exists() and not pointer.is_file():
        raise ExecutionError(f"--checkpoint-dir {path} holds {pointer}, which is not the pointer file a run writes "
                             "there (a directory?): remove it")
    latest = None if resume else latest_checkpoint(path)
    if latest is not None:
        raise ExecutionError(f"--checkpoint-dir {path} already holds the checkpoints of a run (latest: {latest.name}): "
                             "add --resume to continue it, or pass another directory to start anew")
    require_writable_dir(path, "--checkpoint-dir", ExecutionError, create=False)  # the run's lock makes it


def _check_metrics_dir(path: str) -> None:
    """Refuse now a --metrics file whose directory cannot be made or written (a file in its place, no
    permission): rank 0 failed on it once every worker had started, with a bare OSError."""
    from spantrain._spec import require_writable_dir

    if Path(path).exists() and not Path(path).is_file():  # the launcher reads it back: /dev/zero never ends
        raise ExecutionError(f"--metrics {path} is not a regular file (a device or a pipe): pass a file path")
    require_writable_dir(Path(path).parent, f"--metrics {path}: its directory", ExecutionError,
                         fix="pass a file path in a directory this run can write", create=False)


def _metrics_of_this_job(path: Path) -> bool:
    """Whether the metrics file `path` was started by this torchrun job: its last ``start``
    event names the job's ``TORCHELASTIC_RUN_ID`` (never without one: torchrun's default "none")."""
    from spantrain.runtime.worker import torchrun_job

    job = torchrun_job()
    if job is None or not path.is_file():
        return False
    try:
        starts = [json.loads(line) for line in path.read_text().splitlines() if '"event": "start"' in line]
    except (OSError, ValueError):
        return False
    return bool(starts) and isinstance(starts[-1], dict) and starts[-1].get("job") == job


def _check_no_metrics(path: Path, flag: str) -> None:
    """Refuse a new run whose metrics file holds another run's iterations: it appends (a resumed
    run continues its run's file), so the two runs' records would mix in one file. A live run
    there is named first (its lock). (A --checkpoint-dir holding checkpoints was refused before,
    with --resume as the way on.)"""
    from spantrain.runtime.launcher import lock_holder, refuse_held

    if flag == "--run-dir":
        refuse_held(path.parent, flag)
    elif holder := lock_holder(path.parent):
        raise ExecutionError(f"--metrics {path} is in the directory of another spantrain run ({holder}), which is "
                             "running: wait for it to finish, or pass another --metrics")
    if not (path.is_file() and path.stat().st_size > 0):
        return
    if flag == "--metrics":
        raise ExecutionError(f"--metrics {path} holds another run's metrics: pass another --metrics (or remove that "
                             "file), or continue that run with --resume and the --checkpoint-dir it wrote")
    checkpoints = _checkpoint_dir_of(path.parent)
    if checkpoints is None:  # --resume finds nothing: sending the user there went round in a circle
        raise ExecutionError(f"--run-dir {path.parent} holds the metrics of a run that left no checkpoint to resume "
                             f"from ({path}): remove that file to start over in it, or pass another --run-dir")
    raise ExecutionError(f"--run-dir {path.parent} holds another run's metrics ({path}): continue that run with "
                         f"--resume --checkpoint-dir {checkpoints}, or pass another --run-dir (or remove that file)")


def _checkpoint_dir_of(run_dir: Path) -> Path | None:
    """Where the run of `run_dir` left a complete checkpoint (its run_config.json says where it
    wrote them), else None."""
    from spantrain.runtime.checkpoint import latest_checkpoint

    try:
        written = json.loads((run_dir / "run_config.json").read_text()).get("checkpoint_dir")
    except (OSError, ValueError, AttributeError):
        written = None
    if not isinstance(written, str) or not written:
        return None
    path = Path(written) if Path(written).is_absolute() else run_dir / written
    return path if latest_checkpoint(path) is not None else None


_POLICY_PLANNERS = ("ppo", "auto")
"""The planners that run the policy, and so take --policy."""


def _policy_option(args: argparse.Namespace, planner: str | None) -> dict[str, str]:
    """`planner`'s keyword options: --policy for the planners that run the policy."""
    return {"policy": args.policy} if args.policy and planner in _POLICY_PLANNERS else {}


def _make_plan(args: argparse.Namespace, cluster, workload, calibration):

    if args.plan:
        return load_plan(args.plan, cluster, workload, args.global_batch)
    from spantrain.planner import plan_with
    from spantrain.policies.registry import get_planner

    return plan_with(get_planner(args.planner, **_policy_option(args, args.planner)), cluster, workload, calibration)


def _check_network(path: str, emulate: bool, plan) -> None:
    """--emulate-network: with --emulate, a cluster file that holds every device of the plan."""
    from spantrain.errors import SpecError

    if not emulate:
        raise SpecError("--emulate-network sets the emulated cluster's network: add --emulate, or leave it out")
    try:
        network = load_cluster(path)
    except SpecError as e:  # named by its flag: the run reads two cluster files
        raise SpecError(f"--emulate-network {e}") from None
    missing = [d for d in plan.devices if d not in network]
    if missing:
        raise SpecError(f"--emulate-network {path} has no device {', '.join(missing)} of the plan: it must hold the "
                        "devices of --cluster that the plan uses")


def run_where(emulate: bool, torchrun: bool) -> str:
    """Where a run's devices are: ``emulated`` (``--emulate``, or `spantrain emulate -- spantrain run`,
    whose processes run under torchrun's variables), ``torchrun`` (real devices) or ``local``."""
    from spantrain.runtime.emulator.latency import ENV_VAR

    if emulate or os.environ.get(ENV_VAR):
        return "emulated"
    return "torchrun" if torchrun else "local"


def _default_run_dir(torchrun: bool) -> str:
    if torchrun:  # every process of the job must agree on it
        return f"runs/torchrun-{os.environ.get('TORCHELASTIC_RUN_ID', os.environ.get('MASTER_PORT', 'job'))}"
    return f"runs/run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _run(args: argparse.Namespace) -> int:
    from spantrain.runtime.checkpoint import latest_checkpoint
    from spantrain.runtime.config import OptimConfig, RunConfig
    from spantrain.runtime.prediction import calibration_name, comparable, default_calibration, predicted_step_s
    from spantrain.runtime.preflight import (
        check_memory,
        check_run,
        cpu_cores,
        resume_state,
        threads_per_rank,
        visible_gpus,
    )
    from spantrain.tracking import wandb_run_id

    _check_numbers(args)
    _check_paths(args)
    if args.track:
        from spantrain.tracking import check_environment

        check_environment()  # a WANDB_* value wandb refuses fails now, not in rank 0 once every worker started
    cluster = load_cluster(args.cluster)
    workload = load_model(args)
    if args.adapt and args.adapt_planner == "exhaustive":
        from spantrain.policies.compare import EXHAUSTIVE_MAX_DEVICES

        if len(cluster) > EXHAUSTIVE_MAX_DEVICES:  # every re-plan failed, one note per change
            raise ExecutionError(f"--adapt-planner exhaustive covers at most {EXHAUSTIVE_MAX_DEVICES} devices and "
                                 f"{args.cluster} has {len(cluster)}: pick another (--adapt-planner auto, the "
                                 "default, or heuristic)")
    torchrun = under_torchrun()
    where = run_where(args.emulate, torchrun)
    emulated = where == "emulated"
    calibration = (load_calibration(args.calibration) if args.calibration is not None
                   else default_calibration(emulated))
    if args.adapt and args.resume:
        plan = _plan_adapted_to(Path(args.checkpoint_dir), lambda: _make_plan(args, cluster, workload, calibration),
                                cluster, workload, "--plan" if args.plan else "--planner", args.global_batch)
    else:
        plan = _make_plan(args, cluster, workload, calibration)
    check_run(cluster, workload, plan, data=args.data)  # refuses before any process starts
    if args.emulate_network:
        _check_network(args.emulate_network, args.emulate, plan)
    # a local run on this machine's GPUs (one per worker): their memory is not the host's
    on_gpus = not (args.emulate or torchrun) and len(plan.devices) <= visible_gpus()
    note = check_memory(cluster, workload, plan, on_this_machine=not (torchrun or on_gpus), calibration=calibration)
    if note:
        _note(note)
    if args.rank_map:
        from spantrain.runtime.rankmap import ranks_from_file

        try:
            ranks_from_file(args.rank_map, plan)
        except ExecutionError as e:  # named by its flag, as --data and --calibration are
            raise ExecutionError(f"--rank-map {e}") from None
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) if torchrun else 0
    if torchrun and not restart and _restarts_share_the_store():
        _note("torchrun keeps one rendezvous store across restarts, so a restarted attempt can read this "
              "one's gloo addresses and fail or hang (pytorch/pytorch#135712): start torchrun with "
              "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1")
    if restart and args.checkpoint_dir and not args.resume:
        # torchrun --max-restarts started this attempt after a failure: continue from the last
        # checkpoint this job wrote (the first attempt's command has no --resume); another job's
        # checkpoints stay refused, as the first attempt was
        from spantrain.runtime.checkpoint import read_json
        from spantrain.runtime.worker import torchrun_job

        latest = latest_checkpoint(args.checkpoint_dir)
        state = read_json(latest / "train_state.json") if latest is not None else {}
        if torchrun_job() is not None and state.get("job") == torchrun_job():
            if int(state["step"]) >= args.steps:  # it failed after its last checkpoint
                _note(f"torchrun restart {restart}: the job already trained its {args.steps} iterations "
                      f"(checkpoint {latest})")
                return 0
            args.resume = True
            _note(f"torchrun restart {restart}: resuming from {latest}")
    seed = args.seed
    if args.resume:
        state = resume_state(args.checkpoint_dir, workload, args.steps)
        if state["seed"] != seed:
            # The data order follows the seed; the checkpoint's keeps the sample sequence intact.
            _note(f"resuming with the checkpoint's seed {state['seed']} (not --seed {seed})")
            seed = int(state["seed"])
        note = other_data_note(state.get("data"), str(Path(args.data).resolve()) if args.data else None)
        if note:
            _note(note)
        note = other_optim_note(state.get("optim"), {"lr": args.lr, "weight_decay": args.weight_decay,
                                                     "eps": args.adam_eps})
        if note:
            _note(note)

    if torchrun:
        world = int(os.environ.get("WORLD_SIZE", "0") or 0)
        if world != len(plan.devices):  # found now, not after every process met and built its groups
            raise ExecutionError(f"the plan uses {len(plan.devices)} device(s) but {world} process(es) started: start "
                                 "exactly one process per plan device (torchrun --nnodes x --nproc-per-node)")
    if args.checkpoint_dir:
        _check_checkpoint_dir(args.checkpoint_dir, args.resume)
    if args.metrics:
        _check_metrics_dir(args.metrics)
    if args.resume and not args.run_dir and not torchrun and (own := _job_paths(state)):
        # the checkpoint's run goes on: its metrics file and W&B run continue (a new directory each time
        # split one run's records over many)
        args.run_dir = str(own[0])
        _note(f"continuing in the run directory of the checkpoint's run, {args.run_dir} (--run-dir to choose another)")
        # refused now, as when given: on a full disk the workers failed at once, naming --resume as the fix
        check_dir_option("--run-dir", args.run_dir, full=True)
        if not args.metrics and own[1] is not None and own[1].is_file():
            args.metrics = str(own[1])  # it wrote its metrics elsewhere (--metrics): they go on there
            check_dir_option("--metrics", own[1].parent, full=True)
    run_dir = Path(args.run_dir or _default_run_dir(torchrun)).resolve()
    if args.resume and not torchrun:
        _check_not_another_jobs(run_dir, state)
    metrics_path = Path(args.metrics).resolve() if args.metrics else run_dir / "metrics.jsonl"
    # under torchrun rank 0 checks (it writes the file; the others may start after it began); a
    # restarted attempt continues the file its own job started
    own = restart and _metrics_of_this_job(metrics_path)
    if not args.resume and (not torchrun or (not own and os.environ.get("RANK") == "0")):
        _check_no_metrics(metrics_path, "--metrics" if args.metrics else "--run-dir")
    if args.resume and os.environ.get("RANK", "0") == "0":
        note = _other_plan_note(Path(state["path"]), plan, state.get("plan"), cluster)
        if note:
            _note(note)

    precision = args.precision or ("fp32" if workload.precision == "fp32" else "bf16")
    if workload.precision == "fp16" and not args.precision:
        _note("training the model's fp16 in bf16 mixed precision: the same bytes per value, and no loss scale to "
              "tune (--precision fp16 for GPUs without bf16, --precision fp32 to avoid)")
    if precision == "fp16":
        import torch

        if not torch.cuda.is_available():  # CPUs have bf16 kernels; their fp16 matmuls are emulated
            _note("fp16 on CPUs computes many times slower than bf16 or fp32 (no fast fp16 kernels): it is for "
                  "GPUs without bf16; use --precision bf16 on CPUs")
    if args.resume and state.get("precision") not in (None, precision):
        _note(f"resuming in {precision}, where the checkpoint's run trained in {state['precision']}"
              + ("" if args.precision else f" (pass --precision {state['precision']} to continue as it was)"))
    if args.loss_scale is not None and precision != "fp16":
        raise ExecutionError(f"--loss-scale applies to fp16 training, and this run trains in {precision}: add "
                             "--precision fp16, or leave --loss-scale out")
    if args.resume and args.loss_scale is not None and "loss_scale" in state:  # checked by resume_state
        _note(f"resuming with the checkpoint's loss scale {state['loss_scale']['scale']:g} (not --loss-scale "
              f"{args.loss_scale:g}): the scale it reached is the one that works")
    zb_orders = zb_source = None
    if not torchrun:
        from spantrain.runtime.zb_order import run_orders

        zb_orders, zb_source = run_orders(cluster, workload, plan, calibration)
    model = args.model if not Path(args.model).exists() else str(Path(args.model).resolve())
    cfg = RunConfig(cluster_spec=cluster.to_spec(), model=model, global_batch=args.global_batch,
                    plan=plan.to_dict(), steps=args.steps, seed=seed,
                    optim=OptimConfig(lr=args.lr, weight_decay=args.weight_decay, eps=args.adam_eps),
                    data=str(Path(args.data).resolve()) if args.data else None, run_dir=str(run_dir),
                    metrics_path=str(metrics_path),
                    checkpoint_dir=str(Path(args.checkpoint_dir).resolve()) if args.checkpoint_dir else None,
                    checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints,
                    resume=args.resume, track=args.track, timeout_s=args.timeout,
                    wandb_id=wandb_run_id(run_dir / "wandb", resume=args.resume) if args.track else None,
                    # one job, across its resumes: its checkpoints find its run directory by it
                    job_id=None if torchrun else (state.get("job_id") if args.resume else None) or uuid.uuid4().hex,
                    planner=f"file:{Path(args.plan).resolve()}" if args.plan else args.planner,
                    rank_map=str(Path(args.rank_map).resolve()) if args.rank_map else None,
                    zb_orders=zb_orders, zb_order_source=zb_source, threads=args.threads, precision=precision,
                    **({"loss_scale": args.loss_scale} if args.loss_scale is not None else {}),
                    measure_links=args.measure_links if args.measure_links is not None else args.adapt,
                    calibration=calibration.to_dict() if calibration is not None else None,
                    predicted_step_s=predicted_step_s(cluster, workload, plan, calibration),
                    prediction_comparable=comparable(cluster, workload, plan, where=where),
                    prediction_calibration=calibration_name(args.calibration, emulated=emulated))

    if torchrun:
        result = _run_torchrun(cfg)
        if result is None:  # not rank 0: rank 0 reports
            return 0
    else:
        world = len(plan.devices)
        cores = cpu_cores()

        def machine_notes() -> None:  # once the run is sure to start: not above a refusal of its directories
            if world > cores and not (args.emulate or on_gpus):
                _note(f"{world} worker processes share {cores} CPU cores: the run works, but iteration times "
                      "are those of shared cores, not of separate devices")
            elif args.threads and args.threads > 1 and args.threads * world > cores:
                default = threads_per_rank(world)  # what the workers take without --threads
                _note(f"--threads {args.threads} x {plural(world, 'worker')} is {args.threads * world} threads on "
                      f"{cores} CPU cores: they will wait for each other (leave --threads out to give each worker "
                      f"cores / workers = {plural(default, 'thread')})")
            if args.measure_links and not args.emulate:
                _note("--measure-links measures nothing in a plain local run (its workers share this machine's "
                      "loopback, not the spec's links): add --emulate, or run under torchrun")
        from spantrain.runtime.launcher import check_emulated, launch_emulated, launch_local, run_dir_lock

        show = args.progress if args.progress is not None else sys.stderr.isatty()

        def launch(cfg, adapter=None):
            if args.emulate:
                return launch_emulated(cfg, cpus=args.emulate_cpus, mode=args.emulate_mode, progress=show,
                                       network=args.emulate_network,
                                       adapter=adapter)
            return launch_local(cfg, progress=show, adapter=adapter)

        if args.emulate:  # input the emulator refuses makes no run directory
            check_emulated(cfg, cpus=args.emulate_cpus, mode=args.emulate_mode, network=args.emulate_network)
        # this process owns the run and checkpoint directories until the run ends, however it ends
        with contextlib.ExitStack() as owned:
            # the checkpoints first: a resume's run directory may be another live run's, found by its checkpoints
            if args.checkpoint_dir and Path(args.checkpoint_dir).resolve() != run_dir:
                owned.enter_context(run_dir_lock(Path(args.checkpoint_dir).resolve(), "--checkpoint-dir"))
            owned.enter_context(run_dir_lock(run_dir))
            machine_notes()
            try:
                if args.adapt:
                    from tqdm import tqdm

                    from spantrain.runtime.adapter import CLUSTER_SEEN_FILE, Adapter, ClusterFile, run_adapting

                    # the content the run last acted on, for a resume to notice a change made while it was stopped
                    watched = ClusterFile(args.cluster, record=run_dir / CLUSTER_SEEN_FILE, resume=bool(args.resume))
                    adapter = Adapter(cluster_file=watched, plan=plan, cluster=cluster,
                                      measured_file=ClusterFile(run_dir / "cluster-measured.json")
                                      if cfg.measure_links else None,
                                      steps=args.steps, replan=_replanner(args.adapt_planner, cluster, workload, plan,
                                                                          calibration, args.emulate_network,
                                                                          _policy_option(args, args.adapt_planner)),
                                      # above the progress bar when there is one
                                      note=lambda m: tqdm.write(f"spantrain run: note: {m}", file=sys.stderr))
                    result = run_adapting(cfg, launch, adapter)
                else:
                    result = launch(cfg)
            except KeyboardInterrupt as e:
                # Workers stopped together and checkpointed: report what was trained, then exit as interrupted.
                partial = run_dir / "result.json"
                if partial.exists():
                    _report(json.loads(partial.read_text()), args.json, args.lr)
                    raise
                # Killed before they got there (Ctrl-C twice): what is left to continue from.
                latest = latest_checkpoint(args.checkpoint_dir) if args.checkpoint_dir else None
                from spantrain.runtime.metrics import read_step_records

                done = next((r["step"] for r in reversed(read_step_records(metrics_path))), None)
                lost = "" if latest or not done else (
                    f" (the {plural(done, 'iteration')} trained {'is' if done == 1 else 'are'} lost"
                    + ("" if args.checkpoint_dir else ": --checkpoint-dir DIR keeps a run's progress") + ")")
                raise KeyboardInterrupt(f"{e}{' ' if str(e) else ''}before the workers finished; " + (
                    f"last checkpoint: {latest} (continue with --resume)" if latest
                    else f"no checkpoint was written{lost}")) from None
        result["cpu_cores"] = cores
        result["oversubscribed"] = world > cores and not args.emulate
        result["emulated"] = bool(args.emulate)
    _report(result, args.json, args.lr)
    if result.get("stopped_by") and not torchrun:  # torchrun stops its processes itself, and says so
        say(f"spantrain run: interrupted: {_stopped_by(result['stopped_by'])}, and the run stopped with "
             f"{'it' if len(result['stopped_by']) == 1 else 'them'} after iteration {result['final_step']}; "
             + (f"last checkpoint: {result['checkpoint']} (continue with --resume)" if result.get("checkpoint")
                else "no checkpoint was written (--checkpoint-dir DIR keeps a run's progress)"))
        return INTERRUPTED
    return 0


def _stopped_by(ranks: list[dict[str, Any]]) -> str:
    """'worker rank 1 (device b-0) got SIGTERM', for the workers a signal stopped on their own."""
    return "; ".join(f"worker rank {r['rank']} (device {r['device']}) got {r['signal']}" for r in ranks)


def _replanner(planner: str, cluster, workload, plan, calibration=None, emulated_network: str | None = None,
               options: dict[str, Any] | None = None):
    """`--adapt`'s re-planner: `spantrain.policies.adapt.adapt_plan` with `planner`, as a `Decision`.
    With `emulated_network` (--emulate-network), only the devices that file emulates can be
    planned on: the others of the cluster file exist for the run, not for the emulator. `options`
    go to the planner (``policy=FILE``)."""
    from spantrain.policies.adapt import adapt_plan
    from spantrain.runtime.adapter import Decision

    # Decide once now, on the cluster as it is: loading the cost model's compiled kernels and the
    # policy takes seconds, which would otherwise pass at the first change while the workers train on.
    with contextlib.suppress(SpantrainError):  # only the loading matters here; a plan that fails is the run's
        adapt_plan(cluster, workload, plan, remaining_steps=1, planner=planner, calibration=calibration,
                   **(options or {}))

    emulated_ids: set[str] | None = None

    def replan(running, cluster, remaining: int) -> Decision:
        nonlocal emulated_ids
        if emulated_network is not None:
            with contextlib.suppress(SpantrainError):  # a network file being rewritten: the last one that loaded
                emulated_ids = set(load_cluster(emulated_network).ids)
            if emulated_ids is not None:  # a switch onto a device not emulated failed the run
                cluster = cluster.subset([d for d in cluster.ids if d in emulated_ids])
        a = adapt_plan(cluster, workload, running, remaining_steps=remaining, planner=planner,
                       calibration=calibration, **(options or {}))
        chosen = a.option(a.chosen)
        kept = a.option("keep") if any(o.name == "keep" for o in a.options) else None
        fits = kept is not None and math.isfinite(kept.iteration_s)
        # None, not inf, for a running plan that no longer fits: the record is JSON and a W&B chart
        record = {**a.to_dict(), "iteration_s_kept": kept.iteration_s if fits else None,
                  "iteration_s_new": chosen.iteration_s, "migration_s": chosen.migration_s}
        others = ", ".join(f"{o.name} {o.iteration_s:.3g} s" + (f" + {o.migration_s:.3g} s to move" if o.migration_s
                                                                    else "")
                           for o in a.options if o.name != a.chosen)
        if a.missing:
            summary = (f"device(s) {', '.join(a.missing)} left the cluster: switching to the {a.chosen} plan "
                       f"({chosen.iteration_s:.3g} s/iteration)")
        elif not fits:
            summary = (f"the running plan no longer fits memory on the cluster as it is now: switching to the "
                       f"{a.chosen} plan ({chosen.iteration_s:.3g} s/iteration + {chosen.migration_s:.3g} s to move)")
        elif a.switch:
            summary = (f"switching to the {a.chosen} plan: {chosen.iteration_s:.3g} s/iteration + "
                       f"{chosen.migration_s:.3g} s to move, over {remaining} iteration(s) left (others: {others})")
        else:
            summary = (f"keeping the running plan: {chosen.iteration_s:.3g} s/iteration now; moving does not pay off "
                       f"over {remaining} iteration(s) left ({others or 'no other option'})")
        return Decision(switch=a.switch, plan=a.plan, record=record, summary=summary)

    return replan


def _run_torchrun(cfg) -> dict[str, Any] | None:
    import signal

    from spantrain.runtime.worker import StopFlag, run_worker

    stop = StopFlag(armed=False)
    # torchrun's SIGTERM, and Ctrl-C (the terminal's SIGINT, which torchrun passes on too):
    # finish the iteration, checkpoint, exit; torchrun waits 30 s for that before killing.
    # Before training starts (rendezvous, set-up) they stop the process at once.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log = Path(cfg.run_dir) / "logs" / f"rank{rank}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    _pipelining_log_to(log)
    try:
        with stop.exit_when_blocked():
            return run_worker(cfg, rank=rank, world_size=world, init_method=None, local=False, stop=stop)
    except (SpantrainError, KeyboardInterrupt):
        raise
    except BaseException as e:  # e.g. a peer died: one line here, the traceback in the log
        import traceback

        with open(log, "a") as f:
            f.write(traceback.format_exc())
        raise RunFailed(_failure_line(cfg, rank, e, log)) from e


_PEER_LOST = ("connection reset", "connection closed", "connection refused", "broken pipe", "timed out",
              "timeout", "closed by peer")


def _failure_line(cfg, rank: int, error: BaseException, log: Path) -> str:
    """One line for a torchrun rank's failure: what happened (a peer that died or hung shows
    here as a lost connection or a timeout: torchrun's own output names the rank that exited),
    the last iteration the run recorded and the checkpoint to --resume from."""
    text = (str(error).strip().splitlines() or [""])[0]
    try:
        return _failure_details(cfg, rank, error, text, log)
    except Exception:  # the line must come out whatever the run directory holds
        return f"rank {rank}: {type(error).__name__}: {text} (traceback in {log})"


def _failure_details(cfg, rank: int, error: BaseException, text: str, log: Path) -> str:
    from spantrain.runtime.checkpoint import latest_checkpoint
    from spantrain.runtime.metrics import read_step_records

    if any(k in text.lower() for k in _PEER_LOST):
        short = text if len(text) <= 160 else text[:160].rsplit(" ", 1)[0] + " ..."
        what = f"lost contact with another rank ({short}): one died or hung (torchrun's output names it)"
    else:
        what = f"{type(error).__name__}: {text}"
    records = read_step_records(cfg.metrics_path)
    after = f" after iteration {records[-1]['step']}" if records else ""
    latest = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    resume = f"last checkpoint: {latest} (continue with --resume)" if latest else "no checkpoint was written"
    return f"rank {rank}: {what}{after}; {resume} (traceback in {log})"


def _pipelining_log_to(path: Path) -> None:
    """torch.distributed.pipelining logs a failed step's whole schedule (some 170 lines) at
    error level: into the rank's log file, not the terminal, where one line says what failed."""
    import logging

    logger = logging.getLogger("torch.distributed.pipelining")
    for handler in list(logger.handlers):  # torch._logging gives it a stderr handler of its own
        logger.removeHandler(handler)
    logger.addHandler(logging.FileHandler(path))
    logger.propagate = False


def _restarts_share_the_store() -> bool:
    """torchrun may restart this job (--max-restarts) and hands its workers the agent's own
    rendezvous store, which outlives an attempt (c10d rendezvous, `--standalone` included)."""
    try:
        restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    except ValueError:
        return False
    return restarts > 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _note(msg: str) -> None:
    if os.environ.get("RANK", "0") == "0" or not under_torchrun():  # once per job, not once per process
        print(f"spantrain run: note: {msg}", file=sys.stderr)


_RISEN = 1.25
"""A last loss this many times the first is noted as a rise (the learning rate likely too high)."""


def _report(result: dict[str, Any], as_json: bool, lr: float | None = None) -> None:
    import math

    losses = result.get("losses") or []
    finite = [x is not None and math.isfinite(x) for x in losses]
    # where the trailing non-finite stretch starts: an fp16 overflow's inf between finite losses is no divergence
    bad = len(finite) - finite[::-1].index(True) if any(finite) else 0
    stretch = len(finite) - bad
    # the run did what it was asked; the user must still hear it went nowhere (in fp16, one overflowing
    # forward at the end is skipped and the scale halved: no divergence)
    if stretch and not (result.get("precision") == "fp16" and stretch < 2):
        _note(f"the loss became {losses[bad]} at iteration {result['start_step'] + bad + 1} and stayed so: training "
              "diverged" + (f"; lower --lr (this run: {lr:g})" if lr is not None else ""))
    elif not stretch and len(losses) > 1 and losses[-1] > _RISEN * losses[0] > 0:
        # finite, but ended far above where it started (a wide model at the default --lr): the closing
        # line's "loss 5.39 -> 9.25" said it without a word on the cause
        _note(f"the loss rose from {losses[0]:.4g} to {losses[-1]:.4g} over the run: the learning rate may be too high "
              "for this model" + (f"; lower --lr (this run: {lr:g})" if lr is not None else ""))
    if as_json:
        print_json(result)
        if result.get("wandb"):  # as train-policy --json and the experiment scripts: stdout holds the JSON alone
            from spantrain.tracking import print_run_line

            print_run_line(result["wandb"], file=sys.stderr)
        return
    def fmt(x: Any, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    precision = result.get("precision", "fp32")
    mixed = f" in {precision} mixed precision" if precision != "fp32" else ""
    if result.get("skipped_steps"):
        mixed += (f" ({result['skipped_steps']} update(s) skipped on fp16 overflow, loss scale now "
                  f"{result['loss_scale']:g})")
    print(f"trained iterations {result['start_step']}..{result['final_step']} of {result['target_steps']}"
          f"{' (stopped early)' if result['stopped_early'] else ''}{mixed}: loss {fmt(result['loss_first'], '.4f')} -> "
          f"{fmt(result['loss_last'], '.4f')}, {fmt(result['samples_per_s'], '.1f')} samples/s "
          f"({fmt(result['step_s'], '.3f')} s/iteration, "
          # one or two iterations leave none out: "after warm-up" said otherwise
          f"{'median after warm-up' if result.get('warmup_steps', 1) else 'warm-up included: too few iterations'}"
          f"{' on the last plan' if len(result.get('segments') or []) > 1 else ''})")
    comparable = result.get("prediction_comparable")
    segments = result.get("segments") or []
    if comparable and len(segments) <= 1:
        print(f"predicted by the cost model ({result['prediction_calibration']}): "
              f"{_against(result.get('predicted_step_s'), result.get('step_s'))}")
    for k, seg in enumerate(segments if len(segments) > 1 else []):
        from spantrain.plan import Plan

        devices = Plan.from_dict(seg["plan"]).devices
        on = f"on {len(devices)} device(s) ({', '.join(devices)})"
        if seg["step_s"] is None:  # stopped mid-iteration at a switch: it read "iterations 0..0, n/a s/iteration"
            print(f"plan {k + 1}: {on}, stopped before it finished its iteration: the next plan went on from "
                  f"iteration {seg['final_step']}, the last checkpoint (or the start), and trained the rest again")
            continue
        predicted = f" (predicted {_against(seg.get('predicted_step_s'), seg['step_s'])})" if comparable else ""
        print(f"plan {k + 1}: iterations {seg['start_step']}..{seg['final_step']} {on}, "
              f"{fmt(seg['step_s'], '.3f')} s/iteration{predicted}")
    print(f"metrics: {result['metrics']}")
    if result.get("wandb"):
        from spantrain.tracking import print_run_line

        print_run_line(result["wandb"])
    if result.get("checkpoint"):
        print(f"checkpoint: {result['checkpoint']}")


_FAR_OFF = 3.0
"""A measured time this many times the prediction (or below its inverse) is no error of the cost
model's: the spec describes other devices than the run ran on."""


def _against(predicted: float | None, measured: float | None) -> str:
    """``0.612 s/iteration, measured 7 % slower``: a prediction beside the measured median."""
    if predicted is None:
        return "n/a"
    shown = f"{predicted:.3f}" if predicted >= 0.01 else readable(predicted)  # not 0.000 for an A100's 7.4e-05
    if not measured:
        return f"{shown} s/iteration"
    ratio = measured / predicted
    if ratio >= _FAR_OFF or ratio <= 1 / _FAR_OFF:
        how = f"{readable(ratio)}x slower" if ratio > 1 else f"{readable(1 / ratio)}x faster"
        return (f"{shown} s/iteration, measured {how}: the cluster spec does not describe the devices this ran on "
                "(`spantrain profile` measures them)")
    off = ratio - 1
    how = "as predicted" if abs(off) < 0.005 else f"{abs(off):.0%} {'slower' if off > 0 else 'faster'}"
    return f"{shown} s/iteration, measured {how}"
