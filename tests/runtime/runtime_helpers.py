"""Shared inputs and launch helpers for the runtime tests.

The cluster has four CPU "devices" in two regions; the model is a 6-layer GPT (4 blocks)
small enough that a few iterations of a 4-process run take seconds on two cores.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

CLUSTER = {
    "name": "rt-test",
    "devices": [
        {"id": "a", "count": 2, "region": "r1", "tflops": 1, "memory_gb": 8},
        {"id": "b", "count": 2, "region": "r2", "tflops": 1, "memory_gb": 8},
    ],
    "network": {
        "regions": {"r1": {"gbps": 10, "latency_ms": 0.1}, "r2": {"gbps": 10, "latency_ms": 0.1}},
        "default": {"gbps": 1, "latency_ms": 1},
    },
}

MODEL = {
    "name": "rt-small",
    "global_batch": 10,
    "seq_len": 16,
    "precision": "fp32",
    "architecture": {"family": "gpt2", "vocab_size": 256, "d_model": 32, "n_layers": 4, "n_heads": 2, "d_ff": 64,
                     "max_seq_len": 32},
}

BATCH = 10
"""Iteration batch of every plan below."""

LR = 0.01
EXACT_EPS = 1.0
"""AdamW epsilon for exactness runs. With the default 1e-8 Adam divides a gradient by its own
magnitude, so elements whose true gradient is ~1e-9 flip sign on float noise and the
comparison would test rounding, not the runtime; a large epsilon keeps the update
proportional to the gradient, so every gradient error shows, including a wrong scale."""


def default_stop_signals() -> None:
    """`preexec_fn` for children a test interrupts or hangs up on: a suite started as a
    background job (`cmd &` in a script) passes SIGINT ignored to its children, and Python
    then installs no KeyboardInterrupt handler; one started under `nohup` passes SIGHUP
    ignored, and a run keeps ignoring it (as it should under nohup). A user's terminal
    would do neither."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def ctrl_c(proc: subprocess.Popen, when_ready: Callable[[], bool], timeout_s: float = 180) -> tuple[str, str]:
    """Ctrl-C to `proc`'s process group (started in its own session) once `when_ready()` holds
    (or after `timeout_s`): its (stdout, stderr). It is killed if anything goes wrong on the way."""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not when_ready():
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        return proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def plan(schedule: str, sync: str, pipelines: list[tuple[int, int, list[tuple[str, int, int]]]],
         period: int = 1) -> dict[str, Any]:
    """A plan dict: pipelines as (micro_batch_size, num_micro_batches, [(device, start, end), ...])."""
    return {"schedule": schedule, "sync": {"mode": sync, "period": period},
            "pipelines": [{"micro_batch_size": mbs, "num_micro_batches": nmb,
                           "stages": [{"devices": [d], "layers": [a, b]} for d, a, b in stages]}
                          for mbs, nmb, stages in pipelines]}


# Two pipelines that cut the 6 layers differently, with different micro-batch sizes and counts.
ASYMMETRIC = [(1, 4, [("a-0", 0, 2), ("b-0", 2, 6)]),
              (2, 3, [("a-1", 0, 4), ("b-1", 4, 6)])]
# Three pipelines whose holder sets span both regions with two members in one of them, so
# hierarchical sync runs all three phases (in-region sum, leaders' sum, in-region broadcast).
THREE_WAY = [(1, 4, [("a-0", 0, 3), ("b-0", 3, 6)]),
             (2, 2, [("a-1", 0, 6)]),
             (2, 1, [("b-1", 0, 6)])]


def write_inputs(tmp: Path) -> tuple[Path, Path]:
    """(cluster spec, model file) in `tmp`."""
    cluster, model = tmp / "cluster.json", tmp / "model.json"
    cluster.write_text(json.dumps(CLUSTER))
    model.write_text(json.dumps(MODEL))
    return cluster, model


def spantrain(*args: str, timeout: float = 180, env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m spantrain ARGS` in a fresh process."""
    return subprocess.run([sys.executable, "-m", "spantrain", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd)


def spantrain_here(*args: str) -> tuple[int, str, str]:
    """`spantrain ARGS` in this process: (exit code, stdout, stderr).

    Local runs fork their workers from a fork server that imports torch once per *process*,
    so runs started from the test process share it and skip seconds of start-up each.
    """
    from spantrain.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def run_plan(tmp: Path, name: str, plan_dict: dict[str, Any], steps: int, *extra: str,
             eps: float = EXACT_EPS) -> dict[str, Any]:
    """Run `plan_dict` locally with checkpoints; the --json result (asserts success and one JSON line)."""
    cluster, model = write_inputs(tmp)
    plan_path = tmp / f"{name}.plan.json"
    plan_path.write_text(json.dumps(plan_dict))
    code, out, err = spantrain_here("run", "--cluster", str(cluster), "--model", str(model), "--plan", str(plan_path),
                                    "--steps", str(steps), "--lr", str(LR), "--adam-eps", str(eps),
                                    "--run-dir", str(tmp / name), "--checkpoint-dir", str(tmp / f"{name}.ckpt"),
                                    "--json", *extra)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    return json.loads(lines[0])


def workload():
    from spantrain.workload import Workload

    return Workload.from_spec(MODEL, "model")


def rewrite(path: Path, spec: dict[str, Any]) -> None:
    """Write a cluster spec with a new modification time, even on a coarse clock."""
    path.write_text(json.dumps(spec))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def rewrite_after_step(metrics: Path, cluster: Path, step: int, spec: dict[str, Any]) -> threading.Thread:
    """In the background: `rewrite` the cluster file once the run has logged iteration `step` (`--adapt` tests)."""
    from spantrain.runtime.metrics import read_step_records

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(rec["step"] >= step for rec in read_step_records(metrics)):
                rewrite(cluster, spec)
                return
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def run_ranks(script: str, store: Path, world_size: int = 2, timeout: float = 120) -> list[str]:
    """Run `script` (python -c) once per rank, with the rank and a file-store path as its
    arguments; every rank's stdout, in rank order (asserts every rank exited 0)."""
    procs = [subprocess.Popen([sys.executable, "-c", script, str(r), str(store)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(world_size)]
    outs = [p.communicate(timeout=timeout) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [out for out, _ in outs]


def wandb_items(records: bytes, key: str) -> list[str]:
    """The values W&B recorded for `key` (config and summary items alike), read off its offline
    file: protobuf items of field 1, the key, and field 16, the value as JSON."""
    out = []
    for m in re.finditer(re.escape(bytes([0x0A, len(key)]) + key.encode() + b"\x82\x01"), records):
        n = records[m.end()]
        out.append(records[m.end() + 1:m.end() + 1 + n].decode())
    return out
