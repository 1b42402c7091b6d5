"""Links: bandwidth and latency of every device pair, measured in parallel rounds.

Schedule: a round-robin tournament (circle method). With n devices (one idle "bye" added
when n is odd) there are n - 1 rounds (n when odd); in each round every device is in at
most one pair, so all pairs of a round run at once without sharing a device, and every
unordered pair meets exactly once.

Per pair (a < b), over torch.distributed point-to-point messages, with the emulator's
per-message latency injected through `delay_before_send` exactly as the runtime's
transport does (a no-op when not emulated):

- **latency**: ping-pong of one-element messages after one warm-up; one-way latency =
  the shortest round trip / 2 (the two directions cannot be told apart without
  synchronized clocks, so both get it). The minimum, like ping's, keeps the link's
  latency and drops the wake-up delays a busy machine adds to round trips, which only
  ever lengthen them: on the shared 2-core test machine the median ran 0.2-0.3 ms above
  the lower decile, and once, on a loaded machine, the decile put a 2 ms link at 2.64 ms.
  Fixed per-message costs are the cost model's calibration, not the link's.
- **bandwidth**, each direction in turn: probes of doubling size (from 16 kB) until one
  takes 50 ms, then three messages sized to last `transfer_s` at the probed rate (capped
  at 256 MB). The receiver acknowledges each with one element; bandwidth = bytes /
  (elapsed - round trip), which removes both messages' latency and the fixed
  per-message cost. The best of the three counts: on a busy machine a device descheduled
  mid-transfer only ever slows a transfer down (one such stall cost 15 % on a 50 Mbit/s
  pair; once both of two back-to-back transfers ran 17 % slow), never speeds it up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from spantrain.runtime.emulator.latency import delay_before_send

__all__ = ["TIMED_TRANSFERS", "round_robin", "PairMeasurement", "measure_pair"]

_PROBE_START = 16 * 1024
_PROBE_ENOUGH_S = 0.05
_MAX_MESSAGE = 256 * 1024 * 1024
_MIN_PINGS, _MAX_PINGS = 5, 200
TIMED_TRANSFERS = 3
"""Timed messages per direction after the probes; the best counts (module docstring)."""


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs ``(a, b)`` with ``a < b`` covering every pair of ``range(n)`` once."""
    players: list[int | None] = list(range(n))
    if n % 2:
        players.append(None)
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = players[k], players[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        if pairs:
            rounds.append(pairs)
        # Keep the first player fixed, rotate the others by one.
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


@dataclass(frozen=True)
class PairMeasurement:
    """What one pair measured; bandwidths are goodput in bytes/s, latency one-way seconds."""

    a: int
    b: int
    latency_s: float
    a_to_b: float
    b_to_a: float


def _ping_pong(dist, torch, me: int, peer: int, first: bool, slot_s: float) -> float:
    """Shortest round trip over pings that fit `slot_s` (the side with `first` starts and times)."""
    x = torch.zeros(1)
    rtts = []
    t_start = time.perf_counter()
    # Both sides must agree on the count, so the timing side decides and says "stop" with -1.
    for k in range(_MAX_PINGS + 1):
        if first:
            stop = k > _MIN_PINGS and time.perf_counter() - t_start > slot_s
            x.fill_(-1.0 if stop else 1.0)
            t0 = time.perf_counter()
            delay_before_send(me, peer)
            dist.send(x, peer)
            if stop:
                break
            dist.recv(x, peer)
            if k > 0:  # the first exchange warms the connection up
                rtts.append(time.perf_counter() - t0)
        else:
            dist.recv(x, peer)
            if x.item() < 0:
                break
            delay_before_send(me, peer)
            dist.send(x, peer)
    return min(rtts, default=0.0)


def _timed_send(dist, torch, me: int, peer: int, nbytes: int) -> float:
    """Send `nbytes` to `peer` and wait for its one-element acknowledgement; elapsed seconds."""
    size = torch.tensor([nbytes], dtype=torch.int64)
    dist.send(size, peer)
    data = torch.empty(nbytes, dtype=torch.uint8)
    ack = torch.zeros(1)
    t0 = time.perf_counter()
    delay_before_send(me, peer, nbytes)
    dist.send(data, peer)
    dist.recv(ack, peer)
    return time.perf_counter() - t0


def _serve_receive(dist, torch, me: int, peer: int) -> bool:
    """The receiving side of one `_timed_send`; False when the sender says it is done (size 0)."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, peer)
    nbytes = int(size.item())
    if nbytes <= 0:
        return False
    data = torch.empty(nbytes, dtype=torch.uint8)
    dist.recv(data, peer)
    delay_before_send(me, peer)
    dist.send(torch.ones(1), peer)
    return True


def _send_bandwidth(dist, torch, me: int, peer: int, rtt: float, transfer_s: float) -> float:
    """Bytes/s from `me` to `peer` (the peer runs `_serve_receive` until told to stop)."""
    nbytes, rate = _PROBE_START, 0.0
    while True:
        elapsed = _timed_send(dist, torch, me, peer, nbytes)
        net = max(elapsed - rtt, 1e-6)
        rate = nbytes / net
        if net >= _PROBE_ENOUGH_S or nbytes >= _MAX_MESSAGE:
            break
        nbytes *= 2
    if net < transfer_s * 0.9:
        nbytes = int(min(_MAX_MESSAGE, max(nbytes, rate * transfer_s)))
        rate = max(nbytes / max(_timed_send(dist, torch, me, peer, nbytes) - rtt, 1e-6) for _ in range(TIMED_TRANSFERS))
    dist.send(torch.zeros(1, dtype=torch.int64), peer)  # done
    return rate


def measure_pair(dist, torch, me: int, a: int, b: int, *, latency_slot_s: float,
                 transfer_s: float) -> PairMeasurement | None:
    """Run this rank's side of pair (a, b); rank `a` returns the measurement, `b` returns None."""
    peer = b if me == a else a
    first = me == a
    # The round trip is exchanged so both sides subtract the same figure from their transfers.
    rtt = torch.tensor([_ping_pong(dist, torch, me, peer, first, latency_slot_s)], dtype=torch.float64)
    if first:
        dist.send(rtt, peer)
    else:
        dist.recv(rtt, peer)
    rtt_s = float(rtt.item())
    if first:
        a_to_b = _send_bandwidth(dist, torch, me, peer, rtt_s, transfer_s)
        while _serve_receive(dist, torch, me, peer):
            pass
        back = torch.zeros(1, dtype=torch.float64)
        dist.recv(back, peer)
        return PairMeasurement(a=a, b=b, latency_s=rtt_s / 2, a_to_b=a_to_b, b_to_a=float(back.item()))
    while _serve_receive(dist, torch, me, peer):
        pass
    b_to_a = _send_bandwidth(dist, torch, me, peer, rtt_s, transfer_s)
    dist.send(torch.tensor([b_to_a], dtype=torch.float64), peer)
    return None
