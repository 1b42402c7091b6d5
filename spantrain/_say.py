"""One line on stderr for the user, once per host under torchrun."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["say", "note", "warn", "saying_as", "stderr_reader_may_leave"]


def say(line: str) -> None:
    """One line on stderr in one write: torchrun's processes share the terminal, and print's
    separate newline let their lines run into each other. Ranks other than 0 say which they are;
    a line another process of the same torchrun attempt on this host already said is not
    repeated (every rank of a job validates the same spec and plan)."""
    rank = os.environ.get("RANK")
    prefix = f"[rank {rank}] " if rank not in (None, "0") and "WORLD_SIZE" in os.environ else ""
    line = line.replace("\r", "\\r").replace("\n", "\\n")  # a path or id may hold one: the line stays one
    if not _first_to_say(line):
        return
    sys.stderr.write(f"{prefix}{line}\n")
    sys.stderr.flush()


_speaker = "spantrain"
"""Who `note` and `warn` say they are: ``spantrain CMD`` while `spantrain.cli.main` runs a
command, a script's name while `run_script` runs it (code shared by several commands, a
planner or the tracker, cannot tell which one it serves)."""


def note(text: str) -> None:
    """``spantrain CMD: note: text``: something the user should know; the command goes on."""
    say(f"{_speaker}: note: {text}")


def warn(text: str) -> None:
    """``spantrain CMD: warning: text``: something went wrong; the command goes on without it."""
    say(f"{_speaker}: warning: {text}")


@contextlib.contextmanager
def saying_as(speaker: str) -> Iterator[None]:
    """Within, `note` and `warn` name `speaker` (``spantrain plan``); the one before after."""
    global _speaker
    before, _speaker = _speaker, speaker
    try:
        yield
    finally:
        _speaker = before


def _first_to_say(line: str) -> bool:
    """Whether no other process of this torchrun attempt on this host has said `line`: a
    marker file, created exclusively, in the attempt's directory that torchrun shares among
    its local processes (`<log_dir>/<run_id>/attempt_<n>/<local_rank>/error.json`)."""
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file or _to_own_log(Path(error_file).parent):  # `torchrun --redirects/--tee`: its own log
        return True
    digest = hashlib.sha1(line.encode()).hexdigest()[:16]
    marker = Path(error_file).parent.parent / f"spantrain-said-{digest}"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    except OSError:  # no shared directory to coordinate in: say it
        pass
    return True


def _to_own_log(rank_dir: Path) -> bool:
    """Whether stderr is this rank's own log file, which torchrun's ``--redirects``/``--tee`` put in
    the rank's directory beside its error file, not a terminal or file the ranks share."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{sys.stderr.fileno()}")).parent == rank_dir
    except (OSError, ValueError, AttributeError):  # no real descriptor (a test's capture), no /proc
        return False


class _QuietOnceClosed:
    """`sys.stderr` that goes quiet when its reader leaves (`2>&1 | less` quit, a `tee` that
    died): a write then would raise BrokenPipeError out of a progress bar and end a long
    command, unsaved, as if it had succeeded. From then on stderr goes to /dev/null."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        # what is still buffered would fail again on the next flush and at exit: send it nowhere
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def stderr_reader_may_leave() -> Iterator[None]:
    """Within: stderr's reader may leave without ending the command (`_QuietOnceClosed`)."""
    before = sys.stderr
    if before is None or isinstance(before, _QuietOnceClosed):
        yield
        return
    sys.stderr = _QuietOnceClosed(before)
    try:
        yield
    finally:
        if isinstance(sys.stderr, _QuietOnceClosed):  # unless the command replaced it itself
            sys.stderr = before
