"""Arguments and loaders shared by several commands."""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_cluster_arg", "add_model_args", "add_json_arg", "load_cluster", "load_model", "load_plan",
           "print_json", "stdout_console", "check_dir_option", "check_output_file", "check_finite",
           "check_seed", "add_calibration_arg", "load_calibration", "note_cpu_devices"]


def add_cluster_arg(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--cluster", "-c", required=required, metavar="FILE", help="cluster spec (YAML or JSON)")


def add_model_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    from spantrain.workload import MAX_GLOBAL_BATCH

    p.add_argument("--model", "-m", required=required, metavar="M",
                   help="model preset (tiny-gpt, gpt2-small, ..., llama2-7b) or workload YAML file")
    p.add_argument("--global-batch", type=int, metavar="N",
                   help=f"override the workload's global batch (samples per iteration, 1 to {MAX_GLOBAL_BATCH})")


def add_json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout and nothing else there")


def add_calibration_arg(p: argparse.ArgumentParser, what: str,
                        default: str = "the built-in constants, which describe GPUs whose executor overlaps "
                                       "sync with the backward pass") -> None:
    p.add_argument("--calibration", metavar="PROFILE",
                   help=f"cost-model constants (YAML/JSON) {what}: a profile of the executor that will run the plan, "
                        f"or the name of a shipped one: emulated-cpu, spantrain's runtime on the local emulated "
                        f"cluster (default: {default})")


def load_calibration(path: str | None):
    """`--calibration`'s constants (a bad file named by the flag), or None for the built-in ones."""
    from spantrain.env.calibration import SHIPPED_PROFILES, Calibration
    from spantrain.errors import SpecError

    if path is None:
        return None
    if not path.strip():  # Path("") is the current directory: "is a directory" named nothing the user gave
        raise SpecError(f"--calibration is empty: pass a profile file or a shipped profile's name "
                        f"({', '.join(SHIPPED_PROFILES)})")
    if not Path(path).exists() and path not in SHIPPED_PROFILES:
        raise SpecError(f"--calibration {path}: no such file, nor a shipped profile ({', '.join(SHIPPED_PROFILES)})")
    try:
        return Calibration.from_file(path)
    except SpecError as e:
        raise SpecError(f"--calibration {e}") from None


def note_cpu_devices(cluster, calibration: str | None) -> None:
    """A note when a cluster of CPUs (`spantrain profile` labels their `gpu` "cpu") is planned with
    the built-in constants, which describe GPU executors: the plan is picked for another machine
    (a profiled two-region spec got zb-h2 1x32, predicted 0.26 s and measured 0.47 s, where
    `run --emulate` picks gpipe 4x8 with the shipped CPU profile)."""
    if calibration is None and len(cluster) and all(d.gpu == "cpu" for d in cluster.devices):
        from spantrain._say import note

        note("the cluster's devices are CPUs and the built-in constants describe GPUs: pass --calibration "
             "emulated-cpu (fitted to spantrain's runtime on CPUs), or a profile of your own")


def load_cluster(path: str):
    from spantrain.cluster import Cluster

    return Cluster.from_file(path)


def load_model(args: argparse.Namespace):
    from spantrain.errors import WorkloadError
    from spantrain.workload import MAX_GLOBAL_BATCH, load_workload

    gb = getattr(args, "global_batch", None)
    if gb is not None and not 0 < gb <= MAX_GLOBAL_BATCH:
        raise WorkloadError(f"--global-batch must be a positive integer up to {MAX_GLOBAL_BATCH} samples, got {gb}")
    return load_workload(args.model, global_batch=gb)


def load_plan(path: str, cluster, workload, global_batch: int | None = None):
    """A plan file checked against the cluster and model; a mismatch names the file (a user
    with several plans must tell which one was made for another cluster or model). An explicit
    `global_batch` (--global-batch) must be the plan's: the plan fixes the batch it trains."""
    from spantrain.errors import PlanError
    from spantrain.plan import Plan

    plan = Plan.from_file(path)  # its own errors name the file already
    other = plan.made_for_other(workload)
    try:
        plan = plan.validate(cluster, workload)
    except PlanError as e:
        if wrong := plan.other_models_layers(workload):
            raise PlanError(f"plan {path} {wrong}: pass {plan.model_to_pass()}, or make a plan for {workload.name} "
                            "(spantrain plan -o)") from None
        if any(d not in cluster for d in plan.devices):  # "unknown device 'cloud-0'" said nothing of what to do
            raise PlanError(f"plan {path}: {e} (made for another cluster, or devices left this one: make a plan "
                            f"for this one with spantrain plan -o, or move this plan onto it with spantrain plan "
                            f"--from {path} -o NEW)") from None
        raise PlanError(f"plan {path}: {e}") from None
    if other is not None:
        from spantrain._say import note

        note(f"plan {path} was made for model {other}, and is used for {workload.name} here: its layer split and "
             f"memory fit were worked out for {other}'s layers")
    if global_batch is not None and plan.batch != global_batch:
        raise PlanError(f"--global-batch {global_batch} but plan {path} trains {plan.batch} samples per iteration "
                        f"(pass --global-batch {plan.batch}, or leave it out)")
    return plan


def check_finite(flag: str, value: float | None, rule: str, ok: bool) -> None:
    """A number option whose value must be finite and pass `ok` (the check `rule` states, e.g.
    "> 0"): refused in one line (`SpantrainError`), "FLAG must be a finite number RULE, got
    VALUE". argparse's float() takes 'nan' and 'inf', and nan passes over every comparison.
    None (the option left out) passes."""
    import math

    from spantrain.errors import SpantrainError

    if value is not None and not (math.isfinite(value) and ok):
        raise SpantrainError(f"{flag} must be a finite number {rule}, got {value:g}")


def check_seed(seed: int, flag: str = "--seed") -> None:
    """A seed option: an integer from 0 to MAX_SEED (what numpy and torch both take), refused in
    one line (`SpantrainError`)."""
    from spantrain.errors import SpantrainError
    from spantrain.policies.train_config import MAX_SEED

    if not 0 <= seed <= MAX_SEED:
        raise SpantrainError(f"{flag} must be an integer from 0 to {MAX_SEED}, got {seed}")


def check_dir_option(flag: str, path: str | Path | None, *, create: bool = False,
                     creatable: bool = False, full: bool = False) -> None:
    """An output directory option: refused in one line (`SpantrainError`) when a file is in
    its place; with `creatable`, when it could not be made or written (a file above it, no
    permission), checked on the nearest directory that exists and creating nothing, so inputs
    that turn out bad leave no empty directory behind; with `full` (and not `creatable`), when
    only its disk is full; with `create`, when making it fails. Checked before any work, not
    by a worker mid-run."""
    from spantrain._spec import DISK_FULL, cannot_create
    from spantrain.errors import SpantrainError

    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise SpantrainError(f"{flag} {p} is a file, not a directory: pass a directory")
    problem = cannot_create(p) if creatable or full else None
    if problem is not None and (creatable or problem[1].startswith(DISK_FULL)):
        nearest, reason = problem
        if not nearest.is_dir():
            raise SpantrainError(f"{flag} {p}: Not a directory ({str(nearest)!r} is a file)")
        fix = ("free some space, or pass a directory on another disk" if reason.startswith(DISK_FULL)
               else "pass a directory this user can write")
        raise SpantrainError(f"{flag} {p}: cannot write in {str(nearest)!r} ({reason}); {fix}")
    if create:
        try:
            p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            # "--out /proc/x: No such file or directory" said neither what failed nor what to do
            raise SpantrainError(f"{flag} {p}: cannot create it ({e.strerror}); pass a directory this user "
                                 "can write") from None


def file_read_by(path: str | Path, reads: dict[str, str | None]) -> str | None:
    """The option of `reads` (option -> path) that reads the existing file `path`, if one does."""
    p = Path(path)
    for option, read in reads.items():
        if read and p.is_file() and Path(read).is_file() and p.samefile(read):
            return option
    return None


def check_output_file(path: str, option: str, fix: str = "give a file name", *,
                      reads: dict[str, str | None] | None = None) -> None:
    """An output file option, refused in one line (`SpantrainError`) before any work when it
    cannot be written as given: a directory, a parent directory that does not exist (it is not
    created) or is not one, or one this user cannot create a file in (read-only, /proc), or a
    file the command reads (`reads`: option -> path; ``plan -c C.yaml -o C.yaml`` replaced the
    cluster spec with the plan). An existing device or pipe (``-o /dev/null``) passes: it is
    written into as it is. Checked after the work, a plan minutes in the making was lost to a
    late "No such file or directory"."""
    from spantrain._spec import cannot_write_in
    from spantrain.errors import SpantrainError

    p = Path(path)
    if p.is_dir():
        raise SpantrainError(f"{option} {path}: is a directory; {fix}")
    if p.exists() and not p.is_file():
        return  # a device or a pipe: written into as it is
    source = file_read_by(p, reads or {})
    if source:
        raise SpantrainError(f"{option} {path}: is the file {source} reads; write the output to another file")
    if not p.parent.is_dir():
        what = "is not a directory" if p.parent.exists() else "does not exist (create it first)"
        raise SpantrainError(f"{option} {path}: {str(p.parent)!r} {what}")
    parent = Path(os.path.realpath(p)).parent  # where the file is written: a symlink's target's directory
    reason = cannot_write_in(parent)
    if reason:
        raise SpantrainError(f"{option} {path}: cannot create a file in {str(parent)!r} ({reason}); pass a path in "
                             "a directory this user can write")


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=None, default=_default) + "\n")


class _StdoutConsole:
    """What `stdout_console` adds to rich's Console, as a mixin: rich is imported only by the
    commands that draw a table."""

    quiet: bool

    def on_broken_pipe(self) -> None:
        self.quiet = True
        # what is still buffered would fail again at exit: send it nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise BrokenPipeError


@functools.cache
def _stdout_console_type() -> type[Console]:
    from rich.console import Console

    return type("StdoutConsole", (_StdoutConsole, Console), {})


def stdout_console() -> Console:
    """A rich Console for a command's tables on stdout. Piped or redirected, rows stay whole at
    120 columns: rich would lay them out for 80 and cut figures short ("41947.…", "A100-8…").
    When the reader leaves (``| head``), the command ends as `spantrain.cli.main` ends any
    command on a closed pipe, exit code 0, where rich's own handler exits 1. Without markup: names
    come from users' files, and a model or device named 'gpt[/]x' was a MarkupError's traceback
    ('[red]gpt' lost its brackets); styles are given as `styled` text."""
    return _stdout_console_type()(file=sys.stdout, width=None if sys.stdout.isatty() else 120, markup=False)


def styled(*parts: str | tuple[str, str]) -> Any:
    """Rich text of plain strings and (text, style) pairs: styles without markup in the text."""
    from rich.text import Text

    return Text.assemble(*parts)


def _default(o: Any) -> Any:
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


