"""The launcher's fork server leaves without tearing torch down, so a caller reading the run's
output sees it end when the launcher exits, not half a second later."""

from __future__ import annotations

import subprocess
import sys

from spantrain.runtime import launcher

_SERVER = """
import spantrain.runtime.forkserver_exit
from multiprocessing import util
util.Finalize(None, print, args=("multiprocessing's finalizer ran",), exitpriority=0)
class Torn:
    def __del__(self):
        print("torn down")
kept = Torn()
print("serving", flush=True)
raise SystemExit  # what the fork server does when the launcher is gone
"""


def test_the_fork_server_skips_teardown_but_not_multiprocessings_exit_work():
    proc = subprocess.run([sys.executable, "-c", _SERVER], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["serving", "multiprocessing's finalizer ran"], proc.stdout


def test_local_runs_start_their_fork_server_with_it():
    from multiprocessing import forkserver

    if launcher._context().get_start_method() == "forkserver":  # the preload list is the module's only record
        assert forkserver._forkserver._preload_modules[0] == "spantrain.runtime.forkserver_exit"
