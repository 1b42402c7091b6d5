"""Interleave device classes along data-parallel pipelines.

The heuristic builds each pipeline from its units' chunks in chain order, so a pipeline
of three A100-80GB and three A100-40GB runs them as two blocks. The layer cuts are whole
layers, and where the classes differ a little in speed or memory an interleaved order
can divide the layers more evenly: 3.6 % on a 64-device cloud-edge-end cluster with
gpt2-medium, found by no single-device move, since the data-parallel pipelines must all
change together to stay balanced.

`order_classes` searches that space directly. Pipelines with the same sequence of
device classes (`spantrain.env.symmetry.device_classes`) form a group; a move swaps two
positions of the group's sequence, or moves one position elsewhere, in every pipeline of
the group at once. Best improvement while it helps, group by group.
"""

from __future__ import annotations

from collections import defaultdict

from spantrain.env.evaluator import Candidate, Evaluator, Layout
from spantrain.env.symmetry import device_classes

__all__ = ["order_classes", "MAX_STAGES", "MAX_ROUNDS"]

MAX_STAGES = 16
"""Longest pipeline reordered (a round scores about 1.5 x stages^2 orders)."""
MAX_ROUNDS = 8
"""Upper bound on improving rounds per group."""

Sequence = tuple[int, ...]


def _neighbours(seq: Sequence) -> list[Sequence]:
    """Every class sequence one swap or one single-position move away, each once."""
    out: dict[Sequence, None] = {}
    S = len(seq)
    for a in range(S):
        for b in range(a + 1, S):
            if seq[a] != seq[b]:
                q = list(seq)
                q[a], q[b] = q[b], q[a]
                out[tuple(q)] = None
        rest = seq[:a] + seq[a + 1:]
        for j in range(S):
            if j != a:
                out[(*rest[:j], seq[a], *rest[j:])] = None
    out.pop(seq, None)
    return list(out)


def _arrange(pipe: tuple[int, ...], labels: list[int], seq: Sequence) -> tuple[int, ...]:
    """`pipe`'s devices in the class order `seq` (devices of one class keep their order)."""
    pool: dict[int, list[int]] = defaultdict(list)
    for d in pipe:
        pool[labels[d]].append(d)
    taken = dict.fromkeys(pool, 0)
    out = []
    for c in seq:
        out.append(pool[c][taken[c]])
        taken[c] += 1
    return tuple(out)


def order_classes(ev: Evaluator, cand: Candidate) -> Candidate:
    """The best plan the module docstring's moves reach from `cand` under its knobs
    (`cand` itself when none is better by more than 0.01 %). Batch shares are rebalanced
    for every order scored; knobs are left to the caller to tune again."""
    if not cand.feasible:
        return cand
    labels = device_classes(ev.cluster)
    groups: dict[Sequence, list[int]] = defaultdict(list)
    for i, pipe in enumerate(cand.layout):
        groups[tuple(labels[d] for d in pipe)].append(i)
    cur = cand
    for seq, members in groups.items():
        if len(set(seq)) < 2 or len(seq) > MAX_STAGES:
            continue
        for _ in range(MAX_ROUNDS):
            step: tuple[Candidate, Sequence] | None = None
            for q in _neighbours(seq):
                layout: Layout = tuple(_arrange(p, labels, q) if i in members else p
                                       for i, p in enumerate(cur.layout))
                c = ev.balance(layout, cur.knobs, refit=1, moves=0)
                if c.feasible and c.time < (step[0] if step else cur).time * (1 - 1e-4):
                    step = (c, q)
            if step is None:
                break
            cur, seq = step
    return cur
