"""The `spantrain` command line: one module per command, heavy imports inside the commands.

Every `SpantrainError` becomes one line on stderr and its exit code (2: a user's mistake or
a refusal; 1: a run that failed on its own); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Sequence

from spantrain._interrupt import INTERRUPTED, QUIET_INTERRUPT_ENV, command_starts
from spantrain._say import say as _say
from spantrain._say import saying_as, stderr_reader_may_leave
from spantrain.errors import SpantrainError

__all__ = ["main", "build_parser", "COMMANDS", "OneLineParser"]

# (command, module under spantrain.cli, one-line help); order is the --help order.
COMMANDS: list[tuple[str, str, str]] = [
    ("topo", "topo", "generate or show a cluster spec"),
    ("plan", "plan", "plan a workload on a cluster"),
    ("simulate", "simulate", "predict a plan's iteration with the cost model"),
    ("compare", "compare", "every planner side by side"),
    ("train-policy", "train_policy", "train the PPO scheduling policy in the environment"),
    ("profile", "profile", "measure real devices and links into a cluster spec"),
    ("emulate", "emulate", "run a command on a local emulated cluster"),
    ("run", "run", "real training driven by a plan or planner"),
]

QUIT_ON_CTRL_C = {"topo", "plan", "simulate", "compare"}
"""Commands that start no process and keep nothing to save: run as `spantrain` (the process
entry, `spantrain.__main__`), Ctrl-C ends them at once at any moment, their imports
included, with one line and exit code 130 (`spantrain._interrupt`). The others stop and
save on KeyboardInterrupt once they run."""


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports usage errors in the project's one-line form (exit 2): `spantrain` and
    the experiment scripts."""

    def error(self, message: str) -> None:  # type: ignore[override]
        _say(f"{self.prog}: error: {message} (see {self.prog} --help)")
        self.exit(2)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        # a command's parser names its own mistakes: argparse handed them up to `spantrain`,
        # whose error pointed at `spantrain --help`, which lists no command's options
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.prog != "spantrain":
            import difflib

            options = [o for o, a in self._option_string_actions.items()
                       if o.startswith("--") and a.help is not argparse.SUPPRESS]  # not the internal ones
            near = next((m for x in extras if x.startswith("--")
                         for m in difflib.get_close_matches(x.split("=")[0], options, n=1, cutoff=0.8)), None)
            self.error(f"unrecognized arguments: {' '.join(extras)}" + (f" (did you mean {near}?)" if near else ""))
        return parsed, extras


def build_parser() -> argparse.ArgumentParser:
    from spantrain import __version__

    parser = OneLineParser(prog="spantrain", description="Plan and run training across heterogeneous, "
                     "geo-distributed devices.")
    parser.add_argument("--version", action="version", version=f"spantrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    for name, module, help_text in COMMANDS:
        mod = importlib.import_module(f"spantrain.cli.{module}")
        p = sub.add_parser(name, help=help_text, description=help_text)
        mod.register(p)
        _refuse_empty_paths(p)
    return parser


def _refuse_empty_paths(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:  # groups' options too
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _refuse_empty_paths(sub)
        elif action.metavar in _PATH_METAVARS and action.type is None and action.nargs in (None, "?"):
            action.type = _DIR_PATH if action.metavar == "DIR" else _FILE_PATH


_PATH_METAVARS = {"FILE", "DIR", "PATH", "PNG"}


_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}
"""Write errors without a file name that mean the output could not be stored: stdout's."""


def _path_of(kind: str):
    """A path option's type: `-o ""` (an unset shell variable) wrote nothing and said nothing."""

    def path(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"an empty path: give a {kind} name")
        return text

    path.__name__ = f"{kind} path"  # argparse names the type in its own messages
    return path


_FILE_PATH, _DIR_PATH = _path_of("file"), _path_of("directory")


def main(argv: Sequence[str] | None = None) -> int:
    with stderr_reader_may_leave():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    if sys.stdout is None:  # `spantrain ... >&-`: every result would fail to print, after the work
        _say("spantrain: error: stdout is closed; redirect it to a file or to /dev/null instead")
        return 2
    try:
        parser = build_parser()  # imports every command's module
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # before a command runs: nothing to report but that
        if not os.environ.get(QUIET_INTERRUPT_ENV):
            print("spantrain: interrupted", file=sys.stderr)
        return INTERRUPTED
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    # a child whose parent reports Ctrl-C keeps nothing either: `profile`'s devices, where a KeyboardInterrupt
    # raised inside torch's C++ callbacks aborted ("terminate called after throwing ...") on the parent's output
    command_starts(args.command,
                   handles_ctrl_c=args.command not in QUIT_ON_CTRL_C and not os.environ.get(QUIET_INTERRUPT_ENV))
    try:
        with saying_as(f"spantrain {args.command}"):
            return int(args.func(args) or 0)
    except SpantrainError as e:
        _say(f"spantrain {args.command}: error: {e}")
        return e.exit_code
    except KeyboardInterrupt as e:  # a command may say what it saved (`TrainingInterrupted`)
        if not os.environ.get(QUIET_INTERRUPT_ENV):
            _say(f"spantrain {args.command}: interrupted" + (f" {e}" if str(e) else ""))
        return 130
    except BrokenPipeError:  # stdout's reader left (`| head`): what it wanted it had
        return 0
    except MemoryError:  # a cluster and model at the limits can outgrow this machine's memory
        _say(f"spantrain {args.command}: error: ran out of memory: this cluster and model are too large to "
             f"{args.command} on this machine; use fewer devices or layers, or a machine with more memory")
        return 2
    except OSError as e:
        if e.filename is None and e.errno in _OUTPUT_ERRNOS:  # stdout into a full disk (`> /dev/full`)
            _say(f"spantrain {args.command}: error: could not write the output: {e.strerror or e}")
            return 1
        if e.filename is None:
            raise
        # a path the user gave cannot be read or written (-o into a missing directory, an
        # output directory under a file, ...): name it, no traceback
        _say(f"spantrain {args.command}: error: {e.filename}: {e.strerror or e}")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
