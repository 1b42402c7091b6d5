"""Fixtures shared by every test package."""

from __future__ import annotations

import copy
import os
import signal
from pathlib import Path

import pytest

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

# a suite started in the background (`make test &`, a CI step without job control) inherits
# SIGINT ignored; the Ctrl-C tests raise it in this process and need Python's own handler
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent

DEMO_SPEC = {
    "name": "cee-demo",
    "devices": [
        {"id": "cloud", "count": 4, "region": "cloud-a", "tier": "cloud", "gpu": "A100-40GB", "tflops": 150,
         "memory_gb": 40},
        {"id": "edge-0", "region": "edge-b", "tier": "edge", "gpu": "RTX3090", "tflops": 35, "memory_gb": 24},
        {"id": "end-0", "region": "end-c", "tier": "end", "gpu": "RTX3060", "tflops": 12, "memory_gb": 12},
    ],
    "network": {
        "regions": {"cloud-a": {"gbps": 100, "latency_ms": 0.02}, "edge-b": {"gbps": 10, "latency_ms": 0.1},
                    "end-c": {"gbps": 1, "latency_ms": 0.5}},
        "links": [{"between": ["cloud-a", "edge-b"], "gbps": 0.1, "latency_ms": 30},
                  {"between": ["edge-b", "end-c"], "gbps": 0.5, "latency_ms": 10}],
        "default": {"gbps": 0.05, "latency_ms": 80},
        "overrides": [{"between": ["cloud-0", "cloud-1"], "gbps": 600, "latency_ms": 0.005}],
    },
}


@pytest.fixture
def demo_spec() -> dict:
    """The DESIGN.md example spec, as a fresh dict each time (tests may mutate it)."""
    return copy.deepcopy(DEMO_SPEC)


@pytest.fixture
def run_cli(capsys):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""
    from spantrain.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def wandb_records():
    """Read the records of the offline W&B runs under a directory once they hold `expected`.
    wandb's service writes a run's log a moment after `finish()` returns (seen: 0.1 s, 1 run
    in 20), so a test that reads at once found only the file's header."""
    import time

    def read(root: Path, *expected: bytes, timeout_s: float = 10.0) -> bytes:
        deadline = time.monotonic() + timeout_s
        while True:
            records = b"".join(p.read_bytes() for p in sorted(Path(root).rglob("*.wandb")))
            if all(e in records for e in expected) or time.monotonic() > deadline:
                return records
            time.sleep(0.05)

    return read


def _wandb_file_records(path: Path) -> list:
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then LevelDB-log style
    chunks (checksum, length, type: whole, first, middle, last) in blocks of 32 KiB."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, pos, buf, out = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(data):
        if (left := 32768 - pos % 32768) < 7:  # a block's tail too short for a header: padding
            pos += left
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out


@pytest.fixture
def wandb_part():
    """What one offline W&B run part (an ``offline-run-*`` directory) holds, read off its records
    once it has ended (wandb's service writes a moment after `finish()`): its name, job type,
    config and summary (values decoded, nested keys joined by "/", later updates winning) and the
    steps its history rows are at."""
    import json
    import time

    def read(part: Path, timeout_s: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            (file,) = Path(part).glob("*.wandb")
            records = _wandb_file_records(file)
            kinds = [r.WhichOneof("record_type") for r in records]
            if "exit" in kinds or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        got = {"name": None, "job_type": None, "config": {}, "summary": {}, "steps": []}

        def key(item) -> str:
            return item.key or "/".join(item.nested_key)

        for r, kind in zip(records, kinds, strict=True):
            if kind == "run":
                got.update(name=r.run.display_name, job_type=r.run.job_type)
                got["config"].update({key(i): json.loads(i.value_json) for i in r.run.config.update})
            elif kind == "config":
                got["config"].update({key(i): json.loads(i.value_json) for i in r.config.update})
            elif kind == "summary":
                got["summary"].update({key(i): json.loads(i.value_json) for i in r.summary.update})
            elif kind == "history":
                got["steps"].append(r.history.step.num)
        got["config"].pop("_wandb", None)
        return got

    return read


@pytest.fixture
def tmpfs(tmp_path):
    """`tmpfs(size)`: a directory with a tmpfs of `size` ("1M", "64K") mounted on it, to fill a disk
    for real (root only, else the test is skipped); unmounted afterwards, also when the test fails."""
    import subprocess

    mounted = []

    def mount(size: str) -> Path:
        disk = tmp_path / f"disk-{len(mounted)}"
        disk.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                                               capture_output=True).returncode != 0:
            pytest.skip("mounting a tmpfs needs root")
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=False)
