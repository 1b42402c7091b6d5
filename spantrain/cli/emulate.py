"""`spantrain emulate --cluster C [options] -- COMMAND ...`: run COMMAND once per device of C
on a local emulated cluster (namespaces, htb shaping, CPU quotas; see
`spantrain.runtime.emulator`). Exit code: 0 when every device succeeded, else the code of
the first device that failed (128 + signal when it was killed), 124 when --timeout stopped
them (as `timeout` does), 2 for bad input."""

from __future__ import annotations

import argparse
import shutil
import sys

from spantrain.cli._common import add_cluster_arg, check_dir_option, check_finite
from spantrain.errors import EmulationError

__all__ = ["TIMED_OUT", "register", "run"]

TIMED_OUT = 124
"""Exit code when --timeout stopped the devices, as `timeout` uses."""


def register(p: argparse.ArgumentParser) -> None:
    add_cluster_arg(p, required=False)
    p.add_argument("--cpus", type=float, metavar="N",
                   help="cores shared by all devices in proportion to their TFLOP/s (default: all cores)")
    p.add_argument("--mode", choices=("auto", "netns", "local"), default="auto",
                   help="netns: namespaces + kernel shaping or fail; local: plain processes, the transport "
                        "emulates the network; auto (default): netns when possible, else local")
    p.add_argument("--bandwidth-scale", default="1", metavar="S",
                   help="emulated goodput = min(spec x S, --max-gbps); 'fit' scales the fastest link to the cap "
                        "(default 1)")
    p.add_argument("--max-gbps", type=float, default=1.0, metavar="G",
                   help="cap on emulated bandwidth, Gbit/s (default 1: what veth carries on a few shared cores)")
    p.add_argument("--no-cpu-limits", action="store_true", help="do not put devices under CPU quotas")
    p.add_argument("--log-dir", metavar="DIR",
                   help="also write each device's output to DIR/<device>.log (a / in an id written %%2F)")
    p.add_argument("--quiet", action="store_true", help="do not relay the devices' output (use with --log-dir)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop every device after S seconds (exit code 124)")
    p.add_argument("--cleanup", action="store_true",
                   help="only remove what crashed emulator runs left behind, then exit")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the command to run on every device (after --)")
    p.set_defaults(func=run)


def _scale(text: str) -> float | str:
    if text == "fit":
        return text
    try:
        value = float(text)
    except ValueError:
        raise EmulationError(f"--bandwidth-scale must be a positive number or 'fit', got {text!r}") from None
    check_finite("--bandwidth-scale", value, "> 0", value > 0)
    return value


def run(args: argparse.Namespace) -> int:
    from spantrain.runtime.emulator import EmulatedCluster, first_failure
    from spantrain.runtime.emulator.launch import TimedOut, describe_exit
    from spantrain.runtime.emulator.state import sweep_leftovers

    if args.cleanup:
        if args.cluster or args.cmd:  # it ran nothing and exited 0, as if the command had run
            raise EmulationError("--cleanup only removes what crashed runs left behind: give it alone, then run "
                                 "spantrain emulate -c C.yaml -- COMMAND")
        from spantrain.runtime.emulator.netns import PROBE_PREFIX

        cleaned = sweep_leftovers()
        # a killed availability probe's namespace is no run
        probes = [c for c in cleaned if c.startswith(PROBE_PREFIX)]
        runs = [c for c in cleaned if c not in probes]
        print(f"spantrain emulate: removed {len(runs)} leftover run(s)" + (f": {', '.join(runs)}" if runs else "")
              + (f", and {len(probes)} namespace(s) of killed availability probes: {', '.join(probes)}"
                 if probes else ""), file=sys.stderr)
        return 0
    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not args.cluster:
        raise EmulationError("--cluster is required (the spec to emulate)")
    if not command:
        raise EmulationError("no command: give it after --, e.g. spantrain emulate -c C.yaml -- python train.py")
    if shutil.which(command[0]) is None:
        raise EmulationError(f"command not found: {command[0]}")
    # argparse's float() takes 'nan' and 'inf': neither is a core count, a rate or a time (nan slipped
    # past `<= 0` checks, inf overflowed the shaper's integer arithmetic)
    for flag, value in (("--cpus", args.cpus), ("--max-gbps", args.max_gbps), ("--timeout", args.timeout)):
        check_finite(flag, value, "> 0", value is not None and value > 0)
    # checked now: a --log-dir under a file failed only after the namespaces were up, below their lines;
    # made by emu.run, once the cluster has loaded (a bad spec leaves no empty directory behind)
    check_dir_option("--log-dir", args.log_dir, creatable=True)
    from spantrain.runtime import stop_signals

    # this command's own handlers: a SIGTERM held through the teardown is delivered to them once the
    # emulator's are gone, and ended the process by the signal there (exit 143, no line)
    signals = stop_signals.install()
    try:
        with EmulatedCluster(args.cluster, cpus=args.cpus, mode=args.mode,
                             bandwidth_scale=_scale(args.bandwidth_scale), max_gbps=args.max_gbps,
                             cpu_limits=not args.no_cpu_limits) as emu:
            if not args.quiet:
                for line in emu.describe():
                    print(line, file=sys.stderr)
            results = emu.run(command, timeout_s=args.timeout, echo=not args.quiet, log_dir=args.log_dir)
    except TimedOut as e:
        # not exit code 2: a script must tell a command that outlived --timeout from a mistyped option
        print(f"spantrain emulate: {e}", file=sys.stderr)
        return TIMED_OUT
    finally:
        stop_signals.restore(signals)
    failed = first_failure(results)
    if failed is None:
        return 0
    code = failed.returncode if failed.returncode > 0 else 128 - failed.returncode
    print(f"spantrain emulate: device {failed.device_id} (rank {failed.rank}) {describe_exit(failed.returncode)}; "
          f"{_the_others(results, failed)}", file=sys.stderr)
    return code


def _the_others(results, failed) -> str:
    """What became of the other devices, said only of those it is true of: all of them may have
    ended on their own (the same error everywhere) before the first failure was seen."""
    others = [r for r in results if r is not failed]
    stopped = sum(r.stopped for r in others)  # the failed device may be marked stopped too (an interrupt)
    if not others:
        return "it was the only device"
    if stopped == 0:
        return "the other devices ended on their own"
    if stopped == len(others):
        return "the other devices were stopped"
    return f"{stopped} of the other {len(others)} {'was' if stopped == 1 else 'were'} stopped"
