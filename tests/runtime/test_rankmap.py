"""Plan devices -> ranks, and the holders of every layer."""

from __future__ import annotations

import json

import pytest
from runtime_helpers import ASYMMETRIC, CLUSTER, THREE_WAY, plan

from spantrain.cluster import Cluster
from spantrain.errors import ExecutionError
from spantrain.plan import Plan
from spantrain.runtime.rankmap import Layout, host_record, plan_order_ranks, ranks_from_file, resolve_ranks


def _cluster(records: dict[str, tuple[str, int]] | None = None) -> Cluster:
    spec = json.loads(json.dumps(CLUSTER))
    if records is not None:
        devices = []
        for d in spec["devices"]:
            for i in range(d.pop("count")):
                dev = dict(d, id=f"{d['id']}-{i}")
                if dev["id"] in records:
                    dev["host"], dev["local_rank"] = records[dev["id"]]
                devices.append(dev)
        spec["devices"] = devices
    return Cluster.from_spec(spec)


PLAN = Plan.from_dict(plan("1f1b", "allreduce", ASYMMETRIC))


def test_plan_order():
    assert plan_order_ranks(PLAN) == {"a-0": 0, "b-0": 1, "a-1": 2, "b-1": 3}
    assert resolve_ranks(PLAN, _cluster(), 4) == (plan_order_ranks(PLAN), "plan order")


def test_mapping_file_as_dict_or_list(tmp_path):
    (tmp_path / "m.json").write_text(json.dumps({"ranks": {"a-0": 3, "b-0": 2, "a-1": 1, "b-1": 0, "x": 9}}))
    assert ranks_from_file(tmp_path / "m.json", PLAN) == {"a-0": 3, "b-0": 2, "a-1": 1, "b-1": 0}
    (tmp_path / "m.yaml").write_text("[b-1, a-1, b-0, a-0]\n")
    mapping, how = resolve_ranks(PLAN, _cluster(), 4, mapping_file=str(tmp_path / "m.yaml"))
    assert mapping == {"a-0": 3, "b-0": 2, "a-1": 1, "b-1": 0} and "mapping file" in how


@pytest.mark.parametrize("content, message", [
    ({"a-0": 0, "b-0": 1, "a-1": 2}, "no rank for plan device"),
    (["a-0", "b-0", "a-1", "b-9"],
     r"no rank for plan device\(s\) b-1 \(it also ranks b-9, which the plan does not use\)"),
    ({"a-0": 0, "b-0": 0, "a-1": 2, "b-1": 3}, "ranks 0..3 once each"),
    ({"a-0": "zero"}, "expected"),
    # a model file given as the rank map: "expected {device: rank}" said nothing of what it got
    ({"global_batch": 2, "seq_len": 8, "architecture": {"family": "gpt2"}},
     r"m\.json: looks like a workload file \(it has architecture\), not a rank map: pass it as the model \(--model\)$"),
])
def test_bad_mapping_files(tmp_path, content, message):
    (tmp_path / "m.json").write_text(json.dumps(content))
    with pytest.raises(ExecutionError, match=message):
        ranks_from_file(tmp_path / "m.json", PLAN)


def test_host_and_local_rank_records():
    cluster = _cluster({"a-0": ("node1.example", 1), "b-0": ("node2", 0), "a-1": ("node1", 0), "b-1": ("node2", 1)})
    # what each torchrun process reports, in global rank order
    records = [("node2", 1), ("node1", 0), ("node2", 0), ("node1", 1)]
    mapping, how = resolve_ranks(PLAN, cluster, 4, records=records)
    assert mapping == {"b-1": 0, "a-1": 1, "b-0": 2, "a-0": 3} and how == "host/local_rank records"


def test_record_problems_are_named():
    partial = _cluster({"a-0": ("n", 0)})
    with pytest.raises(ExecutionError, match="only some plan devices"):
        resolve_ranks(PLAN, partial, 4, records=[("n", 0)] * 4)
    full = _cluster({"a-0": ("n", 0), "b-0": ("n", 1), "a-1": ("n", 2), "b-1": ("n", 3)})
    with pytest.raises(ExecutionError, match="no process runs on host 'n' with local rank 3"):
        resolve_ranks(PLAN, full, 4, records=[("n", 0), ("n", 1), ("n", 2), ("m", 3)])
    with pytest.raises(ExecutionError, match="or pass --rank-map FILE"):  # the way out, when the records do not fit
        resolve_ranks(PLAN, full, 4, records=[("n", 0), ("n", 1), ("n", 2), ("m", 3)])
    with pytest.raises(ExecutionError, match="4 devices but 3 processes"):
        resolve_ranks(PLAN, full, 3, records=[("n", 0)] * 3)


def test_host_record_reads_the_environment(monkeypatch):
    monkeypatch.setenv("SPANTRAIN_HOST", "edge-box")
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert host_record() == ("edge-box", 2)


def test_holder_sets_follow_each_pipelines_cut():
    layout = Layout(PLAN, _cluster(), plan_order_ranks(PLAN))
    # a-0 (rank 0) holds [0, 2), b-0 (1) [2, 6); a-1 (2) [0, 4), b-1 (3) [4, 6)
    assert layout.holder_sets(6) == [((0, 2), (0, 1)), ((1, 2), (2, 3)), ((1, 3), (4, 5))]
    assert layout.roles[1].region == "r2" and layout.roles[2].layers == (0, 4)
    three = Plan.from_dict(plan("1f1b", "hierarchical", THREE_WAY))
    layout = Layout(three, _cluster(), plan_order_ranks(three))
    assert layout.holder_sets(6) == [((0, 2, 3), (0, 1, 2)), ((1, 2, 3), (3, 4, 5))]
