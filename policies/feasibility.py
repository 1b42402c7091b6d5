"""Memory floors and the error a planner raises when a model fits nowhere."""

from __future__ import annotations

import numpy as np

from spantrain.env.calibration import C_RESERVED, C_STATE
from spantrain.env.costmodel import CostModel
from spantrain.env.partition import Partitioner
from spantrain.errors import PlannerError
from spantrain.estimate import fmt_memory

__all__ = ["memory_floor", "fits_nowhere", "no_fit_error"]


def memory_floor(model: CostModel, num_stages: int) -> float:
    """Least possible peak bytes of the fullest stage when the model is cut into
    `num_stages` stages at micro-batch 1 under 1F1B (its in-flight counts), by a min-max
    DP over layer ranges (`Partitioner.memory_floor`): no plan with that many stages needs
    less on every device."""
    return Partitioner(model).memory_floor(num_stages)


def fits_nowhere(model: CostModel) -> bool:
    """Whether no plan can fit, by bounds every plan obeys whatever its cuts, micro-batches and
    schedule: some device holds each layer's training state whole (plus its reserved bytes),
    and the devices together hold every layer's. (`memory_floor` is no such bound: fewer
    stages, or fewer micro-batches in flight, can need less.)"""
    per_param, reserved = float(model.calib[C_STATE]), float(model.calib[C_RESERVED])
    layer_state = np.diff(model.params_prefix) * per_param
    room = np.maximum(model.capacity_bytes - reserved, 0.0)
    return bool(layer_state.max() > room.max() or model.params_prefix[-1] * per_param > room.sum())


def no_fit_error(model: CostModel, planner: str) -> PlannerError:
    """A `PlannerError` saying that the model fits in no arrangement of this cluster, with
    the numbers and the fix."""
    cluster, workload = model.cluster, model.workload
    n = len(cluster)
    reserved = float(model.calib[C_RESERVED])
    if reserved >= float(model.capacity_bytes.max()):  # the constants' fixed share fills every device by itself
        return PlannerError(
            f"{planner}: the cost-model constants reserve {fmt_memory(reserved)} on every device, and the largest "
            f"device of cluster {cluster.name!r} has {fmt_memory(float(model.capacity_bytes.max()))}: nothing is "
            "left for the model; check reserved_bytes in the --calibration profile")
    need = memory_floor(model, n)
    whole = memory_floor(model, 1)
    cap = model.capacity_bytes
    largest = cluster.devices[int(np.argmax(cap))]
    if need > largest.memory_bytes:
        return PlannerError(
            f"{planner}: model {workload.name!r} fits nowhere on cluster {cluster.name!r}: even cut over all {n} "
            f"device(s) at micro-batch 1 some stage needs {fmt_memory(need)} (the whole model on one device needs "
            f"{fmt_memory(whole)}), but the largest device, {largest.id}, has {fmt_memory(largest.memory_bytes)}; "
            "add devices or devices with more memory, or use a smaller model or shorter sequence")
    # a cut exists whose fullest stage fits the largest device, but the smaller ones cannot
    # take their share: say how much memory there is against what the model needs
    total = float(cap.sum())
    return PlannerError(
        f"{planner}: found no arrangement of cluster {cluster.name!r} that fits model {workload.name!r}: cut "
        f"over all {n} device(s) at micro-batch 1 the fullest stage needs at least {fmt_memory(need)} and the "
        f"largest device, {largest.id}, has {fmt_memory(largest.memory_bytes)}, but the devices together hold "
        f"{fmt_memory(total)} for a model whose whole training state needs {fmt_memory(whole)} on one device; "
        "add devices or devices with more memory, or use a smaller model or shorter sequence")
