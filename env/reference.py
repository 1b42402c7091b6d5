"""Pure-Python reference of the cost model: slow, plain, and with a full trace.

It implements the model documented in `spantrain.env.schedules`, `spantrain.env.collectives`
and `spantrain.env.kernel` a second time, with ordinary Python data structures instead of
flat arrays: per-layer loops, lists of ops, a heap-free event loop, holder tuples per
layer. The tests require it to agree with the compiled fast path on random plans, and
the `simulate` command draws its timeline from `trace`.

Floating-point expressions are written in the same order as in the kernels, because the
zero-bubble scheduler compares times: a tie broken differently by rounding would change
the order, not just the last digit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import accumulate

from spantrain.cluster import Cluster
from spantrain.env.calibration import Calibration
from spantrain.errors import PlanError
from spantrain.estimate import Estimate, memory_reason
from spantrain.plan import Plan
from spantrain.workload import Workload

__all__ = ["Op", "Transfer", "Collective", "Trace", "trace", "estimate", "fixed_order", "greedy_order",
           "simulate", "period", "ring", "hierarchical"]

INF = math.inf


@dataclass
class Op:
    kind: str
    """F, B, W or BW."""
    mb: int
    start: float = 0.0
    end: float = 0.0


@dataclass
class Transfer:
    kind: str
    """"act" (stage -> stage+1) or "grad" (stage+1 -> stage)."""
    stage: int
    """The sending stage."""
    mb: int
    start: float
    busy_until: float
    arrival: float


@dataclass
class Collective:
    layers: tuple[int, int]
    devices: tuple[str, ...]
    nbytes: float
    ready: float
    start: float
    end: float


@dataclass
class Trace:
    """Everything the model decided for one plan, plus its estimate."""

    estimate: Estimate
    ops: list[list[list[Op]]]
    """ops[p][s]: stage s of pipeline p, in execution order."""
    transfers: list[list[Transfer]]
    """transfers[p]: every message of pipeline p."""
    collectives: list[Collective] = field(default_factory=list)
    stage_times: list[list[tuple[float, float, float]]] = field(default_factory=list)
    """(F, B, W) seconds per pipeline, stage."""
    stage_memory: list[list[float]] = field(default_factory=list)
    """Peak bytes per pipeline, stage."""
    devices: list[list[str]] = field(default_factory=list)
    layers: list[list[tuple[int, int]]] = field(default_factory=list)
    optimizer_s: float = 0.0
    optimizer_after_sync: bool = True
    """Whether each device steps after its collectives (local-SGD averages after the step)."""
    pipeline_max_s: float = 0.0


# ---- schedules -------------------------------------------------------------------------------

def fixed_order(schedule: str, S: int, M: int, split: bool = False) -> list[list[Op]]:
    """gpipe / 1f1b orders; `split` writes each backward as B then W."""
    def backward(k):
        return [Op("B", k), Op("W", k)] if split else [Op("BW", k)]

    out = []
    for s in range(S):
        warm = M if schedule == "gpipe" else min(S - s - 1, M)
        ops = [Op("F", k) for k in range(warm)]
        nb = 0
        for k in range(warm, M):
            ops.append(Op("F", k))
            ops += backward(nb)
            nb += 1
        for k in range(nb, M):
            ops += backward(k)
        out.append(ops)
    return out


class _Links:
    """FIFO channels between neighbouring stages, both directions."""

    def __init__(self, cfo, cfl, cbo, cbl):
        self.occ = {"act": cfo, "grad": cbo}
        self.lat = {"act": cfl, "grad": cbl}
        self.free = {"act": [0.0] * len(cfo), "grad": [0.0] * len(cbo)}
        self.log: list[Transfer] = []

    def send(self, kind: str, link: int, sender: int, mb: int, end: float) -> float:
        st = max(end, self.free[kind][link])
        self.free[kind][link] = st + self.occ[kind][link]
        arrival = st + self.occ[kind][link] + self.lat[kind][link]
        self.log.append(Transfer(kind, sender, mb, st, self.free[kind][link], arrival))
        return arrival


def simulate(order: list[list[Op]], f, b, w, bw, cfo, cfl, cbo, cbl) -> _Links:
    """Fill start/end of every op of `order` in place; return the links with their messages."""
    S = len(order)
    links = _Links(cfo, cfl, cbo, cbl)
    act: dict[tuple[int, int], float] = {(0, op.mb): 0.0 for op in order[0] if op.kind == "F"}
    grad: dict[tuple[int, int], float] = {}
    nxt = [0] * S
    free = [0.0] * S
    dur = {"F": f, "B": b, "W": w, "BW": bw}
    todo = sum(len(ops) for ops in order)
    while todo:
        moved = False
        for s in range(S):
            while nxt[s] < len(order[s]):
                op = order[s][nxt[s]]
                if op.kind == "F":
                    dep = act.get((s, op.mb))
                elif op.kind == "W":
                    dep = 0.0
                else:
                    dep = grad.get((s, op.mb))
                if dep is None:
                    break
                op.start = max(free[s], dep)
                op.end = op.start + dur[op.kind][s]
                free[s] = op.end
                nxt[s] += 1
                todo -= 1
                moved = True
                if op.kind == "F":
                    if s < S - 1:
                        act[(s + 1, op.mb)] = links.send("act", s, s, op.mb, op.end)
                    else:
                        grad[(s, op.mb)] = op.end
                elif op.kind != "W" and s > 0:
                    grad[(s - 1, op.mb)] = links.send("grad", s - 1, s, op.mb, op.end)
        if not moved:
            raise PlanError("pipeline order deadlocks")
    return links


def greedy_order(M: int, f, b, w, cfo, cfl, cbo, cbl, lim_fb, lim_tot) -> tuple[list[list[Op]], _Links]:
    """The zero-bubble greedy scheduler of `spantrain.env.schedules`, with its timing."""
    S = len(f)
    links = _Links(cfo, cfl, cbo, cbl)
    act = [[INF] * M for _ in range(S)]
    act[0] = [0.0] * M
    grad = [[INF] * M for _ in range(S)]
    order: list[list[Op]] = [[] for _ in range(S)]
    nF, nB, nW = [0] * S, [0] * S, [0] * S
    free = [0.0] * S
    after_b = [False] * S
    waiting = [s > 0 for s in range(S)]
    event = [0.0] + [INF] * (S - 1)

    def f_allowed(s):
        return nF[s] < M and nF[s] - nB[s] < lim_fb[s] and nF[s] - nW[s] < lim_tot[s]

    def wake(s):
        t = grad[s][nB[s]] if nB[s] < nF[s] else INF
        if f_allowed(s) and act[s][nF[s]] < t:
            t = act[s][nF[s]]
        return max(t, free[s])

    left = 3 * M * S
    while left:
        t = min(event)
        if t == INF:
            raise PlanError("zero-bubble scheduler deadlocked")
        s = event.index(t)
        r_b = grad[s][nB[s]] if nB[s] < nF[s] else INF
        r_f = act[s][nF[s]] if f_allowed(s) else INF
        kind = None
        if r_b <= t and r_f <= t:
            kind = "F" if after_b[s] else "B"
        elif r_b <= t:
            kind = "B"
        elif r_f <= t:
            kind = "F"
        elif nW[s] < nB[s]:
            fb_ok = nF[s] < M and nF[s] - nB[s] < lim_fb[s]
            if fb_ok and nF[s] - nW[s] >= lim_tot[s]:
                kind = "W"
            else:
                candidates = []
                if nB[s] < nF[s]:
                    candidates.append(r_b if r_b < INF else max(free[s + 1], t) + b[s + 1] + cbo[s] + cbl[s])
                if f_allowed(s):
                    candidates.append(r_f if r_f < INF else max(free[s - 1], t) + f[s - 1] + cfo[s - 1] + cfl[s - 1])
                t_next = min(candidates, default=INF)
                if t_next == INF or t + w[s] <= t_next:
                    kind = "W"
        if kind is None:
            waiting[s] = True
            event[s] = wake(s)
            continue
        if kind == "F":
            op = Op("F", nF[s], t, t + f[s])
            nF[s] += 1
            after_b[s] = False
            if s < S - 1:
                act[s + 1][op.mb] = links.send("act", s, s, op.mb, op.end)
                if waiting[s + 1]:
                    event[s + 1] = wake(s + 1)
            else:
                grad[s][op.mb] = op.end
        elif kind == "B":
            op = Op("B", nB[s], t, t + b[s])
            nB[s] += 1
            after_b[s] = True
            if s > 0:
                grad[s - 1][op.mb] = links.send("grad", s - 1, s, op.mb, op.end)
                if waiting[s - 1]:
                    event[s - 1] = wake(s - 1)
        else:
            op = Op("W", nW[s], t, t + w[s])
            nW[s] += 1
        order[s].append(op)
        free[s] = op.end
        waiting[s] = False
        event[s] = op.end if len(order[s]) < 3 * M else INF
        left -= 1
    return order, links


def period(order: list[list[Op]], links: _Links) -> float:
    """Steady-state seconds per iteration: the longest stage or channel span."""
    t = max(ops[-1].end - ops[0].start for ops in order)
    for s in range(len(order) - 1):
        t = max(t, links.free["act"][s] - order[s][0].end)
        first_back = next(op for op in order[s + 1] if op.kind in ("B", "BW"))
        t = max(t, links.free["grad"][s] - first_back.end)
    return t


def _peak(order):
    best = 0
    for ops in order:
        c = 0
        for op in ops:
            if op.kind == "F":
                c += 1
                best = max(best, c)
            elif op.kind in ("W", "BW"):
                c -= 1
    return best


def best_order(schedule, M, f, b, w, bw, cfo, cfl, cbo, cbl):
    """The order the schedule runs (see `spantrain.env.schedules`), its links and period."""
    S = len(f)
    if schedule in ("gpipe", "1f1b"):
        order = fixed_order(schedule, S, M)
        links = simulate(order, f, b, w, bw, cfo, cfl, cbo, cbl)
        return order, links, period(order, links)
    order = fixed_order("1f1b", S, M, split=True)
    links = simulate(order, f, b, w, bw, cfo, cfl, cbo, cbl)
    best = period(order, links)
    bounds = [[(S - s, S) for s in range(S)]]
    if schedule == "zb-h2":
        bounds.insert(0, [(2 * (S - s) - 1, 2 * S - 1) for s in range(S)])
    for bd in bounds:
        cand, clinks = greedy_order(M, f, b, w, cfo, cfl, cbo, cbl, [x[0] for x in bd], [x[1] for x in bd])
        t = period(cand, clinks)
        if t < best or (t == best and _peak(cand) < _peak(order)):
            order, links, best = cand, clinks, t
    return order, links, best


# ---- collectives -----------------------------------------------------------------------------

def ring(nodes: list[int], chunk: float, bw, lat, msg: float) -> float:
    """Step seconds of the best nearest-neighbour ring."""
    best = INF
    for first in range(len(nodes)):
        path = [first]
        step = 0.0
        while len(path) < len(nodes):
            cur = nodes[path[-1]]
            cost, j = min((chunk / bw[cur][nodes[j]] + lat[cur][nodes[j]] + msg, j)
                          for j in range(len(nodes)) if j not in path)
            path.append(j)
            step = max(step, cost)
        a, z = nodes[path[-1]], nodes[first]
        step = max(step, chunk / bw[a][z] + lat[a][z] + msg)
        best = min(best, step)
    return best


def ring_allreduce(nodes, nbytes, bw, lat, msg):
    n = len(nodes)
    return 0.0 if n < 2 else 2.0 * (n - 1) * ring(nodes, nbytes / n, bw, lat, msg)


def hierarchical(nodes: list[int], nbytes: float, bw, lat, msg: float, region: list[int]) -> float:
    if len(nodes) < 2:
        return 0.0
    groups: dict[int, list[int]] = {}
    for d in nodes:
        groups.setdefault(region[d], []).append(d)
    if len(groups) == 1:
        return ring_allreduce(nodes, nbytes, bw, lat, msg)
    leaders = []
    up_max = down_max = 0.0
    for r, members in groups.items():
        others = [d for d in nodes if region[d] != r]
        scores = [sum(bw[m][x] for x in others) for m in members]
        lead = scores.index(max(scores))
        leaders.append(members[lead])
        if len(members) > 1:
            chain = [lead]
            min_up = min_down = INF
            lat_up = lat_down = 0.0
            while len(chain) < len(members):
                cur = members[chain[-1]]
                _, j = min((nbytes / bw[cur][members[j]] + lat[cur][members[j]], j)
                           for j in range(len(members)) if j not in chain)
                a, z = cur, members[j]
                min_down = min(min_down, bw[a][z])
                min_up = min(min_up, bw[z][a])
                lat_down += lat[a][z] + msg
                lat_up += lat[z][a] + msg
                chain.append(j)
            up_max = max(up_max, nbytes / min_up + lat_up)
            down_max = max(down_max, nbytes / min_down + lat_down)
    return up_max + ring_allreduce(leaders, nbytes, bw, lat, msg) + down_max


# ---- the whole plan --------------------------------------------------------------------------

class _Tables:
    """Per device: prefix sums over layers of per-sample F, B, W seconds, worked out when a
    stage first reads them and shared by devices of one speed without measured layer times:
    every device's, up front, held 1.6 GB for a 4,096-layer model on 4,096 devices."""

    def __init__(self, cluster: Cluster, workload: Workload):
        self.cluster, self.workload = cluster, workload
        self._made: dict[tuple, tuple[list[float], list[float], list[float]]] = {}

    def __getitem__(self, device: int) -> tuple[list[float], list[float], list[float]]:
        d = self.cluster.devices[device]
        lt = d.layer_times.get(self.workload.name)
        key = ("flops", d.flops) if lt is None else ("device", device)
        hit = self._made.get(key)
        if hit is None:
            hit = self._made[key] = self._make(d.flops, lt)
        return hit

    def _make(self, flops: float, lt) -> tuple[list[float], list[float], list[float]]:
        F, B, W = [], [], []
        for i, layer in enumerate(self.workload.layers):
            if lt is None:
                F.append(layer.forward_flops / flops)
                B.append(layer.input_grad_flops / flops)
                W.append(layer.weight_grad_flops / flops)
            else:
                tot = layer.input_grad_flops + layer.weight_grad_flops
                share = layer.input_grad_flops / tot if tot > 0 else 1.0
                bwd = lt.backward_s[i] / lt.batch
                F.append(lt.forward_s[i] / lt.batch)
                B.append(bwd * share)
                W.append(bwd - bwd * share)
        return tuple([0.0, *accumulate(x)] for x in (F, B, W))


def trace(cluster: Cluster, workload: Workload, plan: Plan, calibration: Calibration | None = None) -> Trace:
    """Estimate `plan` the slow way, keeping every decision (see module docstring)."""
    problems = plan.problems(cluster, workload)
    if problems:
        raise PlanError(problems)
    cal = calibration or Calibration()
    msg = cal.message_overhead_s
    grad_bytes = float(workload.bytes_per_element) if cal.grad_bytes_per_param is None else cal.grad_bytes_per_param
    lsgd_bytes = grad_bytes if cal.local_sgd_bytes_per_param is None else cal.local_sgd_bytes_per_param
    tables = _Tables(cluster, workload)
    layers = workload.layers
    L = len(layers)
    params = [0.0, *accumulate(float(x.params) for x in layers)]
    acts = [0.0, *accumulate(x.activation_bytes for x in layers)]
    # read an element at a time (numpy floats, equal to Python's): as lists, the two matrices
    # were 1 GB at 4,096 devices
    bw, lat = cluster.bandwidth, cluster.latency
    region = cluster.region_index.tolist()
    index = {d: i for i, d in enumerate(cluster.ids)}

    out = Trace(estimate=None, ops=[], transfers=[])  # type: ignore[arg-type]
    ends: dict[str, float] = {}
    makespans, periods, bubbles, opt_max = [], [], [], 0.0
    opt: dict[str, float] = {}  # each device's optimizer step
    tail: dict[str, float] = {}  # ... and its per-iteration overhead
    starts: dict[str, float] = {}
    reasons, peak_gb = [], {}
    for pipe in plan.pipelines:
        m = float(pipe.micro_batch_size)
        devs = [index[st.device] for st in pipe.stages]
        S = len(devs)
        f, b, w, bwf, cfo, cfl, cbo, cbl = [], [], [], [], [], [], [], []
        for s, st in enumerate(pipe.stages):
            a, z = st.layers
            tf, tb, tw = tables[devs[s]]
            db, dw = tb[z] - tb[a], tw[z] - tw[a]
            op_s = cal.op_overhead_s + cal.op_overhead_flops / cluster.devices[devs[s]].flops
            f.append(m * (tf[z] - tf[a]) + op_s)
            b.append(m * db * cal.split_input_grad_factor + op_s)
            w.append(m * dw * cal.split_weight_grad_factor + op_s)
            bwf.append(m * (db + dw) + op_s)
            if s < S - 1:
                d, e = devs[s], devs[s + 1]
                nbytes = m * layers[z - 1].boundary_bytes
                cfo.append(nbytes / bw[d][e] + msg)
                cfl.append(lat[d][e])
                cbo.append(nbytes / bw[e][d] + msg)
                cbl.append(lat[e][d])
        order, links, per = best_order(plan.schedule, pipe.num_micro_batches, f, b, w, bwf, cfo, cfl, cbo, cbl)
        makespan = max(ops[-1].end for ops in order)
        busy = 0.0  # the stages' op durations: M of each op kind per stage
        M = pipe.num_micro_batches
        split = plan.schedule in ("zb-h1", "zb-h2")
        for s in range(S):
            busy += M * (f[s] + b[s] + w[s]) if split else M * (f[s] + bwf[s])
        makespans.append(makespan)
        periods.append(per)
        bubbles.append(1.0 - busy / (S * per) if per > 0 else 0.0)
        mems = []
        for s, st in enumerate(pipe.stages):
            a, z = st.layers
            held = 0
            peak = 0
            for op in order[s]:
                if op.kind == "F":
                    held += 1
                    peak = max(peak, held)
                elif op.kind in ("W", "BW"):
                    held -= 1
            in_b = layers[a - 1].boundary_bytes if a > 0 else 0.0
            out_b = layers[z - 1].boundary_bytes if z < L else 0.0
            big = max(x.activation_bytes for x in layers[a:z])
            p = params[z] - params[a]
            need = (p * cal.state_bytes_per_param + peak * m * (acts[z] - acts[a]) + 2.0 * m * (in_b + out_b)
                    + m * big + cal.reserved_bytes)
            mems.append(need)
            dev = cluster.devices[devs[s]]
            peak_gb[dev.id] = need / 1e9
            if need > dev.memory_bytes:
                reasons.append(memory_reason(dev.id, need, dev.memory_bytes))
            opt[dev.id] = p * cal.optimizer_bytes_per_param / (dev.flops * cal.memory_bytes_per_flop)
            opt_max = max(opt_max, opt[dev.id])
            tail[dev.id] = cal.iteration_overhead_flops / dev.flops
            ends[dev.id] = order[s][-1].end
            starts[dev.id] = order[s][0].start
        out.ops.append(order)
        out.transfers.append(links.log)
        out.stage_times.append(list(zip(f, b, w)))
        out.stage_memory.append(mems)
        out.devices.append([st.device for st in pipe.stages])
        out.layers.append([st.layers for st in pipe.stages])

    # sync: one collective per run of layers with the same holders
    holders = []
    for k in range(L):
        holders.append(tuple(next(st.device for st in p.stages if st.layers[0] <= k < st.layers[1])
                             for p in plan.pipelines))
    runs: list[list[int]] = []
    for k in range(L):
        if runs and holders[runs[-1][0]] == holders[k]:
            runs[-1][1] = k + 1
        else:
            runs.append([k, k + 1])
    mode = plan.sync.mode
    period = plan.sync.period
    overlap = cal.sync_overlap
    # drawing only: the model steps after a device's own sync, except overlapped local SGD, whose
    # averaging follows the step (amortized over the period)
    out.optimizer_after_sync = not (mode == "local-sgd" and overlap)
    pipe_max = max(periods) if overlap else max(makespans)
    per_param = lsgd_bytes if mode == "local-sgd" and period > 1 else grad_bytes
    alone = 0.0
    done = dict(ends)  # when each device's gradients are synced
    if len(plan.pipelines) > 1:
        colls = []
        for lo, hi in runs:
            devices = holders[lo]
            nodes = [index[d] for d in devices]
            nbytes = (params[hi] - params[lo]) * per_param
            if mode == "hierarchical":
                dur = hierarchical(nodes, nbytes, bw, lat, msg, region)
            else:
                dur = ring_allreduce(nodes, nbytes, bw, lat, msg)
            ready = max(ends[d] for d in devices)
            colls.append(Collective((lo, hi), devices, nbytes, ready, 0.0, dur))

        def serialize(ready_of):
            # overlapped: backward order (last layers' gradients are ready first); else the
            # runtime's order, each rank visiting its holder groups by first layer
            free: dict[str, float] = {}
            times = []
            for c in sorted(colls, key=lambda c: -c.layers[0] if overlap else c.layers[0]):
                st = max([ready_of(c)] + [free.get(d, 0.0) for d in c.devices])
                en = st + c.end  # c.end holds the duration until placed
                for d in c.devices:
                    free[d] = en
                times.append((c, st, en))
            return times

        alone = max(en for _, _, en in serialize(lambda c: 0.0))
        if mode == "local-sgd" and overlap:
            placed = serialize(lambda c: 0.0)
            shift = pipe_max + opt_max  # drawn after the pipelines and their steps: averaging follows the step
            out.collectives = [Collective(c.layers, c.devices, c.nbytes, shift, shift + st, shift + en)
                               for c, st, en in placed]
        else:
            placed = serialize(lambda c: c.ready)
            for c, _, en in placed:
                for d in c.devices:
                    done[d] = max(done[d], en)
            out.collectives = [Collective(c.layers, c.devices, c.nbytes, c.ready, st, en) for c, st, en in placed]
    if overlap:
        if mode == "local-sgd":
            # the averaging iteration cannot overlap the next: it lasts the slowest makespan
            drain = max(0.0, max(makespans) - pipe_max) if len(plan.pipelines) > 1 else 0.0
            exposed = (alone + drain) / period
        else:
            exposed = max([pipe_max] + [done[d] - starts[d] for d in done]) - pipe_max
        it = pipe_max + exposed + opt_max + max(tail.values())
    else:
        # every device: schedule, its collectives, optimizer step, bookkeeping; the last one ends the iteration
        after = {d: opt[d] + tail[d] for d in ends}
        plain = max(ends[d] + after[d] for d in ends)
        synced = max(done[d] + after[d] for d in ends)
        it = plain + (synced - plain) / period if mode == "local-sgd" else synced
        exposed = it - plain
    feasible = not reasons
    out.estimate = Estimate(iteration_s=it, samples_per_s=plan.batch / it if feasible and it > 0 else 0.0,
                            feasible=feasible, reasons=tuple(reasons), peak_memory_gb=peak_gb,
                            bubble_fraction=tuple(max(b, 0.0) for b in bubbles), pipeline_s=tuple(makespans),
                            exposed_comm_s=exposed,
                            sync_s=alone, optimizer_s=opt_max, pipeline_period_s=tuple(periods))
    out.optimizer_s = opt_max
    out.pipeline_max_s = pipe_max
    return out


def estimate(cluster: Cluster, workload: Workload, plan: Plan, calibration: Calibration | None = None) -> Estimate:
    """The reference estimate (see `trace`)."""
    return trace(cluster, workload, plan, calibration).estimate
