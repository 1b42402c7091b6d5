from __future__ import annotations

import json
from pathlib import Path

import pytest

from spantrain.cluster import Cluster
from spantrain.errors import MAX_PROBLEMS_SHOWN, PlanError, SpecError, WorkloadError
from spantrain.plan import Pipeline, Plan, Stage, Sync
from spantrain.workload import Workload

W = Workload.from_preset("gpt2-medium")  # 26 layers


def _plan(**overrides) -> Plan:
    base = dict(schedule="zb-h1", sync=Sync(mode="hierarchical"), pipelines=(
        Pipeline(micro_batch_size=2, num_micro_batches=8, stages=(
            Stage(devices=("cloud-0",), layers=(0, 14)), Stage(devices=("edge-0",), layers=(14, 26)))),
        Pipeline(micro_batch_size=4, num_micro_batches=4, stages=(
            Stage(devices=("cloud-1",), layers=(0, 26)),)),
    ), predicted={"iteration_s": 1.9, "samples_per_s": 16.8})
    base.update(overrides)
    return Plan(**base)


def test_plan_round_trips_through_json(tmp_path):
    plan = _plan()
    assert Plan.from_json(plan.to_json()) == plan
    plan.save(tmp_path / "p.json")
    assert Plan.from_file(tmp_path / "p.json") == plan
    assert plan.batch == 2 * 8 + 4 * 4
    assert plan.stage_of("edge-0") == (0, 1) and plan.stage_of("end-0") is None


@pytest.mark.parametrize("out, message", [
    (None, "cannot save the plan: expected the path of a file, got None; pass one such as plan.json"),
    ("TMP", "cannot save the plan to TMP: it is a directory; pass the path of a file in it, such as TMP/plan.json"),
    ("TMP/missing/p.json", "cannot save the plan to TMP/missing/p.json: its directory TMP/missing does not exist; "
                           "create it first, or pass a path in an existing directory"),
])
def test_save_to_a_path_it_cannot_write_is_one_plan_error(tmp_path, out, message):
    # were a TypeError, an IsADirectoryError and a FileNotFoundError, none naming what to do
    out = out.replace("TMP", str(tmp_path)) if out else out
    with pytest.raises(PlanError) as err:
        _plan().save(out)
    assert str(err.value) == message.replace("TMP", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_the_model_a_plan_names_round_trips_and_must_be_a_name(tmp_path):
    plan = _plan(model="gpt2-medium")
    assert plan.to_dict()["model"] == "gpt2-medium" and Plan.from_json(plan.to_json()) == plan
    assert "model" not in _plan().to_dict()  # a plan that names none writes none (DESIGN.md's form)
    assert plan.made_for_other(W) is None and plan.layers_covered == 26
    assert plan.made_for_other(Workload.from_preset("bert-large")) == "gpt2-medium"
    assert _plan().made_for_other(Workload.from_preset("bert-large")) is None
    for bad in ("", 3):
        with pytest.raises(PlanError, match="model must be the name of the workload the plan was made for"):
            Plan.from_dict({**plan.to_dict(), "model": bad})


def test_planners_name_the_model_in_their_plans(demo_spec):
    from spantrain.planner import plan_with
    from spantrain.policies.registry import get_planner

    plan = plan_with(get_planner("heuristic"), Cluster.from_spec(demo_spec), W)
    assert plan.model == "gpt2-medium"


def test_design_example_parses_and_validates(demo_spec):
    text = ('{"schedule": "zb-h1", "sync": {"mode": "hierarchical", "period": 1}, "pipelines": ['
            '{"micro_batch_size": 2, "num_micro_batches": 8, "stages": [{"devices": ["cloud-0"], "layers": [0, 14]},'
            '{"devices": ["edge-0"], "layers": [14, 26]}]}], "predicted": {"iteration_s": 1.9, "samples_per_s": 16.8}}')
    plan = Plan.from_json(text)
    plan.validate(Cluster.from_spec(demo_spec), W)


def test_validate_reports_every_problem_at_once(demo_spec):
    c = Cluster.from_spec(demo_spec)
    bad = _plan(schedule="pipedream", sync=Sync(mode="gossip", period=0), pipelines=(
        Pipeline(micro_batch_size=0, num_micro_batches=-1, stages=(
            Stage(devices=("cloud-0",), layers=(0, 10)), Stage(devices=("gpu-9",), layers=(12, 20)))),
        Pipeline(micro_batch_size=1, num_micro_batches=1, stages=(
            Stage(devices=("cloud-0",), layers=(0, 26)), Stage(devices=("edge-0", "end-0"), layers=(20, 26)))),
        Pipeline(micro_batch_size=1, num_micro_batches=1, stages=()),
    ))
    with pytest.raises(PlanError) as err:
        bad.validate(c, W)
    problems = err.value.problems
    text = " | ".join(problems)
    for expected in ["schedule 'pipedream' is unknown", "sync mode 'gossip' is unknown",
                     "sync period must be a positive integer", "micro_batch_size must be a positive integer",
                     "num_micro_batches must be a positive integer", "unknown device 'gpu-9'",
                     "layers [10, 12) are not covered", "layers [20, 26) are not covered",
                     "device 'cloud-0' is already used", "layers [20, 26) are covered twice",
                     "needs exactly one device", "pipeline 2: has no stages"]:
        assert expected in text, f"missing: {expected}\n{text}"


def test_stages_out_of_order_are_named_as_such():
    # every layer once, in the wrong order: it read "layers [3, 5) are not covered; ... covered twice"
    swapped = _plan(pipelines=(Pipeline(micro_batch_size=1, num_micro_batches=1, stages=(
        Stage(devices=("cloud-0",), layers=(0, 3)), Stage(devices=("cloud-1",), layers=(5, 26)),
        Stage(devices=("cloud-2",), layers=(3, 5)))),))
    assert swapped.problems(workload=W) == [
        "pipeline 0: stages are out of order: the layer ranges must follow each other from stage 0 to the last (a "
        "stage's place is its place in the pipeline); in order: stage 0 [0, 3), stage 2 [3, 5), stage 1 [5, 26)"]
    # a gap is still a gap, and a device twice in one stage is not "already used" by itself
    gap = _plan(pipelines=(Pipeline(micro_batch_size=1, num_micro_batches=1, stages=(
        Stage(devices=("cloud-0", "cloud-0"), layers=(4, 26)), Stage(devices=("cloud-1",), layers=(0, 3)))),))
    problems = gap.problems(workload=W)
    assert not any("out of order" in p or "already used" in p for p in problems), problems
    assert "pipeline 0 stage 0: needs exactly one device, got 2 (multi-device stages are not supported yet)" in problems


def test_layer_range_past_the_model_and_period_without_local_sgd():
    plan = _plan(sync=Sync(mode="allreduce", period=4), pipelines=(
        Pipeline(micro_batch_size=1, num_micro_batches=1, stages=(Stage(devices=("a",), layers=(0, 30)),)),))
    problems = plan.problems(workload=W)
    assert any("goes past the model's 26 layers" in p for p in problems)
    assert any("needs mode local-sgd" in p for p in problems)
    assert _plan(sync=Sync(mode="local-sgd", period=4)).problems(workload=W) == []


@pytest.mark.parametrize("text, message", [
    ('{"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1, "stages": [{"devices": ["a"], '
     '"layers": [0]}]}]}', "layers must be \\[start, end\\] integers"),
    ('{"pipelines": [], "colour": 1}', "unknown key 'colour'"),
    ('{"schedule": "1f1b"}', "missing required key 'pipelines'"),
    ('[1, 2]', "expected a JSON object"),
    ('{"pipelines": [', "JSON syntax error"),
])
def test_malformed_plan_json(text, message):
    with pytest.raises(PlanError, match=message):
        Plan.from_json(text)


def test_negative_layer_start_is_named():
    plan = _plan(pipelines=(Pipeline(micro_batch_size=1, num_micro_batches=1, stages=(
        Stage(devices=("a",), layers=(-1, 14)), Stage(devices=("b",), layers=(14, 26)))),))
    assert plan.problems(workload=W) == ["pipeline 0 stage 0: layer range [-1, 14) starts below 0 "
                                         "(layers are numbered from 0)"]


def test_plan_file_problems_are_one_line(tmp_path):
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00x")
    with pytest.raises(PlanError, match=r"bin\.json: not a UTF-8 text file"):
        Plan.from_file(binary)
    plan = Plan.from_json('{"pipelines": [{"micro_batch_size": "2", "num_micro_batches": 1, "stages": []}]}')
    assert ("pipeline 0: micro_batch_size must be a positive integer, got the string '2' (write the number "
            "without quotes)") in plan.problems()
    # a whole number as a float (a script's 2.0): said as such, with the integer to write
    plan = Plan.from_json('{"pipelines": [{"micro_batch_size": 2.0, "num_micro_batches": 1, "stages": []}]}')
    assert "pipeline 0: micro_batch_size must be a positive integer, got 2.0 (write 2)" in plan.problems()


def test_a_batch_beyond_the_limit_is_named_before_the_cost_model_allocates_for_it():
    from spantrain.env.costmodel import CostModel
    from spantrain.workload import MAX_GLOBAL_BATCH

    plan = _plan(pipelines=(Pipeline(micro_batch_size=2, num_micro_batches=10**9, stages=(
        Stage(devices=("a",), layers=(0, 14)), Stage(devices=("b",), layers=(14, 26)))),))
    message = f"the plan's batch is {2 * 10**9} samples, more than the {MAX_GLOBAL_BATCH} a plan may have"
    assert plan.problems(workload=W) == [message]
    cluster = Cluster.from_spec({"name": "two", "devices": [{"id": "a", "region": "r", "tflops": 10, "memory_gb": 16},
                                                            {"id": "b", "region": "r", "tflops": 10, "memory_gb": 16}],
                                 "network": {"regions": {"r": {"gbps": 10, "latency_ms": 0.1}}}})
    with pytest.raises(PlanError, match="more than the 65536"):
        CostModel(cluster, W).flatten(plan)
    with pytest.raises(WorkloadError, match="at most 65536 samples"):
        W.with_global_batch(MAX_GLOBAL_BATCH + 1)


def test_a_sync_period_beyond_the_limit_is_named_before_the_cost_model_runs(tmp_path):
    # 10**23 passed every check and failed inside the compiled kernel (64-bit integers): a traceback
    from spantrain.plan import MAX_SYNC_PERIOD

    path = tmp_path / "p.json"
    plan = _plan(sync=Sync(mode="local-sgd", period=10**23))
    path.write_text(plan.to_json())
    with pytest.raises(PlanError) as err:
        Plan.from_file(path)
    assert str(err.value) == f"{path}: sync period must be at most {MAX_SYNC_PERIOD} iterations, got {10**23}"
    assert plan.problems(workload=W) == [f"sync period must be at most {MAX_SYNC_PERIOD} iterations, got {10**23}"]
    assert _plan(sync=Sync(mode="local-sgd", period=MAX_SYNC_PERIOD)).problems(workload=W) == []


def test_stages_repeated_by_aliases_are_refused_before_they_are_built(tmp_path):
    # 16 KB of YAML made 4 million stages and 8 million problems (32 s, 2 GB) before its error
    p = tmp_path / "p.yaml"
    p.write_text("pipelines: [&p {micro_batch_size: 1, num_micro_batches: 1, stages: [&s {devices: [a], "
                 "layers: [0, 1]}" + ", *s" * 2000 + "]}" + ", *p" * 2000 + "]\n")
    with pytest.raises(PlanError) as err:
        Plan.from_file(p)
    assert str(err.value) == (f"{p}: 4004001 stages in all, at most 4096, the most devices a cluster may have: "
                              "each stage needs a device of its own")
    many_devices = {"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1,
                                   "stages": [{"devices": ["a"] * 3000, "layers": [0, 1]}] * 2}]}
    with pytest.raises(PlanError, match=r"^plan: 6000 device entries in its stages, at most 4096"):
        Plan.from_dict(many_devices)
    with pytest.raises(PlanError, match=r"^plan: 5000 pipelines, at most 4096"):
        Plan.from_dict({"pipelines": [{}] * 5000})


def test_problems_past_what_an_error_shows_are_not_collected():
    bad = {"pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1,
                          "stages": [{"devices": [1], "layers": "x"}] * 4000}]}
    with pytest.raises(PlanError) as err:
        Plan.from_dict(bad, "p.json")
    assert len(err.value.problems) == MAX_PROBLEMS_SHOWN
    assert str(err.value).endswith("p.json: pipelines[0].stages[9]: layers must be [start, end] integers; "
                                   "... and more")


@pytest.mark.parametrize("predicted, message", [
    ({"iteration_s": float("nan"), "samples_per_s": 16.8}, "p.json: predicted.iteration_s must be a finite number "
                                                          ">= 0, got nan"),
    ({"iteration_s": 1.9, "samples_per_s": float("inf")}, "p.json: predicted.samples_per_s must be a finite number "
                                                         ">= 0, got inf"),
    ({"iteration_s": "fast"}, "p.json: predicted.iteration_s must be a finite number >= 0, got 'fast'"),
    ({"iteration_s": -1}, "p.json: predicted.iteration_s must be a finite number >= 0, got -1"),
    ("fast", "p.json: predicted must be an object of figures (iteration_s, samples_per_s)"),
])
def test_predicted_figures_must_be_finite(tmp_path, predicted, message):
    # NaN passed, and went on into a run's result files as invalid JSON
    p = tmp_path / "p.json"
    p.write_text(json.dumps({**_plan().to_dict(), "predicted": predicted}))
    with pytest.raises(PlanError) as err:
        Plan.from_file(p)
    assert str(err.value) == f"{p.parent}/{message}"


def test_any_finite_prediction_is_read_back():
    # a spec's slowest devices (1e-30 TFLOP/s) give predictions past every other figure's limit
    for figure in (0, 1e45, 10**400):
        obj = {**_plan().to_dict(), "predicted": {"iteration_s": figure}}
        assert Plan.from_dict(obj).predicted == {"iteration_s": figure}


def test_an_unknown_key_does_not_hide_the_plans_other_problems():
    obj = {**_plan().to_dict(), "schedule": "pipedream", "comment": "x"}
    with pytest.raises(PlanError) as err:
        Plan.from_dict(obj, "p.json")
    assert err.value.problems == [
        "p.json: unknown key 'comment' (allowed: model, pipelines, predicted, schedule, sync)",
        "p.json: schedule 'pipedream' is unknown (choose from gpipe, 1f1b, zb-h1, zb-h2)"]
    # a malformed pipeline: its rules are not applied to what could not be read, the settings' are
    obj = {"schedule": 3, "sync": {"mode": "gossip", "period": 10**23},
           "pipelines": [{"micro_batch_size": 1, "num_micro_batches": 1, "stages": [{"devices": ["a"]}]}]}
    with pytest.raises(PlanError) as err:
        Plan.from_dict(obj, "p.json")
    assert err.value.problems == [
        "p.json: schedule must be a string", "p.json: pipelines[0].stages[0]: missing required key 'layers'",
        "p.json: sync mode 'gossip' is unknown (choose from allreduce, hierarchical, local-sgd)",
        "p.json: sync period must be at most 1000000 iterations, got 100000000000000000000000"]
    with pytest.raises(PlanError) as err:  # not also "plan has no pipelines"
        Plan.from_dict({"pipelines": {"a": 1}}, "p.json")
    assert err.value.problems == ["p.json: pipelines must be a list"]
    # a plan that reads whole is still only checked by validate
    assert Plan.from_dict({**_plan().to_dict(), "schedule": "pipedream"}).schedule == "pipedream"


@pytest.mark.parametrize("name, message", [
    ("cee-demo.yaml", "looks like a cluster spec (it has devices and network), not a plan: pass it as the cluster "
                      "(--cluster)"),
    ("tiny-custom.yaml", "looks like a workload file (it has architecture), not a plan: pass it as the model "
                         "(--model)"),
])
def test_another_kind_of_file_given_as_a_plan_is_named_in_one_line(name, message):
    path = Path(__file__).resolve().parents[2] / "examples" / name
    with pytest.raises(PlanError) as err:
        Plan.from_file(path)
    assert str(err.value) == f"{path}: {message}"
    # and the other way round: a plan given as the cluster
    if name == "cee-demo.yaml":
        plan = path.parent / "plan-cee-demo.json"
        with pytest.raises(SpecError) as err:
            Cluster.from_file(plan)
        assert str(err.value) == (f"{plan}: looks like a plan (it has pipelines), not a cluster spec: pass it as the "
                                  "plan (--plan, or plan --from)")


@pytest.mark.parametrize(("changes", "named"), [
    ({"sync": "allreduce"}, "sync must be a Sync"),
    ({"sync": None}, "sync must be a Sync"),
    ({"pipelines": None}, "pipelines must be"),
    ({"layers": (0, 1, 2)}, "layers must be a"),
    ({"layers": None}, "layers must be a"),
    ({"layers": (False, True)}, "malformed"),
    ({"devices": "cloud-0"}, "devices must be"),
    ({"devices": (["cloud-0"],)}, "devices must be"),
    ({"devices": (5,)}, "devices must be"),
    ({"stage": {"devices": ["cloud-0"], "layers": [0, 1]}}, "must be a Stage"),
])
def test_plan_built_in_code_with_wrong_types_names_them(changes, named):
    # were ValueError / TypeError / AttributeError from inside problems(), or passed (device 5)
    from spantrain.plan import Pipeline, Plan, Stage
    stage = changes.get("stage") or Stage(devices=changes.get("devices", ("cloud-0",)),
                                          layers=changes.get("layers", (0, 1)))
    pipelines = changes.get("pipelines", (Pipeline(stages=(stage,), micro_batch_size=1, num_micro_batches=1),))
    kwargs = {"sync": changes["sync"]} if "sync" in changes else {}
    with pytest.raises(PlanError, match=named):
        Plan(pipelines=pipelines, **kwargs).validate()


@pytest.mark.parametrize(("text", "named"), [
    ('{"pipelines": ' + "9" * 5000 + "}", "integer beyond the largest float"),  # was a ValueError
    ('{"schedule": "gpipe", "schedule": "zb-h1", "pipelines": []}', "duplicate key 'schedule'"),  # last one won
    (None, "expected JSON text"),                                               # was a TypeError
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_plan_from_json_reads_text_as_a_plan_file_is_read(text, named):
    with pytest.raises(PlanError, match=named):
        Plan.from_json(text)


def test_plan_from_json_takes_bytes():
    plan = Plan.from_file(Path(__file__).parents[2] / "examples/plan-cee-demo.json")
    assert Plan.from_json(plan.to_json().encode()) == plan


def test_validate_given_a_path_or_a_name_says_what_it_needs():
    # a spec path as cluster was tested as a string ("unknown device" for each one), a model name an AttributeError
    root = Path(__file__).parents[2]
    plan = Plan.from_file(root / "examples/plan-cee-demo.json")
    with pytest.raises(PlanError, match="cluster must be a Cluster"):
        plan.validate(str(root / "examples/cee-demo.yaml"))
    with pytest.raises(PlanError, match="workload must be a Workload"):
        plan.validate(None, "gpt2-small")
