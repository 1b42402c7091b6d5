"""Per-stage operation orders for the zero-bubble schedules (ZB-H1, ZB-H2).

A stage's order is a list of ``(op, micro_batch)`` with op ``"F"`` (forward), ``"B"``
(input gradient), ``"W"`` (weight gradient) or ``"BW"`` (both at once). The runtime executes
the order with torch's custom-order pipeline runtime, so what runs is exactly what the
order says.

Where the orders come from, best first: the cost model (`spantrain.env.costmodel.CostModel.
stage_orders(plan)`, which times ops and links exactly as its prediction did), so the
runtime executes the very order the cost model simulated; else the cost model's order
generator `spantrain.env.schedules.stage_orders` fed with FLOP-based stage times; else the
built-in generator below. Either way the order is checked (`check_orders`) before
it runs, because a malformed order would deadlock the pipeline.

The built-in generator is a list scheduler over one iteration: each stage, when idle, runs
the first of these that is ready: the oldest micro-batch's B, the next F (if the stage
holds fewer than its limit of micro-batches whose W is still pending), else a pending W.
Ws therefore fill the gaps where a stage would wait. The limit sets the memory: ZB-H1 keeps
at most ``p - s`` micro-batches in flight on stage ``s`` (as 1F1B does), ZB-H2 up to
``2(p - s) - 1``, which fills the warm-up bubble with extra forwards (Qi et al. 2023).
Stage times ``f, b, w`` (seconds per micro-batch, per stage) shape the order when stages
are unequal; equal times give the textbook shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spantrain.errors import ExecutionError

__all__ = ["Op", "builtin_orders", "check_orders", "stage_orders", "flop_stage_times", "all_pipeline_orders",
           "run_orders", "to_actions"]

Op = tuple[str, int]

_ZB = ("zb-h1", "zb-h2")


def _limit(schedule: str, num_stages: int, stage: int, num_micro_batches: int) -> int:
    depth = num_stages - stage
    limit = depth if schedule == "zb-h1" else 2 * depth - 1
    return max(1, min(limit, num_micro_batches))


def builtin_orders(schedule: str, num_stages: int, num_micro_batches: int,
                   f: Sequence[float] | None = None, b: Sequence[float] | None = None,
                   w: Sequence[float] | None = None) -> list[list[Op]]:
    """Zero-bubble orders by list scheduling (see the module docstring)."""
    if schedule not in _ZB:
        raise ExecutionError(f"no built-in op order for schedule {schedule!r} (only {', '.join(_ZB)})")
    p, m = num_stages, num_micro_batches
    f = list(f) if f is not None else [1.0] * p
    b = list(b) if b is not None else [1.0] * p
    w = list(w) if w is not None else [1.0] * p
    free = [0.0] * p                    # when each stage is next idle
    next_f = [0] * p                    # next micro-batch to forward
    next_b = [0] * p                    # next micro-batch to run B on (in order)
    w_pending: list[list[int]] = [[] for _ in range(p)]
    w_done = [0] * p
    f_end: list[dict[int, float]] = [{} for _ in range(p)]
    b_end: list[dict[int, float]] = [{} for _ in range(p)]
    orders: list[list[Op]] = [[] for _ in range(p)]
    limits = [_limit(schedule, p, s, m) for s in range(p)]
    remaining = 3 * p * m

    def candidate(s: int) -> tuple[float, int, str, int] | None:
        """(start time, priority, op, micro-batch) of the op stage s would run next."""
        options = []
        j = next_b[s]
        if j < next_f[s]:
            dep = f_end[s].get(j) if s == p - 1 else b_end[s + 1].get(j)
            if dep is not None:
                options.append((max(free[s], dep), 0, "B", j))
        j = next_f[s]
        if j < m and next_f[s] - w_done[s] < limits[s]:
            dep = 0.0 if s == 0 else f_end[s - 1].get(j)
            if dep is not None:
                options.append((max(free[s], dep), 1, "F", j))
        if w_pending[s]:
            options.append((free[s], 2, "W", w_pending[s][0]))
        return min(options) if options else None

    while remaining:
        best = None
        for s in range(p):
            c = candidate(s)
            if c is not None and (best is None or (c[0], c[1], s) < (best[0][0], best[0][1], best[1])):
                best = (c, s)
        if best is None:  # cannot happen with limits >= 1; guard against an endless loop
            raise ExecutionError(f"built-in {schedule} order got stuck ({p} stages, {m} micro-batches)")
        (start, _, op, j), s = best
        if op == "F":
            end = start + f[s]
            f_end[s][j] = end
            next_f[s] += 1
        elif op == "B":
            end = start + b[s]
            b_end[s][j] = end
            next_b[s] += 1
            w_pending[s].append(j)
        else:
            end = start + w[s]
            w_pending[s].pop(0)
            w_done[s] += 1
        free[s] = end
        orders[s].append((op, j))
        remaining -= 1
    return orders


def check_orders(orders: object, num_stages: int, num_micro_batches: int, source: str) -> list[list[Op]]:
    """The orders if every stage runs each micro-batch's F, then B, then W (or BW) exactly once."""
    def bad(msg: str) -> ExecutionError:
        return ExecutionError(f"op order from {source} is malformed: {msg}")

    if not isinstance(orders, (list, tuple)) or len(orders) != num_stages:
        raise bad(f"expected one list per stage ({num_stages})")
    out: list[list[Op]] = []
    for s, ops in enumerate(orders):
        seen: dict[int, list[str]] = {j: [] for j in range(num_micro_batches)}
        clean: list[Op] = []
        for item in ops:
            if not (isinstance(item, (list, tuple)) and len(item) == 2 and item[0] in ("F", "B", "W", "BW")
                    and isinstance(item[1], int) and 0 <= item[1] < num_micro_batches):
                raise bad(f"stage {s}: {item!r} is not (F|B|W|BW, micro-batch)")
            op, j = item[0], int(item[1])
            allowed_after = {"F": [], "B": ["F"], "W": ["F", "B"], "BW": ["F"]}[op]
            if seen[j] != allowed_after:
                raise bad(f"stage {s}: {op}{j} comes after {seen[j] or 'nothing'}")
            seen[j].append(op)
            clean.append((op, j))
        for j, done in seen.items():
            if done not in (["F", "B", "W"], ["F", "BW"]):
                raise bad(f"stage {s}: micro-batch {j} runs {done or 'nothing'}")
        out.append(clean)
    return out


def stage_orders(schedule: str, num_stages: int, num_micro_batches: int, f: Sequence[float],
                 b: Sequence[float], w: Sequence[float]) -> tuple[list[list[Op]], str]:
    """(orders, source) for stage times `f, b, w`: the cost model's generator when present, else built-in."""
    try:
        from spantrain.env.schedules import stage_orders as env_orders
    except ImportError:
        return builtin_orders(schedule, num_stages, num_micro_batches, f, b, w), "built-in"
    source = "spantrain.env.schedules"
    orders = env_orders(schedule, num_stages, num_micro_batches, list(f), list(b), list(w), comm=None)
    return check_orders(orders, num_stages, num_micro_batches, source), source


def flop_stage_times(cluster: Any, workload: Any, plan: Any, pipeline: int
                     ) -> tuple[list[float], list[float], list[float]]:
    """Per-stage F, B, W seconds of one micro-batch, from layer FLOPs and device speed."""
    p = plan.pipelines[pipeline]
    f, b, w = [], [], []
    for s in p.stages:
        flops = cluster.device(s.device).flops
        layers = workload.layers[s.layers[0]:s.layers[1]]
        f.append(sum(x.forward_flops for x in layers) * p.micro_batch_size / flops)
        b.append(sum(x.input_grad_flops for x in layers) * p.micro_batch_size / flops)
        w.append(sum(x.weight_grad_flops for x in layers) * p.micro_batch_size / flops)
    return f, b, w


def all_pipeline_orders(cluster: Any, workload: Any, plan: Any,
                        calibration: Any = None) -> list[tuple[list[list[Op]], str]]:
    """(orders, source) for every pipeline of a zero-bubble `plan`, preferring the cost model's own.

    `CostModel.stage_orders(plan)` times the ops and links exactly as the cost model's
    prediction did (with the run's `calibration`: its split and per-op costs change the
    order), so the runtime then executes the very order that was costed. Without the cost
    model, `stage_orders` with FLOP-based stage times.
    """
    try:
        from spantrain.env.costmodel import CostModel
    except ImportError:
        out = []
        for i, p in enumerate(plan.pipelines):
            f, b, w = flop_stage_times(cluster, workload, plan, i)
            out.append(stage_orders(plan.schedule, len(p.stages), p.num_micro_batches, f, b, w))
        return out
    source = "spantrain.env.costmodel"
    orders = CostModel(cluster, workload, calibration).stage_orders(plan)
    return [(check_orders(o, len(p.stages), p.num_micro_batches, source), source)
            for o, p in zip(orders, plan.pipelines)]


def run_orders(cluster: Any, workload: Any, plan: Any,
               calibration: Any = None) -> tuple[list[list[list[list[Any]]]] | None, str | None]:
    """`RunConfig.zb_orders` and `zb_order_source` for `plan`: computed once before launch (the cost
    model's order generator compiles on first use, which every worker would pay); (None, None)
    for schedules that need no order."""
    if not plan.schedule.startswith("zb-"):
        return None, None
    computed = all_pipeline_orders(cluster, workload, plan, calibration)
    return [[[list(op) for op in stage] for stage in orders] for orders, _ in computed], computed[0][1]


def to_actions(orders: list[list[Op]], stage_to_group_rank: dict[int, int]) -> dict[int, list]:
    """torch's schedule IR: group rank -> list of `_Action` (one stage per rank)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.BACKWARD_INPUT,
             "W": _ComputationType.BACKWARD_WEIGHT, "BW": _ComputationType.FULL_BACKWARD}
    return {stage_to_group_rank[s]: [_Action(s, kinds[op], j) for op, j in ops] for s, ops in enumerate(orders)}
