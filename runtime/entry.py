"""Entry point of a locally launched worker process, and the files it leaves for the launcher.

Kept free of torch imports: the launcher refers to `local_entry` when it starts a worker,
and must not pay for importing torch itself (the fork server has it preloaded, so the
worker's own import of `spantrain.runtime.worker` is instant).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_REFUSED", "EXIT_ORPHANED", "ORPHAN_GRACE_S", "error_file", "log_file",
           "launcher_gone", "watch_launcher", "local_entry", "exit_worker", "read_config"]

EXIT_OK, EXIT_ERROR, EXIT_REFUSED, EXIT_ORPHANED = 0, 1, 2, 3
"""Worker exit codes: done; unexpected error; refusal (a `SpantrainError`); the launcher went away
(and the worker could not stop with the others within `ORPHAN_GRACE_S`)."""


def error_file(run_dir: str | Path, rank: int) -> Path:
    """Where a failing rank writes its one-line error."""
    return Path(run_dir) / "errors" / f"rank{rank}.txt"


def log_file(run_dir: str | Path, rank: int) -> Path:
    """A local worker's stdout and stderr (tracebacks, torch warnings)."""
    return Path(run_dir) / "logs" / f"rank{rank}.log"


def launcher_gone(pid: int) -> bool:
    """Whether process `pid` has ended, including one that exited but was not yet reaped."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    # A zombie still answers kill(pid, 0). Its parent may be a script reading the launcher's output
    # until it ends (subprocess.run(capture_output=True)), which it never does while we, holding that
    # output, wait for the zombie to go: a deadlock until the process-group timeout.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] == "Z"
    except (OSError, IndexError):  # no /proc (not Linux), or it just went: the next look tells
        return False


ORPHAN_GRACE_S = 60.0
"""How long the workers of a launcher that went away (killed with SIGKILL, say) get to finish
their iteration together and checkpoint before they exit regardless."""


def watch_launcher(pid: int, grace_s: float = ORPHAN_GRACE_S) -> None:
    """Stop when the launcher is gone, so no worker outlives the run that started it (run it in a
    daemon thread; emulated workers share the launcher's pid space, so this works there too).
    Stopping is what the launcher's own SIGTERM asks: finish the iteration with the other ranks
    (each sees the launcher gone within a second), checkpoint if configured, exit; a worker
    still running `grace_s` later (a peer died, a collective waits) exits at once."""
    while not launcher_gone(pid):
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(EXIT_ORPHANED)


def use_temp_dir(path: str | None) -> None:
    """Make `path` this process's temporary directory (`RunConfig.temp_dir`), before anything
    (W&B's import) makes one."""
    if path:
        import tempfile

        os.environ["TMPDIR"] = path
        tempfile.tempdir = None  # tempfile reads TMPDIR again


def read_config(config_path: str, who: str):
    """The run's `RunConfig` from `config_path`, for a worker; one that cannot be read (missing,
    malformed: a worker started by hand) ends the process with its one-line error on stderr,
    ``WHO: error: ...``, and `EXIT_REFUSED` (was a traceback). No error file: it lives in the
    run directory, which the config names."""
    from spantrain.errors import SpantrainError
    from spantrain.runtime.config import RunConfig

    try:
        return RunConfig.from_file(config_path)
    except SpantrainError as e:
        print(f"{who}: error: {e}", file=sys.stderr, flush=True)
        os._exit(EXIT_REFUSED)


def local_entry(config_path: str, rank: int, world_size: int, store_path: str) -> None:
    """Run rank `rank` of the run described by `config_path`; never returns."""
    cfg = read_config(config_path, f"rank {rank}")
    if cfg.launcher_pid and launcher_gone(cfg.launcher_pid):
        # forked for a launcher that Ctrl-C ended while the fork server was still importing torch
        # (its request was already sent): nothing of it may appear in the run directory
        os._exit(EXIT_ORPHANED)
    use_temp_dir(cfg.temp_dir)
    log = log_file(cfg.run_dir, rank)
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    # Ctrl-C and a closed terminal's SIGHUP reach every process of the terminal; the launcher
    # decides, workers stop on its SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if cfg.launcher_pid:
        threading.Thread(target=watch_launcher, args=(cfg.launcher_pid,), daemon=True).start()

    from spantrain.runtime.worker import StopFlag, guarded

    # Before training starts (rendezvous, set-up) a stop ends the worker at once: there is no
    # iteration to finish, and one waiting at the rendezvous for peers that were never started
    # (Ctrl-C while the launcher started them) held the launcher for its whole 120 s grace.
    stop = StopFlag(armed=False)
    signal.signal(signal.SIGTERM, stop)
    try:
        with stop.exit_when_blocked():
            # The fork server runs with these blocked (`spantrain.runtime.launcher`); one sent since the fork
            # arrives now.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
            code, _ = guarded(cfg, rank=rank, world_size=world_size, init_method=f"file://{store_path}",
                              local=True, stop=stop)
    except KeyboardInterrupt:  # stopped before training started: nothing to finish or save
        code = 128 + signal.SIGTERM
    exit_worker(code)


def exit_worker(code: int) -> None:
    """End a worker process now, skipping interpreter teardown (it can hang on gloo threads):
    its output flushed, and what exit handlers would have removed removed (rank 0's W&B)."""
    sys.stdout.flush()
    sys.stderr.flush()
    from spantrain.tracking import remove_import_temp_dirs

    remove_import_temp_dirs()
    os._exit(code)
