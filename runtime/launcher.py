"""Local runs: start one worker process per plan device and supervise them.

Workers are forked from a fork server that has imported torch once (importing torch and
its pipelining package costs seconds of CPU per process; forking is instant), and meet
through a file rendezvous in the run directory (no port to pick, so no port clashes).

The supervisor watches every worker's exit:

- all exit 0: the run is done; rank 0's ``result.json`` is the result;
- one exits otherwise (crash, kill, error): the others are terminated at once (SIGTERM,
  SIGKILL after a grace period) and the run fails with one line naming the worker, how it
  ended, its own error message, the last completed iteration and the last checkpoint;
- no iteration completes within the process-group timeout plus a margin: same, "stalled";
- Ctrl-C: workers get SIGTERM, finish the current iteration together, checkpoint and exit;
  a second Ctrl-C (or the grace period running out) kills them. SIGTERM or SIGHUP to the
  launcher (`kill`, `timeout`, a scheduler stopping the job, a closed terminal) is a Ctrl-C
  (`spantrain.runtime.stop_signals`), unless the signal was ignored when the run started (``nohup``).

So a run never hangs on a dead worker, and never leaves processes behind. With an
`Adapter` (``spantrain run --adapt``) the supervisor also checks the cluster file while the
workers train; for a plan switch they get SIGTERM as on Ctrl-C, with the same grace.

`launch_emulated` runs the same workers on the local emulated cluster instead
(`spantrain.runtime.emulator`): one namespace, shaper and CPU quota per *plan* device
(the emulator brings up only the plan's devices, rank k = the k-th device in rank order),
each worker a fresh ``python -m spantrain.runtime.emulated_worker`` started inside them.
Its supervision is the emulator's (the first worker that fails stops the others) plus
the same stall watch and the same one-line failure report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import importlib.machinery
import json
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait as wait_sentinels
from pathlib import Path
from typing import Any

from spantrain._interrupt import SignalsHeld
from spantrain._spec import write_text_atomic
from spantrain.errors import ExecutionError, RunFailed
from spantrain.runtime import stop_signals
from spantrain.runtime.adapter import Adapter, ClusterFile, StopTimedOut
from spantrain.runtime.checkpoint import latest_checkpoint, remove_partial_saves
from spantrain.runtime.config import RunConfig
from spantrain.runtime.emulator.launch import describe_exit
from spantrain.runtime.entry import EXIT_REFUSED, error_file, local_entry
from spantrain.runtime.linkprobe import links_message
from spantrain.runtime.metrics import drift_message

__all__ = ["launch_local", "launch_emulated", "check_emulated", "workers_file", "run_dir_lock", "RUN_LOCK",
           "JOB_ID_FILE"]

_POLL_S = 0.2
_KILL_GRACE_S = 3.0
_STOP_GRACE_S = 120.0
_STOPPING_NOTE = ("spantrain run: stopping after the current iteration (checkpointing if configured); "
                  "Ctrl-C again to kill")
_STALL_MARGIN_S = 60.0
# Errors a worker reports when a *peer* died: the root cause is elsewhere.
_SECONDARY = ("Connection closed", "Connection reset", "connection reset", "Broken pipe", "timed out",
              "Timed out", "closed by peer", "ECONNRESET", "EPIPE")


def workers_file(run_dir: str | Path) -> Path:
    """JSON with the launcher's and every worker's pid (for tools and tests)."""
    return Path(run_dir) / "workers.json"


JOB_ID_FILE = "job-id"
"""In the run directory: the id of the job that runs there (`RunConfig.job_id`), which its
checkpoints also hold: a ``--resume`` without ``--run-dir`` continues where they match."""

RUN_LOCK = ".spantrain-run.lock"
"""File in the run directory (and the checkpoint directory) that the process owning a run
holds an exclusive `flock` on; hidden, as it is no checkpoint."""


@contextlib.contextmanager
def run_dir_lock(run_dir: str | Path, flag: str = "--run-dir") -> Iterator[None]:
    """Own `run_dir` for the duration of a run (created if missing), or `ExecutionError` at once
    when another run holds it: two runs in one directory would share the workers' rendezvous
    file, the metrics, the result and the logs (or, for a checkpoint directory, `flag`
    ``--checkpoint-dir``, write their checkpoints over each other's).

    The lock is the kernel's (`fcntl.flock` on `RUN_LOCK`), tied to the open file: it goes with
    the process however that ends (an error, Ctrl-C, SIGKILL), so a stale file never blocks a
    later run. The file stays (removing it would let a third run lock a new file while a second
    still holds the old one) and says which process holds it. Only the process that starts the
    workers locks: a local or emulated launcher, not torchrun's processes (one job, many of them,
    possibly on a shared file system without locks); workers do not inherit the descriptor
    (it is close-on-exec, and they are forked from the fork server, not from the launcher).
    """

    run_dir = Path(run_dir)
    path = run_dir / RUN_LOCK
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise ExecutionError(f"{flag} {run_dir} cannot be written ({e.strerror or e}): pass a directory this run "
                             "can write") from None
    try:
        try:
            _flock_exclusive(fd)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
            raise ExecutionError(f"{flag} {run_dir} is in use by another spantrain run"
                                 f"{f' (pid {holder})' if holder.isdigit() else ''}: wait for it to finish, or pass "
                                 f"another {flag}") from None
        except OSError as e:  # a file system without locks: run as before, unguarded
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _flock_exclusive(fd: int, tries: int = 5, pause_s: float = 0.02) -> None:
    """The exclusive lock, or `BlockingIOError`; a few tries, since `lock_holder`'s probe holds a
    shared lock for an instant and a run starting then must not take it for a live run."""
    import fcntl

    for k in range(tries):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if k == tries - 1:
                raise
            time.sleep(pause_s)


def lock_holder(run_dir: str | Path) -> str | None:
    """Who holds `run_dir`'s `RUN_LOCK` now: ``"pid N"``, ``"a process"``, or None when nobody does."""
    import fcntl

    try:
        fd = os.open(Path(run_dir) / RUN_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file: no run ever held the directory
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        return f"pid {holder}" if holder.isdigit() else "a process"
    except OSError:  # a file system without locks
        return None
    finally:
        os.close(fd)  # releases the shared lock, if taken
    return None


def refuse_held(run_dir: str | Path, flag: str, error: type[Exception] = ExecutionError) -> None:
    """`error` naming the live run that holds `run_dir` (`flag` names the option), if one does."""
    holder = lock_holder(run_dir)
    if holder is not None:
        raise error(f"{flag} {run_dir} is in use by another spantrain run ({holder}): wait for it to finish, or "
                    f"pass another {flag}")


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["spantrain.runtime.forkserver_exit", "spantrain.runtime.worker"])
        # the server removes the directory of its socket if this process is killed outright; it
        # inherits the variable (forkserver_exit.SOCKET_DIR_ENV: importing that module here would
        # make this process leave as the server does)
        os.environ["SPANTRAIN_FORKSERVER_DIR"] = multiprocessing.util.get_temp_dir()
        return ctx
    return multiprocessing.get_context("spawn")


@contextlib.contextmanager
def _without_main_fixup() -> Iterator[None]:
    """Start workers without multiprocessing re-running the caller's ``__main__`` in each.

    Workers need nothing from the caller's script (their target lives in this package), yet
    multiprocessing re-imports a script ``__main__`` in every child: wasted start-up, and a
    failure when the caller runs from stdin or a REPL. Naming ``__main__`` as the module to
    restore makes the child skip that step.
    """
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    missing = object()
    saved = main.__dict__.get("__spec__", missing)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        if saved is missing:
            del main.__spec__
        else:
            main.__spec__ = saved


@contextlib.contextmanager
def _stop_signals_interrupt() -> Iterator[None]:
    """While the workers run: SIGTERM and SIGHUP raise `Terminated`, handled as Ctrl-C (by default
    the launcher would die at once, and its workers after it without a checkpoint)."""
    old = stop_signals.install()
    try:
        yield
    finally:
        stop_signals.restore(old)


_WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Environment defaults for local workers (the user's own settings win). OpenMP threads that
spin while they wait made a one-worker tiny-gpt run with 2 threads on 2 cores 50x slower
(12.8 s an iteration, against 0.25 s with one thread) while another job held a core;
waiting passively it took 0.30 s. Alone it costs: 0.29-0.36 s against 0.18-0.20 s
spinning, on ops this small. ``OMP_WAIT_POLICY=ACTIVE`` opts back in on a dedicated machine."""


@contextlib.contextmanager
def _worker_env() -> Iterator[None]:
    """`_WORKER_ENV` in this process's environment while workers (and the fork server) start."""
    added = {k: v for k, v in _WORKER_ENV.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


_SHIELDED = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
"""Signals the fork server starts with blocked (the workers unblock them)."""


def _start_fork_server(ctx: multiprocessing.context.BaseContext) -> None:
    """Start the fork server, if it is not running, with `_SHIELDED` blocked.

    It shares the launcher's process group, so Ctrl-C, `timeout`'s SIGTERM and a closed
    terminal's SIGHUP reach it too. Before it has imported torch (seconds) a SIGINT would
    print its traceback under the launcher's one-line message; and a fork server that dies
    closes every worker's exit-status pipe, so the launcher would take them all for dead
    (exit code 255) while they are still checkpointing. Blocked, the signals stay pending
    there (it ignores SIGINT, and exits when the launcher and workers are gone). Here they
    are delivered once unblocked, so the launcher misses none (as multiprocessing starts its
    resource tracker).
    """
    if ctx.get_start_method() != "forkserver" or threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import forkserver, resource_tracker

    resource_tracker.ensure_running()  # first: starting it unblocks SIGINT and SIGTERM again
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SHIELDED)
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


class _Progress:
    """Follows rank 0's metrics file: last completed iteration, its loss, a progress bar."""

    def __init__(self, path: Path, total: int, start: int, show: bool,
                 note: Callable[[str], None] | None = None, adapter: Adapter | None = None, measuring: bool = False):
        self.path = path
        self.note = note
        self.cluster_file = str(adapter.cluster_file.path) if adapter is not None else None
        self.measuring = measuring
        # A resumed or re-planned run appends to the same file: only this launch's lines count.
        self.offset = path.stat().st_size if path.exists() else 0
        self.last_step: int | None = None
        self.last_change = time.monotonic()
        self.bar = None
        self.total, self.start = total, start
        if show:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc="training", unit="it", file=sys.stderr,
                            dynamic_ncols=True)

    def poll(self) -> None:
        """Read the lines written since the last call; advance the bar."""
        if not self.path.exists():
            return
        with open(self.path) as f:
            f.seek(self.offset)
            chunk = f.read()
        # Only whole lines: the writer may be half-way through one.
        end = chunk.rfind("\n") + 1
        self.offset += len(chunk[:end].encode())
        for line in chunk[:end].splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            msg = None
            if rec.get("event") == "drift" and self.note is not None:
                msg = f"spantrain run: note: {drift_message(rec, self.cluster_file, self.measuring, self.total)}"
            if rec.get("event") == "note" and self.note is not None:
                msg = f"spantrain run: note: {rec['text']}"
            if rec.get("event") == "links" and self.note is not None:
                msg = f"spantrain run: note: {links_message(rec, adapting=self.cluster_file is not None)}"
            if msg is not None:
                if self.bar is not None:
                    self.bar.write(msg, file=sys.stderr)  # above the bar, not through it
                else:
                    self.note(msg)
            if "step" in rec and "loss" in rec:
                if self.bar is not None:
                    # the figures first: update() draws, and drew the new count beside the last iteration's loss
                    self.bar.set_postfix(loss=f"{rec['loss']:.4f}", step_s=f"{rec['step_s']:.3f}", refresh=False)
                    self.bar.update(rec["step"] - (self.last_step if self.last_step is not None else self.start))
                self.last_step = rec["step"]
                self.last_change = time.monotonic()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _stop_all(procs: list, grace: float) -> None:
    """SIGTERM every live worker, then SIGKILL whatever is left after `grace` seconds."""
    procs = [p for p in procs if p.pid is not None]  # Ctrl-C may come while they are being started
    for p in procs:
        if p.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            p.kill()
    for p in procs:
        p.join(5.0)


def launch_local(cfg: RunConfig, *, progress: bool = False,
                 note: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                 adapter: Adapter | None = None) -> dict[str, Any]:
    """Run `cfg` with one local process per plan device; the result of rank 0, or `ExecutionError`.

    `adapter`: checked while the workers train; when it decides to switch plans the workers
    finish the iteration, checkpoint and exit, and the result says ``stopped_early``."""
    cfg, devices, run_dir, config_path, start_step = _prepare(cfg)
    with _until_started(cfg):
        world = len(devices)
        store = run_dir / "rendezvous"
        store.unlink(missing_ok=True)
        cfg.save(config_path)

        ctx = _context()
        procs = [ctx.Process(target=local_entry, args=(str(config_path), r, world, str(store)),
                             name=f"spantrain-rank{r}") for r in range(world)]
        watcher = _Progress(Path(cfg.metrics_path), cfg.steps, start_step, progress, note, adapter)
    try:
        with _stop_signals_interrupt():
            try:
                with _worker_env():
                    _start_fork_server(ctx)
                    with _without_main_fixup():
                        for p in procs:
                            # a start cut off mid-request forked a worker with no pid here to stop (it
                            # waited for its peers a minute); held, the stop comes once it has one
                            held = SignalsHeld()
                            with held:
                                p.start()
                            held.deliver()
                workers_file(run_dir).write_text(json.dumps(
                    {"launcher": os.getpid(), "workers": [{"rank": r, "device": d, "pid": p.pid}
                                                          for r, (d, p) in enumerate(zip(devices, procs))]}) + "\n")
                failure = _supervise(procs, watcher, cfg, adapter)
            except KeyboardInterrupt:
                note(_STOPPING_NOTE)
                try:
                    _stop_all(procs, _STOP_GRACE_S)
                except KeyboardInterrupt:
                    _stop_all(procs, 0.0)
                raise
    finally:
        for p in procs:  # whatever happened above, nothing outlives this call
            if p.pid is not None and p.exitcode is None:
                p.kill()
                p.join(5.0)
        if cfg.checkpoint_dir:  # no worker is left writing one
            remove_partial_saves(cfg.checkpoint_dir)
        shutil.rmtree(cfg.temp_dir, ignore_errors=True)
        store.unlink(missing_ok=True)  # gloo removes it when every rank closed it, not when one was slow to
        watcher.poll()
        watcher.close()

    if failure is not None:
        raise _failure_error(cfg, devices, *failure, watcher.last_step)
    return _result(run_dir)


def _result(run_dir: Path) -> dict[str, Any]:
    result_path = run_dir / "result.json"
    if not result_path.exists():
        raise ExecutionError(f"workers finished but rank 0 left no result in {result_path}")
    return json.loads(result_path.read_text())


def _failure_error(cfg: RunConfig, devices: list[str], rank: int | None, how: str,
                   done: int | None) -> ExecutionError:
    """The one-line report of a failed run: who, how, when, the last checkpoint, where the logs are."""
    run_dir = Path(cfg.run_dir)
    world = len(devices)
    latest = latest_checkpoint(cfg.checkpoint_dir) if cfg.checkpoint_dir else None
    if latest is not None and done is not None:  # iterations the metrics could not record (a full disk)
        done = max(done, int(latest.name.removeprefix("step-")))
    where = f"after iteration {done}" if done is not None else "before the first iteration finished"
    ckpt = (f"last checkpoint: {latest} (continue with --resume)" if latest is not None
            else "no checkpoint was written")
    if rank is None:
        return RunFailed(f"the run {how} {where}; stopped all {world} worker(s); {ckpt}; logs in {run_dir / 'logs'}")
    err_path = error_file(run_dir, rank)
    detail = err_path.read_text().strip() if err_path.exists() else ""
    if not detail and (full := _full_run_dir(run_dir)):  # the worker could not say why: its files are there too
        detail = full
    if detail.startswith(("cannot load checkpoint", "checkpoint file ")):  # says what to do instead of resuming it
        ckpt = "no checkpoint was written"
    # a worker that refused (its input: a damaged checkpoint, ...) exits EXIT_REFUSED; else the run failed
    error = ExecutionError if how == describe_exit(EXIT_REFUSED) else RunFailed
    return error(f"worker rank {rank} (device {devices[rank]}) {how} {where}{': ' + detail if detail else ''}; "
                 f"stopped the other {world - 1} worker(s); {ckpt}; logs in {run_dir / 'logs'}")


def _full_run_dir(run_dir: Path) -> str | None:
    """'the disk of RUN_DIR is full (12 KB free)' when it is."""
    from spantrain._spec import free_if_full

    free = free_if_full(run_dir)
    return None if free is None else f"the disk of {run_dir} is full ({free // 1024} KB free): free some space"


def _rank_devices(cfg: RunConfig) -> list[str]:
    """The device each rank runs: plan order unless a mapping file says otherwise."""
    from spantrain.plan import Plan

    plan = Plan.from_dict(cfg.plan)
    if cfg.rank_map:
        from spantrain.runtime.rankmap import ranks_from_file

        by_rank = {r: d for d, r in ranks_from_file(cfg.rank_map, plan).items()}
        return [by_rank[r] for r in range(len(by_rank))]
    return plan.devices


def _prepare(cfg: RunConfig, devices: list[str] | None = None) -> tuple[RunConfig, list[str], Path, Path, int]:
    """Devices in rank order, a clean run directory, the saved config, the step training starts from."""
    devices = devices if devices is not None else _rank_devices(cfg)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for stale in [run_dir / "result.json", *(run_dir / "errors").glob("rank*.txt")]:
        stale.unlink(missing_ok=True)
    if cfg.job_id:
        write_text_atomic(run_dir / JOB_ID_FILE, cfg.job_id + "\n")
    start_step = 0
    if cfg.resume and cfg.checkpoint_dir:
        latest = latest_checkpoint(cfg.checkpoint_dir)
        if latest is not None:
            start_step = json.loads((latest / "train_state.json").read_text())["step"]
    # last: the caller removes it (`_until_started`, then its own `finally`)
    cfg = dataclasses.replace(cfg, launcher_pid=os.getpid(), temp_dir=tempfile.mkdtemp(prefix="spantrain-workers-"))
    return cfg, devices, run_dir, run_dir / "run_config.json", start_step


@contextlib.contextmanager
def _until_started(cfg: RunConfig) -> Iterator[None]:
    """A launch's set-up between `_prepare` and the `try` whose `finally` cleans up: a Ctrl-C or an
    error there (an --adapt switch's new launch stopped as it began) left the workers' temporary
    directory in /tmp."""
    try:
        yield
    except BaseException:
        shutil.rmtree(cfg.temp_dir, ignore_errors=True)
        raise


WORKER_START_CPU_S = 3.0
"""CPU seconds a worker spends importing torch and the runtime before it trains (2.6 + 0.4 measured)."""


def _emulator(cfg: RunConfig, devices: list[str], *, cpus: float | None, mode: str, network: str | Path | None,
              note: Callable[[str], None]):
    """The emulated cluster `launch_emulated` runs `devices` on, its input checked (`ExecutionError`)."""
    from spantrain.cluster import Cluster
    from spantrain.errors import EmulationError
    from spantrain.runtime.emulator import EmulatedCluster
    from spantrain.runtime.emulator.options import RUN_OPTIONS

    cluster = Cluster.from_file(network) if network else Cluster.from_spec(cfg.cluster_spec, "cluster")
    try:
        emu = EmulatedCluster(cluster, devices=devices, cpus=cpus, mode=mode, log=note, options=RUN_OPTIONS)
        emu.check()
    except EmulationError as e:
        raise ExecutionError(f"emulated run: {e}") from None
    return emu


def check_emulated(cfg: RunConfig, *, cpus: float | None = None, mode: str = "auto",
                   network: str | Path | None = None) -> None:
    """`ExecutionError` now, creating nothing, for input `launch_emulated` would refuse (a device's
    CPU share too small for a quota, a rate the kernel's shaper cannot enforce): a run checks
    before it makes its run directory."""
    _emulator(cfg, _rank_devices(cfg), cpus=cpus, mode=mode, network=network, note=lambda m: None)


def launch_emulated(cfg: RunConfig, *, cpus: float | None = None, mode: str = "auto", progress: bool = False,
                    note: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
                    adapter: Adapter | None = None, network: str | Path | None = None) -> dict[str, Any]:
    """Run `cfg` on the local emulated cluster, one worker per plan device; the result of rank 0.

    `cpus`: cores the *whole* cluster's devices share in proportion to their TFLOP/s (default
    all), so each device gets the quota it has in ``spantrain profile --cluster`` with the
    same `cpus`, whichever devices the plan uses. `mode`: the emulator's (auto, netns, local).
    `adapter`: as in `launch_local`; a new cluster file is also a new emulated network (the
    links are reshaped at once under namespaces). `network`: a cluster file whose devices and
    links are emulated instead of the run's (`cfg.cluster_spec`), followed while the run goes
    on: the world as it is, apart from what the run believes (which then changes only through
    the cluster file or the run's own link measurements).
    """
    from spantrain.cluster import Cluster
    from spantrain.errors import EmulationError

    devices = _rank_devices(cfg)
    emu = _emulator(cfg, devices, cpus=cpus, mode=mode, network=network, note=note)
    cfg, devices, run_dir, config_path, start_step = _prepare(cfg, devices)
    with _until_started(cfg):
        # Pin rank k to the k-th emulated device: the spec's host records (if any) name other hosts.
        rank_map = run_dir / "rank_map.json"
        rank_map.write_text(json.dumps(devices) + "\n")
        cfg = dataclasses.replace(cfg, rank_map=str(rank_map))
        cfg.save(config_path)
        network_file = ClusterFile(network, "the emulated network (--emulate-network)", "the links as they are") \
            if network else None
        source = "network file" if network else "cluster file"
        # one device has no link to measure: its worker does not, and the drift note must not say it will
        watcher = _Progress(Path(cfg.metrics_path), cfg.steps, start_step, progress, note, adapter,
                            cfg.measure_links and len(devices) > 1)
    stall_limit = cfg.timeout_s + _STALL_MARGIN_S
    stalled = switching = False

    def reshape(new: Cluster) -> None:
        try:
            live = emu.reshape(new)
        except EmulationError as e:
            note(f"emulator: cannot apply the new {source} to the running devices ({e})")
            return
        note(f"emulator: links reshaped to the new {source}" if live else
             "emulator: the new links apply from the next launch (no kernel shaping in local mode)")

    def stop_when() -> bool | float:
        nonlocal stalled, switching
        watcher.poll()
        changed = network_file.poll(lambda m: note(f"spantrain run: note: {m}")) if network_file is not None else None
        if changed is not None:
            reshape(changed)
        if adapter is not None and watcher.last_step is not None \
                and adapter.check(watcher.last_step, None if network_file is not None else reshape):
            switching = True
            return _STOP_GRACE_S  # SIGTERM: finish the iteration, checkpoint, exit
        stalled = time.monotonic() - watcher.last_change > stall_limit
        return stalled

    command = [sys.executable, "-m", "spantrain.runtime.emulated_worker", str(config_path)]
    try:
        with emu:
            for line in emu.describe():
                note(line)
            if emu.cpu_limited:
                for device, share in zip(devices, emu.shares, strict=True):
                    if WORKER_START_CPU_S / share > 60:  # it looked hung: 0.005 cores had not started in 75 s
                        note(f"emulator: device {device} gets {share:.3g} cores: its worker needs about "
                             f"{WORKER_START_CPU_S / share:.0f} s to start (about {WORKER_START_CPU_S:g} CPU-seconds "
                             "of imports) before training; more cores (--emulate-cpus) or TFLOP/s for it shorten that")
            # Ctrl-C: as a local run, the workers finish their iteration and checkpoint (5 s lost both)
            results = emu.run(command, echo=False, log_dir=run_dir / "logs", stop_when=stop_when,
                              interrupt_grace_s=_STOP_GRACE_S, on_interrupt=lambda: note(_STOPPING_NOTE))
    except EmulationError as e:
        raise ExecutionError(f"emulated run: {e}") from None
    finally:
        if cfg.checkpoint_dir:  # the emulator stopped every device: no worker is left writing one
            remove_partial_saves(cfg.checkpoint_dir)
        shutil.rmtree(cfg.temp_dir, ignore_errors=True)
        watcher.poll()
        watcher.close()
    if stalled:
        raise _failure_error(cfg, devices, None, f"completed no iteration for {stall_limit:.0f} s "
                             "(stalled; see --timeout)", watcher.last_step)
    failed = [r for r in results if not r.ok]
    if failed and switching and all(r.stopped for r in failed):
        raise _switch_timed_out()
    if failed:
        raise _failure_error(cfg, devices, *_blame_emulated(results, cfg), watcher.last_step)
    return _result(run_dir)


def _switch_timed_out() -> StopTimedOut:
    return StopTimedOut(f"the workers did not finish their iteration within {_STOP_GRACE_S:.0f} s of the request "
                        "to stop for a plan switch")


def _blame_emulated(results: list, cfg: RunConfig) -> tuple[int, str]:
    """The worker to name when an emulated run failed (the rules of `_blame`): one killed on its own,
    else one with an error of its own; when every failure only says a peer went away or timed out,
    the one the emulator had to stop, still running after the others gave up."""
    own = [r for r in results if not r.ok and not r.stopped]
    if own and all(r.returncode > 0 and _secondary(cfg.run_dir, r.rank) for r in own):
        hung = [r for r in results if r.stopped]
        if hung:
            return hung[0].rank, "stopped responding (the others timed out or lost the connection waiting for it)"
    candidates = own or [r for r in results if not r.ok]

    def key(r) -> tuple[int, float, int]:
        return (0 if r.returncode < 0 else 2 if _secondary(cfg.run_dir, r.rank) else 1, r.seconds, r.rank)

    worst = min(candidates, key=key)
    return worst.rank, describe_exit(worst.returncode)


def _secondary(run_dir: str, rank: int) -> bool:
    """Whether a failed rank only reports that a peer went away or did not answer."""
    path = error_file(run_dir, rank)
    text = path.read_text() if path.exists() else ""
    return any(s in text for s in _SECONDARY)


def _blame(procs: list, failed: list[int], cfg: RunConfig) -> tuple[int, str]:
    """Stop everyone and name the cause: a killed worker, else one with an error of its own; when
    all failures say "my peer went away / timed out", the worker the others waited for: the one
    still running (frozen, or stuck in a loop) once they have all given up."""
    if all(procs[r].exitcode > 0 and _secondary(cfg.run_dir, r) for r in failed):
        deadline = time.monotonic() + _KILL_GRACE_S  # the other victims time out at about the same moment
        while time.monotonic() < deadline and sum(p.exitcode is None for p in procs) > 1:
            wait_sentinels([p.sentinel for p in procs if p.exitcode is None], timeout=_POLL_S)
        alive = [r for r, p in enumerate(procs) if p.exitcode is None]
        if alive:
            _stop_all(procs, _KILL_GRACE_S)
            return alive[0], "stopped responding (the others timed out or lost the connection waiting for it)"
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]

    def rank_key(r: int) -> tuple[int, int]:
        return (0 if procs[r].exitcode < 0 else 2 if _secondary(cfg.run_dir, r) else 1, r)

    rank = min(failed, key=rank_key)
    how = describe_exit(procs[rank].exitcode)
    _stop_all(procs, _KILL_GRACE_S)
    return rank, how


def _supervise(procs: list, watcher: _Progress, cfg: RunConfig,
               adapter: Adapter | None = None) -> tuple[int | None, str] | None:
    """Wait for the workers; None when all succeeded, else (rank to blame or None for all, what happened)."""
    stall_limit = cfg.timeout_s + _STALL_MARGIN_S
    stopping: float | None = None
    while True:
        wait_sentinels([p.sentinel for p in procs if p.exitcode is None], timeout=_POLL_S)
        watcher.poll()
        # Only once an iteration is done: by then every worker has its SIGTERM handler.
        if adapter is not None and stopping is None and watcher.last_step is not None \
                and adapter.check(watcher.last_step):
            stopping = time.monotonic()  # they finish the iteration together, checkpoint, and exit 0
            for p in procs:
                if p.exitcode is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(p.pid, signal.SIGTERM)
        if stopping is not None and time.monotonic() - stopping >= _STOP_GRACE_S:
            _stop_all(procs, 0.0)  # they had their grace: SIGKILL
            raise _switch_timed_out()
        failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed:
            return _blame(procs, failed, cfg)
        if all(p.exitcode == 0 for p in procs):
            return None
        if time.monotonic() - watcher.last_change > stall_limit:
            _stop_all(procs, _KILL_GRACE_S)
            return None, f"completed no iteration for {stall_limit:.0f} s (stalled; see --timeout)"
