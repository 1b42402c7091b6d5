"""Device classes interleaved along data-parallel pipelines (the heuristic's step 8)."""

from __future__ import annotations

from itertools import pairwise

from conftest import region_cluster

from spantrain.cluster import Cluster
from spantrain.env.evaluator import Evaluator
from spantrain.env.symmetry import device_classes
from spantrain.policies.class_order import _arrange, _neighbours, order_classes
from spantrain.policies.heuristic import HeuristicPlanner
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


def test_neighbours_are_every_one_swap_or_one_move_of_a_class_sequence_once():
    seq = (0, 0, 1, 1)
    # (1, 1, 0, 0) takes two swaps; every other order of the same classes is one away
    assert sorted(_neighbours(seq)) == [(0, 1, 0, 1), (0, 1, 1, 0), (1, 0, 0, 1), (1, 0, 1, 0)]
    longer = (0, 1, 2, 0, 1)
    out = _neighbours(longer)
    assert len(out) == len(set(out)) and longer not in out
    assert all(sorted(q) == sorted(longer) for q in out)


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
    monkeypatch.setattr(HeuristicPlanner, "_interleave_classes", lambda self, ev, best: best)
    blocked = HeuristicPlanner().best_candidate(Evaluator(cluster, workload))
    assert all(_blocks(tuple(labels[d] for d in p)) == 2 for p in blocked.layout)
    assert plan.time < blocked.time / 1.03
    sequences = {tuple(labels[d] for d in p) for p in plan.layout}
    assert len(sequences) == 1 and _blocks(sequences.pop()) > 2  # both pipelines alike, interleaved
    assert sorted(d for p in plan.layout for d in p) == sorted(d for p in blocked.layout for d in p)
    # a fixed point: no further move of the same kind helps
    ev = Evaluator(cluster, workload)
    again = ev.balance(plan.layout, plan.knobs, shares=plan.shares)
    assert order_classes(ev, again) is again


def test_pipelines_of_one_class_are_left_alone():
    cluster = region_cluster({"node": (4, 150, 40, 100)}, 1.0, name="one-class")
    ev = Evaluator(cluster, Workload.from_preset("gpt2-medium"))
    cand = HeuristicPlanner().best_candidate(ev)
    calls = ev.calls
    assert order_classes(ev, cand) is cand and ev.calls == calls
