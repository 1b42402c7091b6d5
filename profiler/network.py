"""Links: bandwidth and latency of every device pair, measured in parallel rounds.

Schedule: a round-robin tournament (circle method). With n devices (one idle "bye" added
when n is odd) there are n - 1 rounds (n when odd); in each round every device is in at
most one pair, so all pairs of a round run at once without sharing a device, and every
unordered pair meets exactly once.

Per pair (a < b): `spantrain.runtime.linkprobe.measure_pair` (moved there so that a
training run can measure its own links the same way), over torch.distributed
point-to-point messages, with the emulator's per-message latency injected through
`delay_before_send` exactly as the runtime's transport does (a no-op when not emulated):

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

from spantrain.runtime.linkprobe import TIMED_TRANSFERS, PairMeasurement, measure_pair

__all__ = ["TIMED_TRANSFERS", "round_robin", "PairMeasurement", "measure_pair"]


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
