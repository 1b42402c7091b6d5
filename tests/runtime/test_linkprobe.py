"""In-band link measurement: the pairs a plan uses, spec figures, the cluster as measured, and runs
that find a network other than their spec says (and, with --adapt, re-plan on it)."""

from __future__ import annotations

import json
import shlex
import sys
from types import SimpleNamespace

import pytest
from runtime_helpers import CLUSTER, MODEL, plan, rewrite_after_step, run_ranks, spantrain, spantrain_here

from spantrain.cluster import Cluster
from spantrain.runtime.emulator import netns
from spantrain.runtime.linkprobe import (
    GBPS,
    LinkFigure,
    PairMeasurement,
    link_figures,
    links_message,
    measured_cluster,
    plan_pairs,
    sync_rings,
)

# Two pipelines of two stages; each stage pair crosses the slow link between the regions.
CROSSING = [(1, 5, [("a-0", 0, 3), ("b-0", 3, 6)]), (1, 5, [("a-1", 0, 3), ("b-1", 3, 6)])]
SPEC = {**CLUSTER, "network": {"regions": {"r1": {"gbps": 0.5, "latency_ms": 1}, "r2": {"gbps": 0.5, "latency_ms": 1}},
                               "default": {"gbps": 0.05, "latency_ms": 20}}}


def _slow(spec: dict, gbps: float) -> dict:
    return {**spec, "network": {**spec["network"], "default": {"gbps": gbps, "latency_ms": 20}}}


def test_a_plan_uses_its_stage_neighbours_and_its_sync_rings():
    # pipelines by rank in stage order; holder groups of the layers
    assert plan_pairs([[0, 1, 2], [3, 4]], [(0, 3), (1, 4), (2, 4), (5,)]) == [(0, 1), (0, 3), (1, 2), (1, 4), (2, 4),
                                                                               (3, 4)]
    assert plan_pairs([[2, 0]], [(0, 1, 2)]) == [(0, 1), (0, 2), (1, 2)]  # a ring of three closes on itself


def test_hierarchical_sync_crosses_regions_only_between_leaders():
    from spantrain.runtime.sync import HolderGroup

    flat = HolderGroup(ranks=(0, 1, 2, 3), layers=(0,))
    # regions r1 = {0, 1}, r2 = {2, 3}: sums inside each, then between leaders 0 and 2
    tiered = HolderGroup(ranks=(0, 1, 2, 3), layers=(0,), region_ranks={"r1": (0, 1), "r2": (2, 3)},
                         leaders=(0, 2))
    assert plan_pairs([], sync_rings([flat])) == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert plan_pairs([], sync_rings([tiered])) == [(0, 1), (0, 2), (2, 3)]


def test_measurements_become_spec_figures_and_the_changed_links_overrides():
    cluster = Cluster.from_spec(SPEC, "c")
    ranks = {0: "a-0", 1: "b-0", 2: "a-1"}
    measured = [PairMeasurement(a=0, b=1, latency_s=0.0203, a_to_b=0.0049 * GBPS, b_to_a=0.0051 * GBPS),
                PairMeasurement(a=0, b=2, latency_s=0.0011, a_to_b=0.45 * GBPS, b_to_a=0.55 * GBPS)]
    slow, lan = link_figures(measured, ranks, cluster)
    assert (slow.a, slow.b, slow.spec_gbps, slow.spec_latency_ms) == ("a-0", "b-0", 0.05, 20.0)
    assert slow.gbps == pytest.approx(0.0049) and slow.changed  # 10x slower (the slower direction)
    assert lan.gbps == pytest.approx(0.45) and not lan.changed  # 1.1 ms against 1 ms: a message's own cost
    # under the emulator, rates are the spec's scaled: 0.25 Gbit/s measured where 0.25 was set for 0.5
    emulation = SimpleNamespace(spec_gbps=[[None, 0.05, 0.5], [0.05, None, 0.05], [0.5, 0.05, None]],
                                emulated_gbps=[[None, 0.025, 0.25], [0.025, None, 0.025], [0.25, 0.025, None]])
    scaled = [PairMeasurement(a=0, b=2, latency_s=0.001, a_to_b=0.25 * GBPS, b_to_a=0.25 * GBPS)]
    assert link_figures(scaled, ranks, cluster, emulation)[0].gbps == pytest.approx(0.5)
    # latency counts as changed at 2x and a millisecond more
    assert LinkFigure(a="x", b="y", gbps=1, latency_ms=45, spec_gbps=1, spec_latency_ms=20).changed
    assert not LinkFigure(a="x", b="y", gbps=1, latency_ms=0.5, spec_gbps=1, spec_latency_ms=0.02).changed

    now = measured_cluster(cluster, [slow, lan])
    i, j, k = now.index("a-0"), now.index("b-0"), now.index("a-1")
    assert float(now.bandwidth[i, j]) / GBPS == pytest.approx(0.0049, rel=1e-3)
    assert float(now.bandwidth[i, k]) == float(cluster.bandwidth[i, k])  # unchanged links keep the spec
    assert float(now.bandwidth[now.index("b-1"), j]) == float(cluster.bandwidth[now.index("b-1"), j])
    # the link between the regions is one in the spec: its pairs the plan does not use slow down alike
    assert float(now.bandwidth[k, now.index("b-1")]) / GBPS == pytest.approx(0.0049, rel=1e-3)
    assert now.to_spec()["network"]["links"] == [{"between": ["r1", "r2"], "gbps": 0.0049, "latency_ms": 20.3}]
    again = measured_cluster(now, [LinkFigure(a="b-0", b="a-0", gbps=0.04, latency_ms=20, spec_gbps=0.0049,
                                              spec_latency_ms=20)])
    # a pair measured anew replaces its figures (to_spec drops an override the regions' link now gives)
    assert float(again.bandwidth[i, j]) / GBPS == pytest.approx(0.04, rel=1e-3)
    assert again.to_spec()["network"]["links"] == [{"between": ["r1", "r2"], "gbps": 0.04, "latency_ms": 20}]
    # a profiled spec's one-way overrides ({from, to}: `spantrain profile` writes them) were a KeyError
    one_way = {**SPEC, "network": {**SPEC["network"], "overrides": [
        {"from": "a-0", "to": "b-0", "gbps": 0.06, "latency_ms": 20}, {"from": "b-0", "to": "a-0", "gbps": 0.04,
                                                                      "latency_ms": 21},
        {"from": "a-0", "to": "a-1", "gbps": 0.7, "latency_ms": 1}]}}
    profiled = measured_cluster(Cluster.from_spec(one_way, "c"), [slow])
    assert float(profiled.bandwidth[i, j]) / GBPS == pytest.approx(0.0049, rel=1e-3)  # both directions replaced
    assert float(profiled.bandwidth[j, i]) / GBPS == pytest.approx(0.0049, rel=1e-3)
    assert float(profiled.bandwidth[i, k]) / GBPS == pytest.approx(0.7)  # the unmeasured one kept
    # held against the spec's slower direction, as the measured figure is the slower one's: a spec
    # 300x too slow one way (the way the plan's activations went) read "within 2x" of its other way
    lopsided = {**SPEC, "network": {**SPEC["network"], "overrides": [
        {"from": "a-0", "to": "b-0", "gbps": 11, "latency_ms": 1}, {"from": "b-0", "to": "a-0", "gbps": 0.05,
                                                                   "latency_ms": 1}]}}
    (fig,) = link_figures([PairMeasurement(a=0, b=1, latency_s=0.001, a_to_b=15 * GBPS, b_to_a=15 * GBPS)], ranks,
                          Cluster.from_spec(lopsided, "c"))
    assert fig.spec_gbps == pytest.approx(0.05) and fig.changed


def test_the_note_says_what_changed_and_what_to_do():
    event = {"step": 7, "reason": "drift", "measure_s": 2.5, "cluster": "run/cluster-measured.json",
             "links": [LinkFigure(a="a-0", b="b-0", gbps=0.0005, latency_ms=20.4, spec_gbps=0.05,
                                  spec_latency_ms=20).to_dict()]}
    text = links_message(event)
    assert text.startswith("measured the plan's 1 link(s) after iteration 7 (iterations drifted) in 2.5 s: "
                           "a-0 <-> b-0 0.5 Mbit/s, 20.4 ms (spec 50 Mbit/s, 20 ms; changed)")
    assert "spantrain plan --cluster run/cluster-measured.json --model MODEL --from PLAN -o NEW.json" in text
    # the plan file the run writes (a run given --planner had none to name), and the run's model
    # and batch: the command printed without --model failed on the missing flag
    assert links_message({**event, "plan": "run/plan.json", "model": "/w s/m.yaml", "global_batch": 64}).endswith(
        "re-plan on it with spantrain plan --cluster run/cluster-measured.json --model '/w s/m.yaml' --global-batch "
        "64 --from run/plan.json -o NEW.json, then spantrain run --resume --plan NEW.json")
    assert links_message(event, adapting=True).endswith("and this run re-plans on it")
    # a run without checkpoints has nothing to --resume
    assert links_message({**event, "checkpoints": False}).endswith(
        "then run NEW.json (this run keeps no checkpoints: add --checkpoint-dir to continue it on another plan)")
    assert links_message({**event, "cluster": None}).endswith(": all within 2x of the spec")


def _inputs(tmp_path, spec=SPEC):
    paths = {}
    for name, obj in (("cluster", spec), ("model", MODEL), ("plan", plan("1f1b", "allreduce", CROSSING))):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(obj))
    return paths


def _events(run_dir, name):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e.get("event") == name]


@pytest.mark.slow
def test_a_run_on_the_network_its_spec_describes_finds_every_link_as_specified(tmp_path):
    p = _inputs(tmp_path)
    code, _, err = spantrain_here("run", "--cluster", str(p["cluster"]), "--model", str(p["model"]), "--plan",
                                  str(p["plan"]), "--steps", "3", "--emulate", "--emulate-mode", "local",
                                  "--measure-links", "--run-dir", str(tmp_path / "run"), "--no-progress")
    assert code == 0, err
    (links,) = _events(tmp_path / "run", "links")
    assert links["reason"] == "start" and links["step"] == 1 and links["cluster"] is None
    assert {(f["a"], f["b"]) for f in links["links"]} == {("a-0", "b-0"), ("a-1", "b-1"), ("a-0", "a-1"),
                                                           ("b-0", "b-1")}
    for f in links["links"]:  # the fallback emulates bandwidth in the transport: measured as set (give or take
        # the loopback copy and a busy machine's scheduling)
        assert f["gbps"] == pytest.approx(f["spec_gbps"], rel=0.3) and not f["changed"], f
    assert "all within 2x of the spec" in err and not (tmp_path / "run" / "cluster-measured.json").exists()


def test_the_re_plan_command_a_run_gives_runs_for_a_plan_of_another_batch_than_the_models(tmp_path):
    # a plan of 8 samples for a model whose global batch is 10: the printed `plan --from` command
    # lacked --global-batch 8 and was refused ("the running plan's batch is 8 samples but ... 10")
    p = _inputs(tmp_path)
    p["plan"].write_text(json.dumps(plan("1f1b", "allreduce", [(1, 4, stages) for _, _, stages in CROSSING])))
    network = tmp_path / "network.json"
    network.write_text(json.dumps(_slow(SPEC, 0.005)))
    code, _, err = spantrain_here("run", "--cluster", str(p["cluster"]), "--model", str(p["model"]), "--plan",
                                  str(p["plan"]), "--steps", "2", "--emulate", "--emulate-mode", "local",
                                  "--emulate-network", str(network), "--measure-links", "--run-dir",
                                  str(tmp_path / "run"), "--no-progress")
    assert code == 0, err
    command = err.split("re-plan on it with ")[1].split(", then ")[0].replace("NEW.json", str(tmp_path / "new.json"))
    assert " --global-batch 8 " in command, command
    program, *args = shlex.split(command)
    assert program == "spantrain", command
    code, _, err = spantrain_here(*args)  # in this process: a fresh one spent 3 s importing
    assert code == 0, err


@pytest.mark.slow
def test_a_run_whose_spec_is_out_of_date_writes_the_cluster_as_measured(tmp_path):
    """Under `spantrain emulate` the run is a torchrun-style job on the slower network it was not told of."""
    p = _inputs(tmp_path)
    network = tmp_path / "network.json"
    network.write_text(json.dumps(_slow(SPEC, 0.005)))
    rank_map = tmp_path / "ranks.json"
    rank_map.write_text(json.dumps(["a-0", "a-1", "b-0", "b-1"]))  # the emulator's device order
    proc = spantrain("emulate", "--cluster", str(network), "--mode", "local", "--", sys.executable, "-m", "spantrain",
                     "run", "--cluster", str(p["cluster"]), "--model", str(p["model"]), "--plan", str(p["plan"]),
                     "--steps", "3", "--measure-links", "--rank-map", str(rank_map), "--run-dir",
                     str(tmp_path / "run"), env={"WANDB_MODE": "offline"})
    assert proc.returncode == 0, proc.stderr
    (links,) = _events(tmp_path / "run", "links")
    by_pair = {(f["a"], f["b"]): f for f in links["links"]}
    assert by_pair[("a-0", "b-0")]["changed"] and by_pair[("a-0", "b-0")]["gbps"] == pytest.approx(0.005, rel=0.15)
    assert not by_pair[("a-0", "a-1")]["changed"]
    measured = Cluster.from_file(tmp_path / "run" / "cluster-measured.json")
    i, j = measured.index("a-0"), measured.index("b-0")
    assert float(measured.bandwidth[i, j]) / GBPS == pytest.approx(0.005, rel=0.15)
    assert f"the cluster as measured is in {tmp_path / 'run' / 'cluster-measured.json'}" in proc.stderr
    # the command the note gives runs as printed
    command = proc.stderr.split("re-plan on it with ")[1].split(", then ")[0].replace("NEW.json",
                                                                                     str(tmp_path / "new.json"))
    assert command.startswith("spantrain plan ")
    program, *args = shlex.split(command)
    assert program == "spantrain", command
    code, _, err = spantrain_here(*args)  # in this process: a fresh one spent 3 s importing
    assert code == 0, err


@pytest.mark.slow
def test_a_one_device_plan_measures_nothing_and_its_drift_note_does_not_promise_it(tmp_path, monkeypatch):
    from spantrain.runtime import launcher

    p = _inputs(tmp_path)
    p["plan"].write_text(json.dumps(plan("1f1b", "allreduce", [(1, 10, [("a-0", 0, 6)])])))
    seen = []

    class Progress(launcher._Progress):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen.append(self.measuring)

    monkeypatch.setattr(launcher, "_Progress", Progress)
    code, _, err = spantrain_here("run", "--cluster", str(p["cluster"]), "--model", str(p["model"]), "--plan",
                                  str(p["plan"]), "--steps", "2", "--emulate", "--emulate-mode", "local",
                                  "--measure-links", "--run-dir", str(tmp_path / "run"), "--no-progress")
    assert code == 0, err
    assert not _events(tmp_path / "run", "links") and seen == [False]


_STOPPING_RANK = """
import sys, time, torch, torch.distributed as dist
from spantrain.runtime.linkprobe import measure_links
from spantrain.runtime.transport import Transport
rank = int(sys.argv[1])
transport = Transport.init(rank=rank, world_size=2, init_method="file://" + sys.argv[2], timeout_s=60, local_rank=0)
calls = []
def stop():  # rank 1 is asked to stop while the first pair is measured
    calls.append(1)
    return rank == 1 and len(calls) > 1
t0 = time.perf_counter()
out = measure_links(transport, [(0, 1)] * PAIRS, rank, stop=stop)
print(out is None, len(calls), round(time.perf_counter() - t0, 1))
transport.close()
"""


@pytest.mark.parametrize("pairs", [5, 1])
def test_a_stop_request_cuts_the_measurement_short_on_every_rank_at_the_same_pair(tmp_path, pairs):
    outs = run_ranks(_STOPPING_RANK.replace("PAIRS", str(pairs)), tmp_path / "store")
    # both left before the second of five pairs, rank 0, not asked, too; or after the only pair (its result
    # was discarded: the run stops there all the same)
    assert [o.split()[:2] for o in outs] == [["True", "2"], ["True", "2"]], outs


def test_emulate_network_needs_emulate_and_the_plan_devices(tmp_path):
    p = _inputs(tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**SPEC, "devices": [{"id": "a", "count": 2, "region": "r1", "tflops": 1,
                                                      "memory_gb": 8}]}))
    base = ["run", "--cluster", str(p["cluster"]), "--model", str(p["model"]), "--plan", str(p["plan"]), "--steps",
            "3", "--run-dir", str(tmp_path / "run")]
    code, _, err = spantrain_here(*base, "--emulate-network", str(other))
    assert code == 2 and "--emulate-network sets the emulated cluster's network: add --emulate" in err, err
    code, _, err = spantrain_here(*base, "--emulate", "--emulate-network", str(other))
    assert code == 2 and f"--emulate-network {other} has no device b-0, b-1 of the plan" in err, err
    code, _, err = spantrain_here(*base, "--emulate", "--emulate-network", str(tmp_path / "gone.yaml"))
    assert code == 2 and f"--emulate-network {tmp_path / 'gone.yaml'}: file not found" in err, err


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(netns.unavailable_reason() is not None, reason="needs root, ip netns and tc htb")
def test_adapt_re_plans_on_links_it_measured_after_drift(tmp_path):
    """The network slows under the run and nobody rewrites its cluster file: drift, a measurement,
    and a switch to a plan off the slowed link (moving the far stage's state over that link
    takes about a minute: enough iterations must be left to pay for it)."""
    p = _inputs(tmp_path)
    network = tmp_path / "network.json"
    network.write_text(json.dumps(SPEC))
    run = tmp_path / "run"
    rewrite_after_step(run / "metrics.jsonl", network, 8, _slow(SPEC, 0.0001))  # 100 kbit/s: 2 KB activations crawl
    code, out, err = spantrain_here("run", "--cluster", str(p["cluster"]), "--model", str(p["model"]), "--plan",
                                    str(p["plan"]), "--steps", "60", "--checkpoint-every", "100", "--emulate",
                                    "--emulate-mode", "netns", "--emulate-network", str(network), "--adapt",
                                    "--adapt-planner", "heuristic", "--checkpoint-dir", str(tmp_path / "ckpt"),
                                    "--run-dir", str(run), "--no-progress", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert json.loads(p["cluster"].read_text()) == SPEC  # nobody told the run
    reasons = [e["reason"] for e in _events(run, "links")]
    assert reasons[:2] == ["start", "drift"], reasons  # one measurement per drift, though it was seen twice
    drifted = next(e for e in _events(run, "links") if e["reason"] == "drift")
    assert any(f["changed"] and f["gbps"] < 0.001 for f in drifted["links"]), drifted
    (switch,) = [a for a in result["adaptations"] if a["switch"]]
    assert switch["source"] == "measured" and len(result["segments"]) == 2
    assert "the links measured in-band differ from the cluster" in err
    assert result["final_step"] == 60
