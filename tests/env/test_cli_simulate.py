"""`spantrain simulate`: JSON shape, human table, bad input exits 2 with one line, timeline."""

from __future__ import annotations

import json

import pytest

from spantrain._spec import readable
from spantrain.plan import Plan

PLAN = {"schedule": "zb-h1", "sync": {"mode": "hierarchical", "period": 1},
        "pipelines": [{"micro_batch_size": 2, "num_micro_batches": 4,
                       "stages": [{"devices": ["cloud-0"], "layers": [0, 14]},
                                  {"devices": ["edge-0"], "layers": [14, 26]}]},
                      {"micro_batch_size": 2, "num_micro_batches": 4,
                       "stages": [{"devices": ["cloud-1"], "layers": [0, 10]},
                                  {"devices": ["cloud-2"], "layers": [10, 26]}]}]}


@pytest.fixture
def files(tmp_path, demo_spec):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(demo_spec))
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    return cluster, plan, tmp_path


def test_json_output(files, run_cli):
    cluster, plan, _ = files
    code, out, err = run_cli("simulate", "--cluster", cluster, "--model", "gpt2-medium", "--plan", plan, "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert out.count("\n") == 1
    for key in ("iteration_s", "samples_per_s", "feasible", "peak_memory_gb", "bubble_fraction", "reasons"):
        assert key in obj
    assert set(obj["peak_memory_gb"]) == {"cloud-0", "edge-0", "cloud-1", "cloud-2"}
    assert len(obj["bubble_fraction"]) == 2 and obj["feasible"] is True
    assert obj["samples_per_s"] == pytest.approx(16 / obj["iteration_s"])
    assert obj["pipelines"][0]["stages"][1]["device"] == "edge-0"


def test_a_plan_made_for_other_inputs_is_noted(files, run_cli):
    cluster, _, tmp = files
    made = tmp / "made.json"
    code, _, err = run_cli("plan", "-c", cluster, "-m", "gpt2-medium", "--calibration", "emulated-cpu", "-o", made,
                           "--json")
    assert code == 0, err
    for calibration, noted in ((["--calibration", "emulated-cpu"], False), ([], True)):
        code, out, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "--plan", made, "--json",
                                 *calibration)
        assert code == 0 and json.loads(out)["iteration_s"] > 0
        predicted = json.loads(made.read_text())["predicted"]["iteration_s"]
        assert (f"note: the plan file predicted {predicted:.4g} s/iteration" in err) is noted, err
        assert err.count("\n") == noted
    # it named "--calibration none", which is no profile
    assert err.strip().endswith("(the built-in constants, no --calibration)"), err


def test_human_output(files, run_cli):
    cluster, plan, _ = files
    code, out, _ = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--global-batch", "16")
    assert code == 0
    assert "pipeline 0" in out and "edge-0" in out and "throughput" in out
    assert "constants  built-in (GPU executors that overlap sync with the backward pass)" in out
    # the constants it predicted with, as plan says them (simulate said nothing of them)
    code, out, _ = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--calibration", "emulated-cpu")
    assert code == 0 and "constants  emulated-cpu" in out
    code, out, _ = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--calibration", "emulated-cpu",
                           "--json")
    assert code == 0 and json.loads(out)["calibration"] == "emulated-cpu"


@pytest.mark.parametrize("calibration", [[], ["--calibration", "emulated-cpu"]])
def test_the_printed_iteration_parts_add_up(tmp_path, demo_spec, run_cli, calibration):
    # with emulated-cpu (no sync overlap) a ZB-H2 pipeline counts its makespan, not its shorter
    # steady-state period: "0.4809 s = slowest pipeline 0.4642 s + exposed sync 0 s + optimizer 0.0002745 s"
    import re

    cluster, plan = tmp_path / "c.json", tmp_path / "zb.json"
    cluster.write_text(json.dumps(demo_spec))
    plan.write_text(json.dumps({"schedule": "zb-h2", "pipelines": [{"micro_batch_size": 4, "num_micro_batches": 16,
                                "stages": [{"devices": ["cloud-0"], "layers": [0, 7]},
                                           {"devices": ["cloud-1"], "layers": [7, 13]},
                                           {"devices": ["cloud-2"], "layers": [13, 20]},
                                           {"devices": ["cloud-3"], "layers": [20, 26]}]}]}))
    args = ("-c", cluster, "-m", "gpt2-medium", *calibration)
    code, out, err = run_cli("simulate", *args, "-p", plan)
    assert code == 0, err
    it, slowest, exposed, rest = map(float, re.search(
        r"iteration  (\S+) s = slowest pipeline (\S+) s \+ exposed sync (\S+) s \+ optimizer and overhead (\S+) s",
        out).groups())
    assert slowest + exposed + rest == pytest.approx(it, rel=1e-3)
    assert f"{readable(slowest)} s/iteration" in out  # the pipeline's own line says the same
    est = json.loads(run_cli("simulate", *args, "-p", plan, "--json")[1])
    counted = est["pipeline_period_s"] if not calibration else est["pipeline_s"]
    assert slowest == pytest.approx(counted[0], rel=1e-3)
    if calibration:
        assert est["pipeline_s"][0] > est["pipeline_period_s"][0] * 1.01  # ZB-H2: the two differ
    code, out, _ = run_cli("plan", *args, "--planner", "heuristic")
    it, slowest, exposed, rest = map(float, re.search(
        r"iteration  (\S+) s \(slowest pipeline (\S+) s, exposed sync (\S+) s, optimizer and overhead (\S+) s\)",
        out).groups())
    assert code == 0 and slowest + exposed + rest == pytest.approx(it, rel=1e-3)


def test_a_plan_made_for_another_model_says_which(files, run_cli):
    cluster, plan, tmp = files
    named = tmp / "named.json"
    named.write_text(json.dumps({**PLAN, "model": "gpt2-medium"}))
    # other layers: was a list of "layer range [8, 15) goes past the model's 14 layers", one per stage
    code, out, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-small", "-p", named)
    assert code == 2 and out == ""
    assert err.strip() == (f"spantrain simulate: error: plan {named} was made for model gpt2-medium (26 layers), not "
                           f"gpt2-small (14): pass --model gpt2-medium, or make a plan for gpt2-small (spantrain "
                           "plan -o)")
    code, _, err = run_cli("plan", "-c", cluster, "-m", "gpt2-small", "--from", named)
    assert code == 2 and "running plan" in err and "made for model gpt2-medium (26 layers), not gpt2-small" in err
    # as many layers: it runs, with a note; a plan that names no model gets none
    code, _, err = run_cli("simulate", "-c", cluster, "-m", "bert-large", "-p", named)
    assert code == 0 and (f"spantrain simulate: note: plan {named} was made for model gpt2-medium, and is used for "
                          "bert-large here") in err
    code, _, err = run_cli("simulate", "-c", cluster, "-m", "bert-large", "-p", plan)
    assert code == 0 and "made for" not in err


def test_a_plan_made_for_a_model_from_a_file_says_to_pass_that_file(files, run_cli):
    # "pass --model my-gpt" named no preset, and --model my-gpt was refused as an unknown model
    cluster, _, tmp = files
    named = tmp / "mine.json"
    named.write_text(json.dumps({**PLAN, "model": "my-gpt"}))
    code, _, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-small", "-p", named)
    assert code == 2 and err.strip() == (f"spantrain simulate: error: plan {named} was made for model my-gpt (26 "
                                         "layers), not gpt2-small (14): pass the workload file of 'my-gpt' as "
                                         "--model, or make a plan for gpt2-small (spantrain plan -o)")
    code, _, err = run_cli("plan", "-c", cluster, "-m", "gpt2-small", "--from", named)
    assert code == 2 and err.strip().endswith("not gpt2-small (14): pass the workload file of 'my-gpt' as --model "
                                              "(the model the run trains)"), err


def test_global_batch_other_than_the_plans_is_refused_as_run_refuses_it(files, run_cli):
    cluster, plan, _ = files
    trains = Plan.from_file(plan).batch
    code, out, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--global-batch",
                             str(trains * 2))
    assert code == 2 and out == ""
    assert err.strip().endswith(f"--global-batch {trains * 2} but plan {plan} trains {trains} samples per iteration "
                                f"(pass --global-batch {trains}, or leave it out)"), err


@pytest.mark.parametrize("mutate", ["unknown-device", "gap", "missing-file", "syntax"])
def test_bad_plan_exits_2_with_one_line(files, run_cli, mutate):
    cluster, _, tmp = files
    bad = json.loads(json.dumps(PLAN))
    if mutate == "unknown-device":
        bad["pipelines"][0]["stages"][1]["devices"] = ["nope"]
    elif mutate == "gap":
        bad["pipelines"][1]["stages"][1]["layers"] = [12, 26]
    path = tmp / "bad.json"
    if mutate == "syntax":
        path.write_text("{not json")
    elif mutate != "missing-file":
        path.write_text(json.dumps(bad))
    code, out, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", path, "--json")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("spantrain simulate: error:")
    assert "Traceback" not in err
    assert str(path) in err  # a plan for another cluster or model did not say which file it was


def test_timeline_png(files, run_cli):
    cluster, plan, tmp = files
    png = tmp / "t.png"
    code, _, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--json", "--timeline", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_timeline_path_with_a_trailing_slash_writes_the_file_as_topo_show_does(files, run_cli):
    # 't.png/' passed the checks as t.png, then matplotlib wrote to 't.png/.png': "error: t.png/.png:
    # No such file or directory" after the work, naming neither the option nor the path given
    cluster, plan, tmp = files
    code, _, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--timeline", f"{tmp}/t.png/")
    assert code == 0, err
    assert (tmp / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("schedule", "absent"), [("gpipe", {"input grad B", "weight grad W"}),
                                                   ("zb-h1", {"fused backward"})])
def test_the_timeline_legend_lists_only_what_it_draws(files, run_cli, monkeypatch, schedule, absent):
    from matplotlib.figure import Figure

    cluster, plan, tmp = files
    plan.write_text(json.dumps({**PLAN, "schedule": schedule}))
    labels = []
    real = Figure.legend

    def spy(self, *args, handles=(), **kwargs):
        labels.extend(h.get_label() for h in handles)
        return real(self, *args, handles=handles, **kwargs)

    monkeypatch.setattr(Figure, "legend", spy)
    code, _, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--timeline", tmp / "t.png")
    assert code == 0, err
    assert "forward F" in labels and "sync collective" in labels and not absent & set(labels), labels


def _drawn_bars(run_cli, monkeypatch, cluster, plan, png) -> dict[str, list[tuple[float, float]]]:
    """`simulate --timeline`'s bars by colour name: (start, width) each."""
    from matplotlib.axes import Axes

    from spantrain.env.timeline import COLORS

    names = {color: name for name, color in COLORS.items()}
    bars: dict[str, list[tuple[float, float]]] = {}
    real = Axes.broken_barh

    def spy(self, xranges, yrange, **kwargs):
        bars.setdefault(names.get(kwargs.get("facecolors")), []).extend(xranges)
        return real(self, xranges, yrange, **kwargs)

    monkeypatch.setattr(Axes, "broken_barh", spy)
    code, _, err = run_cli("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--timeline", png)
    assert code == 0, err
    return bars


def test_the_timeline_draws_the_optimizer_step_after_the_devices_sync(files, run_cli, monkeypatch):
    # it was drawn at each schedule's end, before the gradient collectives that ran on after it
    from spantrain.cluster import Cluster
    from spantrain.env.reference import trace
    from spantrain.plan import Plan
    from spantrain.workload import Workload

    cluster, plan, tmp = files
    steps = [x for x, _ in _drawn_bars(run_cli, monkeypatch, cluster, plan, tmp / "t.png")["optimizer"]]
    tr = trace(Cluster.from_file(cluster), Workload.from_preset("gpt2-medium"), Plan.from_file(plan))
    assert tr.collectives and max(steps) >= max(c.end for c in tr.collectives)
    for p, stages in enumerate(tr.devices):
        for s, dev in enumerate(stages):
            own = [c.end for c in tr.collectives if dev in c.devices]
            assert max([tr.ops[p][s][-1].end, *own]) in steps


def test_under_local_sgd_the_timeline_averages_after_the_steps(files, run_cli, monkeypatch):
    # the averaging was drawn from the slowest pipeline's end, over the other devices' optimizer steps
    cluster, plan, tmp = files
    plan.write_text(json.dumps({**PLAN, "sync": {"mode": "local-sgd", "period": 4}}))
    bars = _drawn_bars(run_cli, monkeypatch, cluster, plan, tmp / "t.png")
    steps = [x + w for x, w in bars["optimizer"]]
    averaging = [x for x, _ in bars["sync"]]
    assert steps and averaging and max(steps) <= min(averaging) + 1e-9


def test_bad_timeline_paths_are_refused_before_any_work(files, run_cli):
    cluster, plan, tmp = files
    args = ("simulate", "-c", cluster, "-m", "gpt2-medium", "-p", plan, "--timeline")
    for path, needle in ((tmp / "t.txt", "format '.txt' is not supported; give a file name ending in .png, .pdf"),
                         (tmp, f"--timeline {tmp}: is a directory"),
                         (tmp / "sub" / "t.png", "does not exist (create it first)")):
        code, out, err = run_cli(*args, path)
        assert code == 2 and out == "" and err.count("\n") == 1, err
        assert needle in err, err
    assert sorted(p.name for p in tmp.iterdir()) == ["cluster.json", "plan.json"]


def test_piped_table_keeps_every_figure_whole(files, run_cli, monkeypatch):
    # piped, rich laid the table out for 80 columns and cut long figures short ("41947.…")
    monkeypatch.delenv("COLUMNS", raising=False)
    cluster, _, tmp = files
    plan = tmp / "slow.json"
    plan.write_text(json.dumps({"pipelines": [{"micro_batch_size": 8, "num_micro_batches": 8, "stages": [
        {"devices": ["end-0"], "layers": [0, 34]}]}]}))
    args = ("simulate", "-c", cluster, "-m", "llama2-7b", "-p", plan, "--global-batch", "64")
    code, out, err = run_cli(*args)
    assert code == 0, err
    stage = json.loads(run_cli(*args, "--json")[1])["pipelines"][0]["stages"][0]
    assert "…" not in out
    for key in ("f_ms", "b_ms", "w_ms"):
        assert readable(stage[key]) in out  # "41,948"
