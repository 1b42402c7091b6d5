"""Every planner on small clusters: valid feasible plans, the heuristic against ddp, the
optimum of exhaustive search, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_helpers import region_cluster

from spantrain.env.costmodel import CostModel
from spantrain.errors import PlannerError, SpantrainError
from spantrain.policies.compare import run_planner
from spantrain.policies.registry import available_planners, get_planner
from spantrain.profiler.topology import generate
from spantrain.workload import Workload

FAST_OPTIONS = {"ga": {"budget_s": 0.3}}


def _check_plan(cluster, workload, plan):
    plan.validate(cluster, workload)
    assert plan.batch == workload.global_batch
    assert plan.predicted is not None and plan.predicted["iteration_s"] > 0
    est = CostModel(cluster, workload).estimate(plan)
    assert est.feasible, est.reasons
    assert plan.predicted["iteration_s"] == pytest.approx(est.iteration_s)
    return est


def test_registry_lists_every_planner():
    assert set(available_planners()) >= {"heuristic", "ddp", "gpipe", "megatron", "ga", "exhaustive"}


@pytest.mark.parametrize("name", ["heuristic", "ddp", "gpipe", "megatron", "ga", "exhaustive"])
def test_each_planner_gives_a_valid_feasible_plan(name):
    cluster = generate(6, 0, "geo")
    workload = Workload.from_preset("gpt2-medium")
    plan = get_planner(name, **FAST_OPTIONS.get(name, {})).plan(cluster, workload)
    _check_plan(cluster, workload, plan)


def test_heuristic_beats_ddp_across_a_slow_link(slow_link_cluster):
    workload = Workload.from_preset("gpt2-medium")
    h = run_planner("heuristic", slow_link_cluster, workload)
    d = run_planner("ddp", slow_link_cluster, workload)
    assert h.feasible and d.feasible
    assert h.samples_per_s > 10 * d.samples_per_s
    # the gradients stay off the 100 Mbit/s link: every pipeline's replicas share a region
    regions = {slow_link_cluster.device(dev).region for dev in h.plan.devices}
    layers_per_region = {}
    for p in h.plan.pipelines:
        for st in p.stages:
            layers_per_region.setdefault(st.layers, set()).add(slow_link_cluster.device(st.device).region)
    assert len(regions) == 1 or all(len(r) == 1 for r in layers_per_region.values())


def test_heuristic_finds_a_few_fast_devices_when_their_units_links_are_slow():
    # five A100s on a 1 Gbit/s LAN, six T4s on 21.5 Gbit/s: every plan with all the A100s
    # (pipelined or data-parallel) loses to the T4 pipeline, but one A100 alone beats it,
    # and two of them in a zero-bubble pipeline beat one
    cluster = region_cluster({"cloud": (5, 140, 40, 1.0), "edge": (6, 20, 16, 21.5)}, 0.4, name="slow-cloud-lan")
    workload = Workload.from_preset("gpt2-medium")
    h = run_planner("heuristic", cluster, workload)
    t4s = run_planner("heuristic", cluster.subset([f"edge-{i}" for i in range(6)]), workload)
    one = run_planner("heuristic", cluster.subset(["cloud-0"]), workload)
    assert all(d.startswith("cloud-") for d in h.plan.devices) and len(h.plan.devices) < 5
    assert h.iteration_s < 0.8 * t4s.iteration_s  # the best the T4s do alone: their 6-stage pipeline
    assert h.iteration_s < one.iteration_s


def test_heuristic_keeps_a_short_zero_bubble_pipeline_over_a_slow_lan():
    # four A100s on a 0.5 Gbit/s LAN, gpt2-xl: data parallelism drowns in gradients and under 1F1B
    # every stage only adds bubbles, so the search sheds devices down to one (4.50 s); under ZB-H2
    # two of them beat one device, as exhaustive search finds (3.54 s)
    cluster = region_cluster({"lan": (4, 150, 40, 0.5)}, 0.5, name="slow-lan")
    workload = Workload.from_preset("gpt2-xl")
    h = run_planner("heuristic", cluster, workload)
    best = run_planner("exhaustive", cluster, workload)
    assert h.iteration_s == pytest.approx(best.iteration_s, rel=1e-6)
    assert h.plan.schedule == "zb-h2" and len(h.plan.pipelines[0].stages) == 2


def test_heuristic_lengthens_pipelines_under_gpipe_on_high_latency_links():
    # three A100s on a 100 Gbit/s, 20 ms LAN, gpt2-medium: 1F1B waits a round trip per micro-batch, so
    # under it the search keeps short pipelines (0.535 s); GPipe streams the micro-batches and one
    # pipeline through all three wins, as exhaustive search finds (0.459 s)
    cluster = region_cluster({"lan": (3, 150, 40, 100)}, 1.0, lan_latency_ms=20.0, name="far-lan")
    workload = Workload.from_preset("gpt2-medium")
    h = run_planner("heuristic", cluster, workload)
    best = run_planner("exhaustive", cluster, workload)
    assert h.iteration_s == pytest.approx(best.iteration_s, rel=1e-6)
    assert h.plan.schedule == "gpipe" and len(h.plan.pipelines[0].stages) == 3


def test_heuristic_ties_ddp_on_a_uniform_fast_cluster(uniform_cluster):
    # a small model and a big batch: gradients hide behind backward, pipelines only add bubbles
    workload = Workload.from_preset("gpt2-small", global_batch=256)
    h = run_planner("heuristic", uniform_cluster, workload)
    d = run_planner("ddp", uniform_cluster, workload)
    assert h.samples_per_s == pytest.approx(d.samples_per_s, rel=0.02)


def test_heuristic_never_far_below_baselines_on_a_uniform_cluster(uniform_cluster):
    workload = Workload.from_preset("gpt2-medium")
    h = run_planner("heuristic", uniform_cluster, workload)
    for name in ("ddp", "gpipe", "megatron"):
        assert h.samples_per_s >= 0.98 * run_planner(name, uniform_cluster, workload).samples_per_s


@pytest.mark.parametrize("profile, n, seed, model", [
    ("cee", 6, 1, "gpt2-medium"),
    ("geo", 6, 1, "gpt2-xl"),
    ("datacenter", 6, 0, "gpt2-medium"),
])
def test_exhaustive_is_never_beaten(profile, n, seed, model):
    cluster = generate(n, seed, profile)
    workload = Workload.from_preset(model)
    best = run_planner("exhaustive", cluster, workload)
    assert best.feasible
    _check_plan(cluster, workload, best.plan)
    for name in ("heuristic", "ddp", "gpipe", "megatron", "ga"):
        other = run_planner(name, cluster, workload, **FAST_OPTIONS.get(name, {}))
        assert other.samples_per_s <= best.samples_per_s * (1 + 1e-9), name


def test_exhaustive_refuses_large_clusters():
    with pytest.raises(PlannerError, match="at most 8"):
        get_planner("exhaustive").plan(generate(9, 0, "datacenter"), Workload.from_preset("gpt2-small"))
    # compare keys results by planner name: the reason does not repeat it ("exhaustive: exhaustive: ...")
    result = run_planner("exhaustive", generate(9, 0, "datacenter"), Workload.from_preset("gpt2-small"))
    assert result.reason.startswith("cluster ") and "at most 8" in result.reason


# ---- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["heuristic", "exhaustive", "ga"])
def test_model_that_fits_nowhere_is_a_clear_error(name):
    cluster = region_cluster({"lab": (2, 12, 12, 10)}, 1.0, name="small")
    with pytest.raises(PlannerError) as err:
        get_planner(name, **FAST_OPTIONS.get(name, {})).plan(cluster, Workload.from_preset("llama2-7b"))
    msg = str(err.value)
    assert "llama2-7b" in msg and "largest device" in msg and "12.0 GB" in msg and "add devices" in msg


@pytest.mark.parametrize("name", ["ppo", "auto"])
def test_the_learned_planners_errors_are_their_own(name):
    # "heuristic: model 'llama2-7b' fits nowhere ...", for a user who asked for ppo
    cluster = region_cluster({"lab": (2, 12, 12, 10)}, 1.0, name="small")
    with pytest.raises(PlannerError) as err:
        get_planner(name).plan(cluster, Workload.from_preset("llama2-7b"))
    assert str(err.value).startswith(f"{name}: model 'llama2-7b' fits nowhere"), str(err.value)


def test_constants_that_reserve_more_than_any_device_has_are_named():
    # "add devices or devices with more memory": no device could help, the profile was at fault
    from spantrain.env.calibration import Calibration
    from spantrain.planner import plan_with

    cluster = region_cluster({"lab": (2, 12, 40, 10)}, 1.0, name="small")
    with pytest.raises(PlannerError) as err:
        plan_with(get_planner("heuristic"), cluster, Workload.from_preset("tiny-gpt"), Calibration(reserved_bytes=1e12))
    assert str(err.value) == ("heuristic: the cost-model constants reserve 1000.0 GB on every device, and the largest "
                              "device of cluster 'small' has 40.0 GB: nothing is left for the model; check "
                              "reserved_bytes in the --calibration profile")


def test_ga_says_at_once_that_a_model_fits_nowhere():
    """Without a search: ga spent its whole budget (10 s by default) before saying so."""
    cluster = region_cluster({"lab": (2, 12, 12, 10)}, 1.0, name="small")
    planner = get_planner("ga", budget_s=600)
    with pytest.raises(PlannerError, match="fits nowhere"):
        planner.plan(cluster, Workload.from_preset("llama2-7b"))
    assert not planner.stats  # no generation ran


def test_ga_searches_a_model_that_fits_only_cut_into_few_stages():
    """Its first up-front check took a cut over every device, 1F1B-full, as a lower bound: with
    activations this large, 8 stages need 72 GB where fewer, or a batch of 2 in flight, fit 40."""
    cluster = region_cluster({"r": (8, 150, 40, 100)}, 1.0, name="eight")
    heavy = Workload.from_spec({"name": "actheavy", "global_batch": 2, "seq_len": 128, "layers": [
        {"name": "l", "count": 8, "forward_flops": 1e12, "params": 1_000_000, "boundary_bytes": 1e6,
         "activation_bytes": 8e9}]}, "w")
    plan = get_planner("ga", budget_s=0.3).plan(cluster, heavy)
    assert CostModel(cluster, heavy).estimate(plan).feasible


@pytest.mark.parametrize("name", ["ddp", "gpipe", "megatron"])
def test_baselines_return_their_plan_marked_infeasible(name):
    cluster = region_cluster({"lab": (2, 12, 12, 10)}, 1.0, name="small")
    r = run_planner(name, cluster, Workload.from_preset("llama2-7b"))
    assert r.plan is not None and not r.feasible and "needs" in r.reason


@pytest.mark.parametrize("name", ["heuristic", "ddp", "gpipe", "megatron", "ga", "exhaustive"])
def test_single_device_gives_a_one_stage_plan(name):
    cluster = region_cluster({"solo": (1, 150, 80, 100)}, 1.0, name="solo")
    workload = Workload.from_preset("gpt2-medium")
    plan = get_planner(name, **FAST_OPTIONS.get(name, {})).plan(cluster, workload)
    _check_plan(cluster, workload, plan)
    assert len(plan.pipelines) == 1 and len(plan.pipelines[0].stages) == 1


def test_disconnected_region_is_left_out():
    cluster = region_cluster({"main": (4, 140, 40, 100), "island": (2, 400, 80, 100)}, 1e-6,
                             cross_latency_ms=500, name="island")
    workload = Workload.from_preset("gpt2-medium")
    for name in ("heuristic", "exhaustive"):
        plan = get_planner(name).plan(cluster, workload)
        regions = {cluster.device(d).region for d in plan.devices}
        assert len(regions) == 1, (name, plan.devices)


def test_local_sgd_only_when_allowed():
    # two pairs of A100s 1 Gbit/s apart: averaging every few steps beats syncing every step
    cluster = region_cluster({"west": (2, 140, 40, 100), "east": (2, 140, 40, 100)}, 1.0, name="wan")
    workload = Workload.from_preset("gpt2-medium")
    for name in ("heuristic", "exhaustive", "auto"):  # auto, the default planner: its heuristic's plan
        strict = run_planner(name, cluster, workload)
        loose = run_planner(name, cluster, workload, allow_local_sgd=True)
        assert strict.plan.sync.mode != "local-sgd"
        assert loose.plan.sync.mode == "local-sgd" and loose.samples_per_s >= strict.samples_per_s


@pytest.mark.parametrize("name, options, field", [
    ("heuristic", {"tune_top": 0}, "tune_top"),
    ("heuristic", {"allow_local_sgd": "yes"}, "allow_local_sgd"),
    ("ga", {"budget_s": -1}, "budget_s"),
    ("ga", {"population": 2}, "population"),
    ("exhaustive", {"max_devices": 9}, "max_devices"),
    ("heuristic", {"bogus": 1}, "bogus"),
])
def test_bad_options_name_the_field(name, options, field):
    with pytest.raises(PlannerError, match=field):
        get_planner(name, **options)


@pytest.mark.parametrize("name, options, message", [
    # numpy's "expected non-negative integer" mid-plan, and torch's "Overflow when unpacking long long"
    ("ga", {"seed": -1}, "ga: seed must be an integer from 0 to 4294967295, got -1"),
    ("ppo", {"seed": 2**70}, f"ppo: seed must be an integer from 0 to 4294967295, got {2**70}"),
    # every bad option at once, not the first alone
    ("ga", {"budget_s": 0, "seed": -1, "population": 2}, "ga: budget_s must be a number of seconds in (0, 86400], "
                                                         "got 0; seed must be an integer from 0 to 4294967295, got -1; "
                                                         "population must be an integer >= 4, got 2"),
    ("heuristic", {"allow_local_sgd": "yes", "repick": 0}, "heuristic: allow_local_sgd must be true or false, got "
                                                           "'yes'; repick must be a positive integer, got 0"),
    ("exhaustive", {"allow_local_sgd": 1, "max_devices": 0}, "exhaustive: allow_local_sgd must be true or false, got "
                                                             "1; max_devices must be an integer from 1 to 8, got 0"),
])
def test_bad_seeds_are_refused_and_every_bad_option_named(name, options, message):
    with pytest.raises(SpantrainError) as err:
        get_planner(name, **options)
    assert str(err.value) == message


def test_heuristic_search_runs_without_garbage_collections(monkeypatch):
    # a full collection with torch loaded costs ~0.3 s, a third of a 64-device plan's budget
    import contextlib
    import gc

    from spantrain.env.evaluator import Evaluator
    from spantrain.planner import gc_paused
    from spantrain.policies import heuristic

    cluster = generate(16, 3, "datacenter")
    workload = Workload.from_preset("gpt2-medium")
    ev = Evaluator(cluster, workload)
    events: list = []

    def count(phase, info):
        if phase == "start":
            events.append(info["generation"])

    @contextlib.contextmanager
    def marked():
        with gc_paused():
            yield
            events.append("search done")  # collections after this come from re-enabling the collector

    monkeypatch.setattr(heuristic, "gc_paused", marked)
    gc.callbacks.append(count)
    try:
        best = heuristic.HeuristicPlanner().best_candidate(ev)
        gc.collect()
    finally:
        gc.callbacks.remove(count)
    _check_plan(cluster, workload, ev.to_plan(best))
    assert events.index("search done") == 0 and len(events) >= 2 and gc.isenabled()


@pytest.mark.parametrize("name", ["heuristic", "ddp", "gpipe", "megatron", "ga", "exhaustive", "ppo", "auto"])
def test_a_planner_given_a_path_or_a_name_says_what_it_needs(name):
    # a spec path for the cluster or a preset name for the workload was an AttributeError from inside
    from spantrain.cluster import Cluster
    from spantrain.errors import SpecError, WorkloadError
    from spantrain.policies.registry import get_planner
    from spantrain.workload import Workload
    root = Path(__file__).parents[2]
    cluster, workload = Cluster.from_file(root / "examples/cee-demo.yaml"), Workload.from_preset("tiny-gpt")
    with pytest.raises(SpecError, match="cluster must be a Cluster"):
        get_planner(name).plan(str(root / "examples/cee-demo.yaml"), workload)
    with pytest.raises(WorkloadError, match="workload must be a Workload"):
        get_planner(name).plan(cluster, "tiny-gpt")
    with pytest.raises(SpecError, match="calibration must be"):
        get_planner(name).plan(cluster, workload, "calibration.yaml")


def test_get_planner_names_a_name_that_is_no_string():
    # get_planner(["heuristic"]) was a TypeError (unhashable list)
    with pytest.raises(PlannerError, match="unknown planner"):
        get_planner(["heuristic"])
