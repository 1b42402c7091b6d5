"""Lockstep moves: change every data-parallel pipeline of one kind alike.

The heuristic builds a plan from units (sets of interchangeable devices) dealt whole
into P pipelines, each pipeline running its chunk of every unit of its chain in order.
Two kinds of plan lie outside that space, and single-device moves do not reach them
either, because the data-parallel pipelines must all change together to stay balanced:

- an **interleaved** order: a pipeline of three A100-80GB and three A100-40GB runs them
  as two blocks, where an interleaved order cuts the layers more evenly (3.6 % on a
  64-device cloud-edge-end cluster with gpt2-medium);
- **part of a unit**: one more device in front of each of four pipelines, four of a
  site's seven V100s, where the whole unit dealt in does not pay (16.8 % on another
  64-device cloud-edge-end cluster with gpt2-xl).

`lockstep_refine` searches those plans directly. Pipelines with the same sequence of
device classes (`spantrain.env.symmetry.device_classes`) form a group, and a move
changes every pipeline of a group at once: swap two positions of the class sequence or
move one elsewhere; drop a position; insert an idle device of one class at a position,
or replace a position's device by one, in every pipeline (so it needs one idle device of
that class per pipeline). Best improvement over all groups while it helps.
"""

from __future__ import annotations

from collections import defaultdict

from spantrain.env.evaluator import Candidate, Evaluator, Layout

__all__ = ["lockstep_refine", "reorderings", "MAX_STAGES", "MAX_ROUNDS"]

MAX_STAGES = 16
"""Longest pipeline moved (a reordering round scores about 1.5 x stages^2 orders)."""
MAX_ROUNDS = 12
"""Upper bound on improving rounds."""

Sequence = tuple[int, ...]


def reorderings(seq: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Every order of `seq` one swap or one single-element move away, each once (for a
    pipeline's devices, or a class sequence, whose equal elements give no new order)."""
    seen = {seq}
    out = []
    S = len(seq)
    for a in range(S):
        for b in range(a + 1, S):
            q = list(seq)
            q[a], q[b] = q[b], q[a]
            out.append(tuple(q))
        rest = seq[:a] + seq[a + 1:]
        for j in range(S):
            if j != a:
                out.append((*rest[:j], seq[a], *rest[j:]))
    return [q for q in out if not (q in seen or seen.add(q))]


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


def _moves(layout: Layout, members: list[int], labels: list[int], idle: dict[int, list[int]]) -> list[Layout]:
    """Every lockstep move of the pipelines `members` (same class sequence) of `layout`."""
    seq = tuple(labels[d] for d in layout[members[0]])
    S = len(seq)
    edits = []  # per move: pipeline index -> new pipeline
    for q in reorderings(seq):
        edits.append({i: _arrange(layout[i], labels, q) for i in members})
    if S > 1:
        for k in range(S):
            edits.append({i: layout[i][:k] + layout[i][k + 1:] for i in members})
    for devices in idle.values():
        if len(devices) < len(members):
            continue
        for k in range(S + 1):
            if S < MAX_STAGES:
                edits.append({i: (*layout[i][:k], d, *layout[i][k:]) for i, d in zip(members, devices)})
            if k < S:
                edits.append({i: (*layout[i][:k], d, *layout[i][k + 1:]) for i, d in zip(members, devices)})
    return [tuple(e.get(i, p) for i, p in enumerate(layout)) for e in edits]


def lockstep_refine(ev: Evaluator, cand: Candidate) -> Candidate:
    """The best plan the module docstring's moves reach from `cand` under its knobs
    (`cand` itself when none is better by more than 0.01 %). Batch shares are rebalanced
    for every layout scored; knobs are left to the caller to tune again."""
    if not cand.feasible:
        return cand
    labels = ev.classes
    cur = cand
    for _ in range(MAX_ROUNDS):
        groups: dict[Sequence, list[int]] = defaultdict(list)
        for i, pipe in enumerate(cur.layout):
            groups[tuple(labels[d] for d in pipe)].append(i)
        used = {d for pipe in cur.layout for d in pipe}
        idle: dict[int, list[int]] = defaultdict(list)
        for d in range(len(ev.cluster)):
            if d not in used:
                idle[labels[d]].append(d)
        step = cur
        for seq, members in groups.items():
            if len(seq) > MAX_STAGES:
                continue
            for layout in _moves(cur.layout, members, labels, idle):
                c = ev.balance(layout, cur.knobs, refit=1, moves=0)
                if c.feasible and c.time < step.time * (1 - 1e-4):
                    step = c
        if step is cur:
            break
        cur = step
    return cur
