"""Uneven twins (`spantrain.policies.uneven`): the heuristic's last step."""

from __future__ import annotations

from spantrain.env.evaluator import Evaluator, Knobs
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.policies.uneven import split_unevenly, transfers
from spantrain.profiler.topology import generate
from spantrain.workload import Workload


def test_transfers_go_by_class_counts_fewest_first_next_to_their_class():
    labels = [0, 0, 1, 1, 0, 0, 1, 1]  # devices 0-3 one pipeline, 4-7 its twin
    out = transfers((0, 1, 2, 3), (4, 5, 6, 7), labels)
    assert len(out) == 3 * 3 - 1  # 0-2 devices of each class, not none
    assert [len(r) - 4 for r, _ in out] == sorted(len(r) - 4 for r, _ in out)
    receiver, donor = out[0]
    assert receiver == (0, 1, 2, 3, 7) and donor == (4, 5, 6)  # a class-1 device joins the class-1 block
    assert out[1] == ((0, 1, 5, 2, 3), (4, 6, 7))
    assert out[-1] == ((0, 1, 4, 5, 2, 3, 6, 7), ())  # everything moved: the twins merge
    for receiver, donor in out:
        assert sorted(receiver + donor) == list(range(8))
    assert len(transfers((0, 1, 2, 3), (4, 5, 6, 7), labels, limit=3)) == 3


def test_a_plan_without_twins_is_returned_as_it_is():
    cluster = generate(8, seed=0, profile="datacenter")
    ev = Evaluator(cluster, Workload.from_preset("gpt2-medium"))
    single = ev.balance(((0, 1, 2, 3),), Knobs(micro_batch_size=1, schedule="1f1b", sync="allreduce"))
    assert split_unevenly(ev, single) is single


def test_the_heuristic_splits_twins_unevenly_where_it_pays(monkeypatch):
    # datacenter-24 seed 1487649 (an evaluation cluster), llama2-7b: without the step, two
    # 12-stage twins at 3.168 s; with it, pipelines of 17 and 7 stages at 3.081 s
    cluster = generate(24, seed=1487649, profile="datacenter")
    w = Workload.from_preset("llama2-7b")
    uneven = HeuristicPlanner().best_candidate(Evaluator(cluster, w))
    monkeypatch.setattr(HeuristicPlanner, "_uneven", lambda self, ev, best: best)
    twins = HeuristicPlanner().best_candidate(Evaluator(cluster, w))
    assert [len(p) for p in twins.layout] == [12, 12]
    assert len({len(p) for p in uneven.layout}) == len(uneven.layout) == 2
    assert uneven.time < 0.98 * twins.time
    assert sorted(d for p in uneven.layout for d in p) == sorted(d for p in twins.layout for d in p)
