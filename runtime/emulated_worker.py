"""A training worker on the local emulated cluster: ``python -m spantrain.runtime.emulated_worker CONFIG``.

Outside the emulator package, whose import (numpy, the cost model's arrays) would come before
`main` could install its handlers: a stop during it left a KeyboardInterrupt traceback.

`spantrain.runtime.launcher.launch_emulated` runs this once per plan device inside the
device's namespace and CPU cgroup. The emulator sets torchrun's variables (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` on the bridge), so the worker joins with
``env://``; the run's mapping file (devices in rank order) pins which device each rank
runs, whatever host records the cluster spec carries.

Threads: unless the run fixes ``--threads``, a worker uses the ``OMP_NUM_THREADS`` the
emulator derived from its CPU quota (what the profiler measured the device with), else
its fair share of the machine's cores. SIGTERM and SIGINT (the emulator's stop signals)
ask the worker to finish the iteration with the others, checkpoint and exit; before
training starts they end it at once (there is nothing to save). Exit codes
and the one-line error file are those of `spantrain.runtime.worker.guarded`.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import threading

__all__ = ["main"]

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m spantrain.runtime.emulated_worker RUN_CONFIG.json", file=sys.stderr)
        return 2
    # until training starts a stop has nothing to finish or save: while torch is imported (seconds,
    # minutes on a small CPU quota) it ended in a KeyboardInterrupt traceback in the device's log
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _leave_at_once)
    from spantrain.runtime.entry import EXIT_REFUSED, exit_worker, read_config, use_temp_dir, watch_launcher
    from spantrain.runtime.preflight import cpu_cores

    rank_text, world_text = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if not (rank_text.isdigit() and world_text.isdigit() and int(rank_text) < int(world_text)):
        # the emulator sets both: a worker started by hand without them ended in a KeyError traceback
        print(f"emulated_worker: error: RANK={rank_text} and WORLD_SIZE={world_text}: both must be set, to a rank "
              "below the number of ranks (`spantrain run --emulate` sets them)", file=sys.stderr)
        return EXIT_REFUSED
    rank, world = int(rank_text), int(world_text)
    cfg = read_config(argv[0], f"rank {rank}")
    use_temp_dir(cfg.temp_dir)
    if cfg.threads is None:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(omp) if omp.isdigit() and int(omp) > 0 else max(1, cpu_cores() // world)
        cfg = dataclasses.replace(cfg, threads=threads)
    from spantrain.runtime.worker import StopFlag, guarded

    # Before training starts (rendezvous, set-up) a stop ends the worker at once, as a local one: armed,
    # a worker waiting for a peer still importing waited out the launcher's whole grace (120 s)
    stop = StopFlag(armed=False)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if cfg.launcher_pid:  # after the handlers: a launcher gone stops the worker through its SIGTERM
        threading.Thread(target=watch_launcher, args=(cfg.launcher_pid,), daemon=True).start()
    try:
        with stop.exit_when_blocked():
            code, _ = guarded(cfg, rank=rank, world_size=world, init_method=None, local=False, stop=stop)
    except KeyboardInterrupt:  # stopped before training started: nothing to finish or save
        code = 128 + signal.SIGTERM
    exit_worker(code)


def _leave_at_once(signum: int, frame) -> None:
    os._exit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
