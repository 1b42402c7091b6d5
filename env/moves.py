"""Moves on a plan's layout, and which moves are valid (the action mask).

A layout is a tuple of pipelines, each a tuple of device indices in stage order; devices
in no pipeline are idle. Knobs (micro-batch size, schedule, sync) are the rest of a
plan's structure; layer partitions and batch shares are derived from both by
`spantrain.env.evaluator.Evaluator.balance`. Every move here maps a valid layout to a
valid layout (at least one pipeline, at most one stage per layer, at most one pipeline
per sample), so a masked policy can never produce an invalid plan; whether the result
fits memory is the evaluator's call.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from spantrain.env.evaluator import Knobs, Layout
from spantrain.env.spaces import KNOBS, ActionLayout

__all__ = ["Roles", "roles", "apply_move", "action_mask", "canonical"]


@dataclasses.dataclass(frozen=True)
class Roles:
    """Where every device sits: pipeline index and stage index, -1 when idle."""

    pipe: np.ndarray
    stage: np.ndarray
    depth: np.ndarray
    """Number of stages of the device's pipeline (0 when idle)."""

    @property
    def active(self) -> np.ndarray:
        return self.pipe >= 0


def roles(layout: Layout, n: int) -> Roles:
    pipe = np.full(n, -1, dtype=np.int64)
    stage = np.full(n, -1, dtype=np.int64)
    depth = np.zeros(n, dtype=np.int64)
    for p, devs in enumerate(layout):
        for s, d in enumerate(devs):
            pipe[d], stage[d], depth[d] = p, s, len(devs)
    return Roles(pipe=pipe, stage=stage, depth=depth)


def canonical(layout: Layout) -> Layout:
    """Pipelines are unordered: sort them so equal layouts compare equal."""
    return tuple(sorted(tuple(p) for p in layout if p))


def _without(layout: Layout, i: int) -> list[list[int]]:
    return [[d for d in p if d != i] for p in layout]


def apply_move(layout: Layout, knobs: Knobs, kind: str, i: int, j: int) -> tuple[Layout, Knobs]:
    """The layout and knobs after one move (assumes the move is valid: see `action_mask`)."""
    if kind == "knob":
        name = KNOBS[i]
        key, _, value = name.partition(":")
        if key == "schedule":
            return layout, dataclasses.replace(knobs, schedule=value)
        if key == "sync":
            return layout, dataclasses.replace(knobs, sync=value, period=1)
        if name == "mbs:half":
            return layout, dataclasses.replace(knobs, micro_batch_size=max(1, knobs.micro_batch_size // 2))
        if name == "mbs:double":
            return layout, dataclasses.replace(knobs, micro_batch_size=knobs.micro_batch_size * 2)
        return layout, knobs  # stop
    if kind == "insert":
        pipes = _without(layout, i)
        for p in pipes:
            if j in p:
                p.insert(p.index(j) + 1, i)
                break
    elif kind == "swap":
        pipes = [[j if d == i else i if d == j else d for d in p] for p in layout]
    elif kind == "idle":
        pipes = _without(layout, i)
    elif kind == "solo":
        pipes = [*_without(layout, i), [i]]
    else:
        raise ValueError(f"unknown move {kind!r}")
    return canonical(tuple(tuple(p) for p in pipes)), knobs


def action_mask(layout: Layout, knobs: Knobs, n_devices: int, n_slots: int, n_layers: int,
                global_batch: int) -> np.ndarray:
    """Boolean mask over the flat action space of `n_slots` device slots (padding masked)."""
    acts = ActionLayout(n_slots)
    mask = np.zeros(acts.size, dtype=bool)
    r = roles(layout, n_slots)
    real = np.zeros(n_slots, dtype=bool)
    real[:n_devices] = True
    active = r.active
    n_active = int(active.sum())
    n_pipes = len(layout)

    # insert(i, j): j in a pipeline with room for another stage; i is not already right after j
    ins = real[:, None] & active[None, :]
    np.fill_diagonal(ins, False)
    room = r.depth < n_layers
    same_pipe = (r.pipe[:, None] == r.pipe[None, :]) & active[:, None]
    ins &= room[None, :] | same_pipe
    right_after = same_pipe & (r.stage[:, None] == r.stage[None, :] + 1)
    ins &= ~right_after
    # moving the only device of a pipeline into another pipeline is fine; into its own is a no-op
    mask[acts.insert0:acts.swap0] = ins.reshape(-1)

    # swap(i, j), i < j: at least one is active; two single-stage pipelines would just trade names
    sw = real[:, None] & real[None, :] & (active[:, None] | active[None, :])
    sw &= np.triu(np.ones((n_slots, n_slots), dtype=bool), 1)
    solo_pipe = active & (r.depth == 1)
    sw &= ~(solo_pipe[:, None] & solo_pipe[None, :])
    mask[acts.swap0:acts.idle0] = sw.reshape(-1)

    # idle(i): keep at least one device working
    if n_active >= 2:
        mask[acts.idle0:acts.solo0] = active
    # solo(i): a new pipeline needs a sample of its own; a device alone already is one
    if n_pipes + 1 <= global_batch:
        mask[acts.solo0:acts.knob0] = real & (~active | (r.depth > 1))

    for k, name in enumerate(KNOBS):
        key, _, value = name.partition(":")
        if key == "schedule":
            ok = value != knobs.schedule
        elif key == "sync":
            ok = value != knobs.sync
        elif name == "mbs:half":
            ok = knobs.micro_batch_size > 1
        elif name == "mbs:double":
            ok = knobs.micro_batch_size * 2 * max(n_pipes, 1) <= global_batch
        else:
            ok = True
        mask[acts.knob0 + k] = ok
    return mask
