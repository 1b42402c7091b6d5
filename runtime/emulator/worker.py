"""A training worker on the local emulated cluster: ``python -m spantrain.runtime.emulator.worker CONFIG``.

`spantrain.runtime.launcher.launch_emulated` runs this once per plan device inside the
device's namespace and CPU cgroup. The emulator sets torchrun's variables (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` on the bridge), so the worker joins with
``env://``; the run's mapping file (devices in rank order) pins which device each rank
runs, whatever host records the cluster spec carries.

Threads: unless the run fixes ``--threads``, a worker uses the ``OMP_NUM_THREADS`` the
emulator derived from its CPU quota (what the profiler measured the device with), else
its fair share of the machine's cores. SIGTERM and SIGINT (the emulator's stop signals)
ask the worker to finish the iteration with the others, checkpoint and exit. Exit codes
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
        print("usage: python -m spantrain.runtime.emulator.worker RUN_CONFIG.json", file=sys.stderr)
        return 2
    from spantrain.runtime.config import RunConfig
    from spantrain.runtime.entry import exit_worker, use_temp_dir, watch_launcher
    from spantrain.runtime.preflight import cpu_cores

    cfg = RunConfig.from_file(argv[0])
    use_temp_dir(cfg.temp_dir)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cfg.threads is None:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(omp) if omp.isdigit() and int(omp) > 0 else max(1, cpu_cores() // world)
        cfg = dataclasses.replace(cfg, threads=threads)
    from spantrain.runtime.worker import StopFlag, guarded

    stop = StopFlag()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if cfg.launcher_pid:  # after the handlers: a launcher gone stops the worker through its SIGTERM
        threading.Thread(target=watch_launcher, args=(cfg.launcher_pid,), daemon=True).start()
    code, _ = guarded(cfg, rank=rank, world_size=world, init_method=None, local=False, stop=stop)
    exit_worker(code)


if __name__ == "__main__":
    sys.exit(main())
