"""Emulated latency delays a message's arrival, never its sender (`spantrain.runtime.emulator.delayed`)."""

from __future__ import annotations

import itertools
import time

import pytest

from spantrain.runtime.emulator.delayed import DelayedSends
from spantrain.runtime.emulator.latency import Emulation


def _emulation(kernel_shaping: bool) -> Emulation:
    dev = {"region": "r", "address": "127.0.0.1", "namespace": None, "host": "h", "cpu_cores": None, "tflops": 1.0,
           "memory_gb": 1.0}
    return Emulation(cluster="t", run_id="0000", kernel_shaping=kernel_shaping, bandwidth_scale=1.0, max_gbps=1.0,
                     master_addr="127.0.0.1", master_port=1, cpu={}, devices=[{"rank": 0, "id": "a", **dev},
                                                                             {"rank": 1, "id": "b", **dev}],
                     latency=[[0.0, 0.05], [0.05, 0.0]], spec_gbps=[[None, 0.008], [0.008, None]],
                     emulated_gbps=[[None, 0.008], [0.008, None]])  # 1 MB/s


class _Work:
    def wait(self) -> bool:
        return True


def _issue(log: list[float]):
    def issue() -> _Work:
        log.append(time.perf_counter())
        return _Work()

    return issue


def _on_time(times: list[float], expected: list[float]) -> bool:
    # never early; late only by what a loaded machine's scheduler may add (a thread woken late)
    return all(want - 0.005 <= t < want + 0.04 for t, want in zip(times, expected, strict=True))


def test_sender_returns_at_once_and_messages_leave_one_latency_later():
    sends = DelayedSends(_emulation(kernel_shaping=True), rank=0)
    log: list[float] = []
    t0 = time.perf_counter()
    for _ in range(3):
        assert sends.submit(1, 100_000, _issue(log)).wait()
    assert time.perf_counter() - t0 < 0.04  # three 50 ms latencies did not hold the sender
    sends.flush()
    sends.close()
    # The kernel shapes the bytes: each message is issued one latency after its hand-over, in order.
    assert _on_time([t - t0 for t in log], [0.05, 0.05, 0.05]), log


def test_without_kernel_shaping_the_channel_also_serializes_the_bytes():
    sends = DelayedSends(_emulation(kernel_shaping=False), rank=0)
    log: list[float] = []
    t0 = time.perf_counter()
    for _ in range(3):
        sends.submit(1, 20_000, _issue(log))  # 20 ms each at 1 MB/s, queued FIFO, then 50 ms latency
    sends.flush()
    sends.close()
    times = [t - t0 for t in log]
    assert _on_time(times, [0.07, 0.09, 0.11]) and all(b - a >= 0.015 for a, b in itertools.pairwise(times)), times


def test_a_failed_send_is_raised_to_the_sender():
    sends = DelayedSends(_emulation(kernel_shaping=True), rank=0)

    def broken() -> _Work:
        raise RuntimeError("Connection closed by peer")

    sends.submit(1, 10, broken)
    with pytest.raises(RuntimeError, match="Connection closed"):
        sends.flush()
    with pytest.raises(RuntimeError, match="Connection closed"):
        sends.submit(1, 10, _issue([]))
    sends.close()
