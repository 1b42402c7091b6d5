"""Lockstep moves on data-parallel pipelines (the heuristic's step 8)."""

from __future__ import annotations

from itertools import pairwise

from policy_helpers import region_cluster

from spantrain.cluster import Cluster
from spantrain.env.evaluator import Evaluator, Knobs
from spantrain.env.symmetry import device_classes
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.policies.lockstep import _arrange, _moves, lockstep_refine, reorderings
from spantrain.profiler.topology import generate
from spantrain.workload import Workload


def _two_a100_kinds() -> Cluster:
    """Six A100-80GB (150 TFLOP/s) and six A100-40GB (140) on one 50 Gbit/s LAN."""
    return Cluster.from_spec({
        "name": "two-a100-kinds",
        "devices": [{"id": "a100l", "count": 6, "region": "dc", "tflops": 150, "memory_gb": 80},
                    {"id": "a100", "count": 6, "region": "dc", "tflops": 140, "memory_gb": 40}],
        "network": {"regions": {"dc": {"gbps": 50, "latency_ms": 0.02}},
                    "default": {"gbps": 1, "latency_ms": 20}}})


def _blocks(seq: tuple[int, ...]) -> int:
    return 1 + sum(a != b for a, b in pairwise(seq))


def test_reorders_are_every_one_swap_or_one_move_of_a_class_sequence_once():
    seq = (0, 0, 1, 1)
    # (1, 1, 0, 0) takes two swaps; every other order of the same classes is one away
    assert sorted(reorderings(seq)) == [(0, 1, 0, 1), (0, 1, 1, 0), (1, 0, 0, 1), (1, 0, 1, 0)]
    longer = (0, 1, 2, 0, 1)
    out = reorderings(longer)
    assert len(out) == len(set(out)) and longer not in out
    assert all(sorted(q) == sorted(longer) for q in out)


def test_moves_change_every_pipeline_of_the_group_alike():
    labels = [0, 0, 1, 1, 2, 2, 3]  # two pipelines (0, 2) and (1, 3); idle: 4, 5 (class 2) and 6 (class 3)
    layout = ((0, 2), (1, 3))
    moves = _moves(layout, [0, 1], labels, {2: [4, 5], 3: [6]})
    assert len(moves) == len(set(moves)) and layout not in moves
    assert ((2, 0), (3, 1)) in moves  # reordered
    assert ((0,), (1,)) in moves and ((2,), (3,)) in moves  # a position dropped
    assert ((4, 0, 2), (5, 1, 3)) in moves and ((0, 4), (1, 5)) in moves  # class 2 inserted, replacing
    assert not any(6 in p for m in moves for p in m)  # one idle device of class 3: not one per pipeline
    for m in moves:
        assert len({tuple(labels[d] for d in p) for p in m}) == 1  # the pipelines stay alike


def test_arrange_keeps_a_pipelines_devices_and_their_order_within_a_class():
    labels = [0, 0, 0, 1, 1, 1]
    assert _arrange((0, 1, 2, 3, 4, 5), labels, (1, 0, 1, 0, 0, 1)) == (3, 0, 4, 1, 2, 5)


def test_heuristic_interleaves_device_classes_where_it_divides_the_layers_better(monkeypatch):
    # gpt2-medium on two pipelines of six: the chain search deals each pipeline its three
    # A100-80GB then its three A100-40GB (0.1402 s); an interleaved order, applied to both
    # pipelines at once, cuts the layers more evenly (0.1340 s)
    cluster, workload = _two_a100_kinds(), Workload.from_preset("gpt2-medium")
    labels = device_classes(cluster)
    plan = HeuristicPlanner().best_candidate(Evaluator(cluster, workload))
    monkeypatch.setattr(HeuristicPlanner, "_lockstep", lambda self, ev, best: best)
    blocked = HeuristicPlanner().best_candidate(Evaluator(cluster, workload))
    assert all(_blocks(tuple(labels[d] for d in p)) == 2 for p in blocked.layout)
    assert plan.time < blocked.time / 1.03
    sequences = {tuple(labels[d] for d in p) for p in plan.layout}
    assert len(sequences) == 1 and _blocks(sequences.pop()) > 2  # both pipelines alike, interleaved
    assert sorted(d for p in plan.layout for d in p) == sorted(d for p in blocked.layout for d in p)
    # a fixed point: no further move of the same kind helps
    ev = Evaluator(cluster, workload)
    again = ev.balance(plan.layout, plan.knobs, shares=plan.shares)
    assert lockstep_refine(ev, again) is again


def test_heuristic_adds_part_of_a_unit_to_every_pipeline(monkeypatch):
    # the V100s of two cloud sites of cee-64 seed 1596822, joined by a 0.16 Gbit/s, 24.5 ms link,
    # gpt2-xl: the chain search runs four 3-stage pipelines in cloud-1 (1.2527 s); four of cloud-0's
    # seven V100s, one in front of each pipeline, make it 1.0722 s, where the whole unit dealt in
    # does not pay
    full = generate(64, 1596822, "cee")
    cluster = full.subset([d.id for d in full.devices if d.region in ("cloud-0", "cloud-1")])
    workload = Workload.from_preset("gpt2-xl")
    plan = HeuristicPlanner().best_candidate(Evaluator(cluster, workload))
    monkeypatch.setattr(HeuristicPlanner, "_lockstep", lambda self, ev, best: best)
    whole_units = HeuristicPlanner().best_candidate(Evaluator(cluster, workload))
    assert plan.time < whole_units.time / 1.15
    regions = [[cluster.devices[d].region for d in p] for p in plan.layout]
    assert len(regions) == 4 and all(r == ["cloud-0"] + ["cloud-1"] * 3 for r in regions)


def test_a_plan_no_lockstep_move_can_change_is_returned_without_scoring():
    # plain data parallelism over four identical devices: one-stage pipelines of one class, none idle
    cluster = region_cluster({"node": (4, 150, 40, 100)}, 1.0, name="one-class")
    ev = Evaluator(cluster, Workload.from_preset("gpt2-medium"))
    cand = ev.balance(((0,), (1,), (2,), (3,)), Knobs(micro_batch_size=1, schedule="1f1b", sync="allreduce"))
    assert cand.feasible
    calls = ev.calls
    assert lockstep_refine(ev, cand) is cand and ev.calls == calls
