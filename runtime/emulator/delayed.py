"""Emulated latency that delays a message's arrival without blocking its sender.

On a real link a sender hands a message to the network and carries on computing; the
message arrives one latency later. `delay_before_send` (sleep, then send) instead holds
the sending stage for the latency of every message it sends: with 8 micro-batches over a
20 ms link a stage lost 160 ms of compute per iteration to sleeping, which no network
does. `DelayedSends` gives the runtime's transport the real semantics: the caller hands
over a private copy of the payload and an ``issue`` callable (which starts the real
send and returns its work), and returns at once; one thread per destination issues the
messages in order, each at its due time:

- kernel shaping (namespaces): due = hand-over time + one-way latency; the kernel's
  shaper then paces the bytes, so arrival = due + bytes / bandwidth;
- no kernel shaping (the fallback): the destination's channel is also occupied for
  bytes / bandwidth per message, FIFO, so due = max(hand-over, channel free) + bytes /
  bandwidth + latency, the cost model's channel rule (`spantrain.env.schedules`).

The send's own completion is awaited on that thread; a failure (a peer that died) is
raised on the caller's next hand-over or at `flush`. Standard library only.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from spantrain.runtime.emulator.latency import Emulation

__all__ = ["SENT", "DelayedSends"]


class _Sent:
    """What the sender's ``wait`` sees: done at once (its payload was copied, the link has it)."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


SENT = _Sent()


class _Channel:
    """The messages to one destination, issued by one thread in hand-over order."""

    def __init__(self, owner: DelayedSends, dst: int):
        self.owner = owner
        self.free_at = 0.0
        self.queue: queue.Queue[tuple[float, Callable[[], Any]] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._run, name=f"emulated-link-to-{dst}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            try:
                if item is None:
                    return
                due, issue = item
                # A plain sleep, not latency.sleep_until's final spin: spinning would hold the GIL
                # against the stage's own thread; ~0.1 ms of wake-up lateness is far below the latencies.
                left = due - time.perf_counter()
                if left > 0:
                    time.sleep(left)
                if self.owner.error is None:
                    issue().wait()
            except BaseException as e:  # reported to the sender, which owns the failure
                self.owner.error = self.owner.error or e
            finally:
                self.queue.task_done()


class DelayedSends:
    """Per-destination delayed issuing of point-to-point sends for one rank (module docstring)."""

    def __init__(self, emulation: Emulation, rank: int):
        self.emulation = emulation
        self.rank = rank
        self.error: BaseException | None = None
        self._channels: dict[int, _Channel] = {}

    def submit(self, dst: int, nbytes: int, issue: Callable[[], Any]) -> _Sent:
        """Hand over a message of `nbytes` to global rank `dst`; `issue()` starts its send later."""
        self.raise_error()
        ch = self._channels.get(dst)
        if ch is None:
            ch = self._channels[dst] = _Channel(self, dst)
        emu = self.emulation
        now = time.perf_counter()
        if emu.kernel_shaping:
            due = now + emu.latency_s(self.rank, dst)
        else:
            ch.free_at = max(now, ch.free_at) + nbytes / emu.bandwidth_bytes_per_s(self.rank, dst)
            due = ch.free_at + emu.latency_s(self.rank, dst)
        ch.queue.put((due, issue))
        return SENT

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def flush(self) -> None:
        """Wait until every handed-over message has been sent; raise a send's failure."""
        for ch in self._channels.values():
            ch.queue.join()
        self.raise_error()

    def close(self) -> None:
        """Stop the threads after the messages already handed over."""
        for ch in self._channels.values():
            ch.queue.put(None)
        for ch in self._channels.values():
            ch.thread.join(timeout=5.0)
        self._channels.clear()
