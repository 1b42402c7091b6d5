"""`spantrain profile`: measure devices and links into a cluster spec.

Three ways to run it:

- under torchrun or ``spantrain emulate`` (``RANK``/``WORLD_SIZE`` set): one process per
  device; every rank measures, rank 0 writes the spec (``-o``) and prints (``--json``);
- ``--cluster C`` without those variables: brings C up on the local emulated cluster and
  runs itself there once per device, then reports the measured figures against the
  emulated ones on stderr;
- neither: profiles this machine as a single device (compute and memory only).

Progress goes to stderr; stdout holds only the ``--json`` object, or the spec as YAML when
neither ``-o`` nor ``--json`` is given. Exit code: 0, 2 for bad input or a failed device,
124 (as `timeout` uses) when ``--cluster``'s devices were still running at 4 x --budget-s
(at least `MIN_WAIT_S`) and were stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from spantrain._interrupt import QUIET_INTERRUPT_ENV
from spantrain._spec import plural
from spantrain.cli._common import check_finite, check_output_file, print_json
from spantrain.errors import ExecutionError, RunFailed, WorkloadError

__all__ = ["MAX_BUDGET_S", "MIN_WAIT_S", "register", "run"]

MAX_BUDGET_S = 86400.0
"""A day: longer is a typo, and beyond ~2e13 s the rendezvous timeout (4 x budget) overflows."""
MIN_WAIT_S = 120.0
"""With --cluster, the least time the devices get before they are stopped (4 x --budget-s if more):
their start-up is not all inside the budget on a loaded machine."""
_RESULT_ARG = "--result-file"
_DEADLINE_ARG = "--deadline"


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default="tiny-gpt", metavar="M",
                   help="model whose layers are timed: preset or workload YAML with an architecture "
                        "(default tiny-gpt)")
    p.add_argument("--micro-batch", type=int, metavar="N",
                   help="samples per timed micro-batch (default: the workload's global batch / 8)")
    p.add_argument("--budget-s", type=float, default=60.0, metavar="S",
                   help="wall-time budget from launch, start-up included (default 60)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the measured cluster spec here: JSON if FILE ends in .json, else YAML")
    p.add_argument("--name", default="profiled", help="name of the written spec (default 'profiled')")
    p.add_argument("--json", action="store_true",
                   help='print {"devices": [...], "pairs": [...], "groups": [...]} on stdout and nothing else')
    p.add_argument("--cluster", "-c", metavar="FILE",
                   help="not under torchrun/emulate: profile this spec on the local emulated cluster")
    p.add_argument("--cpus", type=float, metavar="N", help="with --cluster: cores the emulated devices share")
    p.add_argument(_RESULT_ARG, help=argparse.SUPPRESS)
    p.add_argument(_DEADLINE_ARG, type=float, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _check(args: argparse.Namespace) -> None:
    # `not 0 < x <= max` also refuses nan, which every comparison passes over (and inf, a profile
    # that never ends: its compute phase is a share of the budget)
    if not 0 < args.budget_s <= MAX_BUDGET_S:
        raise WorkloadError(f"--budget-s must be a number of seconds in (0, {MAX_BUDGET_S:g}], got {args.budget_s:g}")
    if args.micro_batch is not None and args.micro_batch <= 0:
        raise WorkloadError(f"--micro-batch must be a positive integer, got {args.micro_batch}")
    if args.cpus is not None and not args.cluster:
        raise WorkloadError("--cpus only applies with --cluster")
    check_finite("--cpus", args.cpus, "> 0", args.cpus is not None and args.cpus > 0)
    if args.output:  # written after the whole profile (a minute by default): refused before any of it
        check_output_file(args.output, "-o")


def run(args: argparse.Namespace) -> int:
    from spantrain.workload import load_workload

    _check(args)
    workload = load_workload(args.model)
    if workload.arch is None:
        raise WorkloadError(f"model {workload.name!r} has no architecture: the profiler times the runtime's "
                            "layers, so give a preset or a workload file with an 'architecture:' section")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return _profile_here(args, workload, distributed=True)
    if args.cluster:
        from spantrain.profiler.compute import check_layers_fit, cpu_free_bytes

        # the emulated devices are this machine's CPU: a model they cannot hold is refused before the
        # emulator starts (each device, then this command, said so after its banner)
        check_layers_fit(workload, cpu_free_bytes())
        return _profile_emulated(args)
    return _profile_here(args, workload, distributed=False)


def _profile_here(args: argparse.Namespace, workload, *, distributed: bool) -> int:
    # As `run`'s workers and the emulator's devices compute (the profile describes them), and before
    # torch loads OpenMP, which reads it once: a spinning thread pool measured a CPU that other
    # work kept busy 17-38x slow, and overran the budget
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import yaml

    from spantrain.profiler.runner import profile_rank

    profile = profile_rank(workload, budget_s=args.budget_s, micro_batch=args.micro_batch, name=args.name,
                           log=_log, distributed=distributed, deadline=args.deadline)
    if profile is None:
        return 0
    if args.output:
        profile.cluster.save(args.output)
        _log(f"profile: wrote {args.output} ({plural(len(profile.cluster), 'device')}, "
             f"{plural(len(profile.cluster.regions), 'network group')})")
    if args.result_file:
        Path(args.result_file).write_text(json.dumps({"document": profile.document,
                                                      "spec": profile.cluster.to_spec()}))
    elif args.json:
        print_json(profile.document)
    elif not args.output:
        sys.stdout.write(yaml.safe_dump(profile.cluster.to_spec(), sort_keys=False, default_flow_style=None,
                                        width=100))
    return 0


def _child_argv(args: argparse.Namespace, result: Path, output: str | None, deadline: float) -> list[str]:
    argv = [sys.executable, "-m", "spantrain", "profile", "--model", args.model, "--budget-s", str(args.budget_s),
            "--name", args.name, _RESULT_ARG, str(result), _DEADLINE_ARG, repr(deadline)]
    if args.micro_batch:
        argv += ["--micro-batch", str(args.micro_batch)]
    if output:
        argv += ["-o", output]
    return argv


def _profile_emulated(args: argparse.Namespace) -> int:
    import yaml

    from spantrain.cli.emulate import TIMED_OUT
    from spantrain.profiler.accuracy import accuracy_lines
    from spantrain.profiler.runner import process_start
    from spantrain.runtime.emulator import EmulatedCluster, first_failure
    from spantrain.runtime.emulator.launch import TimedOut, describe_exit
    from spantrain.runtime.emulator.options import PROFILE_OPTIONS

    # The budget covers everything from this command's start: set-up, start-up, teardown.
    deadline = process_start() + args.budget_s
    output = str(Path(args.output).resolve()) if args.output else None
    wait_s = max(MIN_WAIT_S, 4 * args.budget_s)
    with tempfile.TemporaryDirectory(prefix="spantrain-profile-") as tmp:
        result = Path(tmp) / "result.json"
        # The devices write into `tmp`: it must be reachable from inside the namespaces (same filesystem).
        os.chmod(tmp, 0o755)
        try:
            with EmulatedCluster(args.cluster, cpus=args.cpus, options=PROFILE_OPTIONS) as emu:
                for line in emu.describe():
                    _log(line)
                # one "interrupted" line on Ctrl-C, this one's, not one more per device
                results = emu.run(_child_argv(args, result, output, deadline), timeout_s=wait_s,
                                  env={QUIET_INTERRUPT_ENV: "1"})
                emulation = emu.emulation
        except TimedOut:
            # not exit code 2, the code of a mistyped option: the profile itself hung
            print(f"spantrain profile: error: the profile outlived 4 x --budget-s (at least {MIN_WAIT_S:g} s): "
                  f"stopped every device after {wait_s:g} s", file=sys.stderr)
            return TIMED_OUT
        failed = first_failure(results)
        if failed is not None:
            # its last line says why (the devices' output is not relayed); a device that refused its
            # input exits 2, like this command; one that died or hung makes the profile fail (1)
            last = (failed.stderr.strip().splitlines() or [""])[-1].strip()[:200]
            # a killed one wrote no reason: its last line is what it was doing
            why = "" if not last else f": {last}" if failed.returncode > 0 else f" (its last line: {last})"
            error = ExecutionError if failed.returncode == 2 else RunFailed
            raise error(f"device {failed.device_id} (rank {failed.rank}) {describe_exit(failed.returncode)}{why}")
        if not result.exists():
            raise ExecutionError("rank 0 finished without writing its result")
        data = json.loads(result.read_text())
    for line in accuracy_lines(data["document"], emulation):
        _log(line)
    if args.json:
        print_json(data["document"])
    elif not args.output:
        sys.stdout.write(yaml.safe_dump(data["spec"], sort_keys=False, default_flow_style=None, width=100))
    return 0
