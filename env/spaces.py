"""The observation and action layout shared by the environment and the policy.

Observations are fixed-size padded arrays (SB3 takes no graph spaces):

- ``nodes``  (N, NODE_FEATURES): one row per device slot, zero for padding;
- ``edges``  (N, N, EDGE_FEATURES): features of the ordered device pair (i, j);
- ``mask``   (N,): 1 for a real device, 0 for padding;
- ``globals`` (GLOBAL_FEATURES,): workload, plan knobs and episode progress.

Actions are one flat `Discrete` index over, in this order:

- ``insert(i, j)``  N x N: move device i (idle or in a pipeline) right after device j;
- ``swap(i, j)``    N x N: exchange the places of devices i and j (one may be idle);
- ``idle(i)``       N:     take device i out of its pipeline;
- ``solo(i)``       N:     device i becomes a new pipeline on its own;
- ``knob(k)``       KNOBS: set the schedule, set the sync mode, halve or double the
  micro-batch size, or stop.

The pair and node blocks grow with N, so the policy scores them with per-node and
per-pair heads and one network serves any cluster size; N is a padding size, not a
property of the policy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NODE_FEATURES", "EDGE_FEATURES", "GLOBAL_FEATURES", "KNOBS", "EDGE_BANDWIDTH", "EDGE_LATENCY",
           "EDGE_NEXT_STAGE", "EDGE_PREV_STAGE", "EDGE_SAME_PIPELINE", "EDGE_SAME_REGION", "ActionLayout"]

NODE_FEATURES = 16
EDGE_FEATURES = 6
GLOBAL_FEATURES = 16
# edge feature columns the policy reads by position (to pick which edges message passing uses)
EDGE_BANDWIDTH, EDGE_LATENCY, EDGE_NEXT_STAGE, EDGE_PREV_STAGE, EDGE_SAME_PIPELINE, EDGE_SAME_REGION = range(6)
KNOBS = ("schedule:gpipe", "schedule:1f1b", "schedule:zb-h1", "schedule:zb-h2", "sync:allreduce",
         "sync:hierarchical", "mbs:half", "mbs:double", "stop")
"""Global actions, in order."""


@dataclass(frozen=True)
class ActionLayout:
    """Index arithmetic of the flat action space for `n` device slots."""

    n: int

    @property
    def insert0(self) -> int:
        return 0

    @property
    def swap0(self) -> int:
        return self.n * self.n

    @property
    def idle0(self) -> int:
        return 2 * self.n * self.n

    @property
    def solo0(self) -> int:
        return 2 * self.n * self.n + self.n

    @property
    def knob0(self) -> int:
        return 2 * self.n * self.n + 2 * self.n

    @property
    def size(self) -> int:
        return self.knob0 + len(KNOBS)

    @property
    def stop(self) -> int:
        """The stop action."""
        return self.knob0 + KNOBS.index("stop")

    def decode(self, action: int) -> tuple[str, int, int]:
        """(kind, i, j) with kind in insert/swap/idle/solo/knob; j = -1 where unused, i = knob index for knobs."""
        a = int(action)
        if not 0 <= a < self.size:
            raise ValueError(f"action {a} outside [0, {self.size})")
        if a < self.swap0:
            return "insert", a // self.n, a % self.n
        if a < self.idle0:
            a -= self.swap0
            return "swap", a // self.n, a % self.n
        if a < self.solo0:
            return "idle", a - self.idle0, -1
        if a < self.knob0:
            return "solo", a - self.solo0, -1
        return "knob", a - self.knob0, -1

    def encode(self, kind: str, i: int, j: int = -1) -> int:
        if kind == "insert":
            return self.insert0 + i * self.n + j
        if kind == "swap":
            return self.swap0 + i * self.n + j
        if kind == "idle":
            return self.idle0 + i
        if kind == "solo":
            return self.solo0 + i
        if kind == "knob":
            return self.knob0 + i
        raise ValueError(f"unknown action kind {kind!r}")
