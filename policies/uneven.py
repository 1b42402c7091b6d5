"""Uneven replicas: hand devices from one data-parallel pipeline to its twin.

The heuristic's structures deal each unit evenly into the pipelines of a chain, and its
lockstep moves keep replicas of one kind alike. Where a model barely fits a pipeline's
memory, two unequal pipelines can beat two equal ones: the longer one takes a larger
share of the batch, the shorter one the rest, and the batch shares rebalance the two.
On a 24-device datacenter cluster with llama2-7b (eight V100, eight A100-80GB, eight
A100-40GB), two 12-stage pipelines became pipelines of 17 and 7 stages, 2.8 % faster;
on the planner benchmark, 2 of 189 plans gain (up to 2.7 %, both llama2-7b).

`split_unevenly` takes two pipelines of the same device-class sequence (of up to
`lockstep.MAX_STAGES` stages) and moves a set
of the donor's devices into the receiver, each next to the receiver's devices of its
class; sets are drawn by class counts, smallest first, up to `MAX_TRANSFERS` per pair.
Moving every device merges the two. Shares are rebalanced for each plan scored, and the
layer cuts of plans within 2 % of the best are moved (`spantrain.policies.cuts`), since
an uneven pair can pay only once its cuts are right.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

from spantrain.env.evaluator import Candidate, Evaluator, Layout
from spantrain.policies.cuts import refine_cuts
from spantrain.policies.lockstep import MAX_STAGES

__all__ = ["split_unevenly", "transfers", "MAX_TRANSFERS"]

MAX_TRANSFERS = 64
"""Most device sets tried per pair of twin pipelines (a 12-stage pipeline of three classes
has 124)."""
_NEAR = 1.02
"""Plans within this factor of the best get their cuts moved before they are compared."""


def transfers(receiver: tuple[int, ...], donor: tuple[int, ...], labels: list[int],
              limit: int = MAX_TRANSFERS) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(receiver, donor) after moving sets of the donor's devices, by class counts, fewest
    devices first, at most `limit`; the donor is empty when all of it moved."""
    by_class: dict[int, list[int]] = defaultdict(list)
    for d in donor:
        by_class[labels[d]].append(d)
    classes = sorted(by_class)
    counts = sorted((c for c in itertools.product(*(range(len(by_class[k]) + 1) for k in classes)) if any(c)),
                    key=lambda c: (sum(c), c))
    out = []
    for count in counts[:limit]:
        moved = [d for k, n in zip(classes, count) for d in by_class[k][len(by_class[k]) - n:]]
        taken = set(moved)
        pipe = list(receiver)
        for d in moved:  # next to the receiver's last device of its class (the end when it has none)
            at = max((i for i, x in enumerate(pipe) if labels[x] == labels[d]), default=len(pipe) - 1) + 1
            pipe.insert(at, d)
        out.append((tuple(pipe), tuple(d for d in donor if d not in taken)))
    return out


def split_unevenly(ev: Evaluator, cand: Candidate) -> Candidate:
    """The best plan one transfer between twin pipelines reaches from `cand` under its knobs
    (`cand` itself when none is better by more than 0.01 %). Pass `cand` with its cuts
    moved (`refine_cuts`): transfers, whose cuts are moved, are judged against it."""
    if not cand.feasible or cand.built is None:
        return cand
    labels = ev.classes
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, pipe in enumerate(cand.layout):
        groups[tuple(labels[d] for d in pipe)].append(i)
    best = cand
    for members in groups.values():
        if len(members) < 2 or len(cand.layout[members[0]]) > MAX_STAGES:
            continue  # the partitioner's cost grows fast with stages: 8 s for 22-stage twins
        a, b = members[:2]  # twins are interchangeable: one pair stands for all
        rest = [p for i, p in enumerate(cand.layout) if i not in (a, b)]
        for receiver, donor in transfers(cand.layout[a], cand.layout[b], labels):
            layout: Layout = (receiver, donor, *rest) if donor else (receiver, *rest)
            c = ev.balance(layout, cand.knobs, refit=1, moves=0)
            if c.feasible and c.time < best.time * _NEAR:
                c = refine_cuts(ev, c)
                if c.time < best.time * (1 - 1e-4):
                    best = c
    return best
