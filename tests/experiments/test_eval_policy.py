"""Smoke run of the policy evaluation script with the shipped policy on its quick case set."""

import json

import pytest

from spantrain.experiments import eval_policy
from spantrain.workload import Workload


@pytest.mark.slow
def test_quick_evaluation_writes_table_plots_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    code = eval_policy.main(["--quick", "--json", "--no-progress", "--ga-budget-s", "0.2",
                             "--latency-repeats", "2", "--anneal-steps", "30", "--batch-scale", "2",
                             "--out", str(tmp_path)])
    assert code == 0
    out, err = capsys.readouterr()
    summary = json.loads(out)
    # it ends naming its W&B run, as train-policy and run do (stderr: stdout holds the JSON alone)
    (part,) = (tmp_path / "wandb" / "wandb").glob("offline-run-*")
    assert err.splitlines()[-1] == f"W&B run: {part} (offline: `wandb sync {part}` uploads it)", err
    assert summary["planning"], summary
    for entry in summary["planning"].values():
        # auto is the better of ppo and heuristic, so it is never below the heuristic
        assert entry["auto"]["worse"] == 0.0
        # the headroom searches start from the heuristic's plan and keep the best they visit
        assert entry["lookahead"]["worse"] == 0.0
    assert summary["planning"]["training sizes (8-32)"]["beam"]["worse"] == 0.0
    assert summary["planning"]["training sizes (8-32)"]["anneal"]["worse"] == 0.0
    assert summary["planning"]["64 devices"]["anneal"]["worse"] == 0.0  # annealing runs at every size
    assert "beam" not in summary["planning"]["64 devices"]  # too costly beyond training sizes
    # ppo is one of the planners the headroom bound takes the best of
    assert summary["headroom"]["ppo_better_1pct"] <= summary["headroom"]["any_better_1pct"]
    adapt = summary["adaptation"]
    # `plan --from` picks the best of keeping, the policy's move and the heuristic's re-plan
    assert adapt["auto_below_keep_or_replan"] == 0.0 and adapt["auto_over_keep"] >= 1.0
    # a scaled batch gets its own files, so it never overwrites the preset-batch evaluation
    assert "`plan --from` vs heuristic re-plan" in (tmp_path / "eval_policy_batch2_quick.md").read_text()
    assert {p.name for p in tmp_path.glob("*.png")} >= {"policy_ratios_batch2.png", "policy_latency_batch2.png"}
    table = (tmp_path / "eval_policy_batch2_quick.md").read_text()
    assert table.startswith("| cases | planner |") and "median of 2 timed runs per case" in table
    assert "global batch: each preset's x2" in table
    rows = json.loads((tmp_path / "eval_policy_batch2_quick.json").read_text())["cases"]
    assert rows and all(r["batch"] == 2 * Workload.from_preset(r["model"]).global_batch for r in rows)
    # the latency figure is each case's median run; the slowest single run is kept and reported
    for r in rows:
        runs = r["ppo"]["plan_s_runs"]
        assert len(runs) == 2 and r["ppo"]["plan_s"] == pytest.approx(sum(runs) / 2)
    for entry in summary["planning"].values():
        assert entry["ppo"]["max_single_plan_s"] >= entry["ppo"]["max_plan_s"]
    # W&B gets the README's tables as tables (the nested summary showed as one opaque value)
    tables = eval_policy.summary_tables(summary)
    columns, planners = tables["planners"]
    assert columns[:3] == ["cases", "planner", "median_ratio"]
    auto_64 = planners[[r[:2] for r in planners].index(["64 devices", "auto"])]
    assert auto_64[2] == summary["planning"]["64 devices"]["auto"]["median_ratio"] >= 1.0
    assert dict(tables["adaptation"][1])["auto_below_keep_or_replan"] == 0.0


@pytest.mark.slow
def test_quick_run_leaves_the_committed_results_alone(tmp_path, monkeypatch):
    # the plots keep their names with --quick: written to experiments/results, a smoke run
    # replaced the committed evaluation's figures
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(eval_policy, "RESULTS", results)
    monkeypatch.chdir(tmp_path)
    assert eval_policy.main(["--quick", "--no-track", "--no-progress", "--ga-budget-s", "0.2", "--beam-width", "0",
                             "--latency-repeats", "1"]) == 0
    assert not any(results.iterdir())
    quick = tmp_path / "out" / "eval_policy_quick"
    assert {"eval_policy_quick.md", "policy_ratios.png"} <= {p.name for p in quick.iterdir()}


@pytest.mark.parametrize("flag,value,error", [("--beam-width", "-1", "--beam-width must be >= 0, got -1"),
                                              ("--latency-repeats", "0", "--latency-repeats must be >= 1, got 0"),
                                              ("--anneal-steps", "-5", "--anneal-steps must be >= 0, got -5"),
                                              *[("--batch-scale", v, "--batch-scale must be an integer from 1 "
                                                 f"to 64, got {v}") for v in ("0", "65")],
                                              *[("--ga-budget-s", v, "--ga-budget-s must be a number of seconds "
                                                 f"in (0, 3600], got {v}")
                                                for v in ("0", "-1", "nan", "inf", "1e+300")]])
def test_bad_option_is_a_one_line_error(tmp_path, capsys, flag, value, error):
    assert eval_policy.main([flag, value, "--out", str(tmp_path / "out"), "--no-track"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"eval_policy: error: {error}" and not (tmp_path / "out").exists()


def test_bad_paths_are_one_line_errors(tmp_path, capsys):
    spec = tmp_path / "cluster.yaml"
    spec.write_text("name: c\n")
    assert eval_policy.main(["--quick", "--no-track", "--out", str(spec)]) == 2
    assert capsys.readouterr().err.strip() == f"eval_policy: error: --out {spec} is a file, not a directory: pass a " \
                                              "directory"
    assert eval_policy.main(["--quick", "--no-track", "--policy", str(spec), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"eval_policy: error: --policy {spec} is not a spantrain policy file (not a torch file of tensors): pass a "
        "policy file written by `spantrain train-policy` (a run's best-policy.pt, ppo-policy.pt or a checkpoint)")
    assert not (tmp_path / "out").exists()
    # empty: it wrote to the default directory unsaid
    assert eval_policy.main(["--quick", "--no-track", "--out", ""]) == 2
    assert capsys.readouterr().err.strip() == ("eval_policy: error: --out is empty: give a directory name, or leave "
                                              "--out out for the default")


def test_tracking_that_cannot_start_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    """W&B starts after the whole evaluation (20 minutes in full): a WANDB_MODE it refuses failed
    only then, and a ./wandb-runs this user cannot make with a traceback."""
    from pathlib import Path

    from spantrain._spec import cannot_write_in

    out = tmp_path / "out"
    monkeypatch.setenv("WANDB_MODE", "bogus")
    assert eval_policy.main(["--quick", "--no-progress", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == ("eval_policy: error: WANDB_MODE=bogus is not a W&B mode: set it to "
                                              "online, offline or disabled, or unset it")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        here = ro if cannot_write_in(ro) else Path("/sys")  # root ignores modes
        if not cannot_write_in(here):
            pytest.skip("no unwritable directory here")
        monkeypatch.chdir(here)
        assert eval_policy.main(["--quick", "--no-progress", "--out", str(out)]) == 2
    finally:
        ro.chmod(0o700)
    err = capsys.readouterr().err.strip()
    assert err.startswith("eval_policy: error: W&B would keep its files in ./wandb-runs, which cannot be written "
                          "(") and err.endswith("set WANDB_DIR to one, or pass --no-track"), err
    assert not out.exists()


def test_json_on_stdout_is_strict_where_no_plan_was_feasible(tmp_path, capsys, monkeypatch):
    """A planner with no feasible plan in a group has no geomean (NaN): --json printed a bare
    NaN there (128 devices, ppo-alone, in the README's run), which strict JSON parsers refuse."""
    real = eval_policy.summarize

    def none_feasible(rows, adapt):
        summary = real(rows, adapt)
        for entry in summary["planning"].values():
            entry["ppo-alone"]["geomean_ratio"] = eval_policy._geomean([0.0])  # as for all-infeasible ratios
        return summary

    monkeypatch.setattr(eval_policy, "summarize", none_feasible)
    assert eval_policy.main(["--quick", "--json", "--no-track", "--no-progress", "--ga-budget-s", "0.2",
                             "--beam-width", "0", "--latency-repeats", "1", "--out", str(tmp_path)]) == 0

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    summary = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert all(entry["ppo-alone"]["geomean_ratio"] is None for entry in summary["planning"].values())
    assert summary["planning"]["training sizes (8-32)"]["ppo"]["geomean_ratio"] > 0


def _row(name: str, heuristic: float, **times: float) -> dict:
    profile, n = name.split("-")
    row = {"profile": profile, "devices": int(n), "model": "gpt2-xl", "heuristic": {"iteration_s": heuristic}}
    row.update({planner: {"iteration_s": t} for planner, t in times.items()})
    return row


def test_headroom_bound_counts_cases_any_search_beats_by_one_percent():
    rows = [_row("cee-8", 1.0, ppo=1.0, anneal=0.98, ga=1.2),  # annealing 2 % faster: counted
            _row("geo-16", 1.0, ppo=0.995, anneal=0.999),  # 0.5 %: below the bar
            _row("datacenter-64", 2.0, ppo=1.9, lookahead=2.0),  # the policy itself, 5 %
            _row("geo-8", float("inf"), ppo=float("inf"))]  # nothing fits: not a case
    bound = eval_policy._headroom_bound(rows)
    assert bound == {"cases": 3, "any_better_1pct": 2, "ppo_better_1pct": 1,
                     "where": ["cee-8 gpt2-xl", "datacenter-64 gpt2-xl"]}
    assert "any planner or search in the table >= 1 % better than heuristic: 2 of 3 cases (67%)" in \
        eval_policy.markdown({"planning": {}, "headroom": bound, "auto_over_best_baseline_cee": 1.0})


def test_ctrl_c_during_the_adaptation_cases_closes_their_progress_bar(monkeypatch):
    # an open bar had "eval_policy: interrupted" glued onto it, and redrew after it
    import tqdm

    bars = []

    class Recorded(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.closed = False
            bars.append(self)

        def close(self):
            self.closed = True
            super().close()

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tqdm, "tqdm", Recorded)
    monkeypatch.setattr(eval_policy, "network_change", ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        eval_policy.adaptation_cases(None, quick=True, progress=True)
    assert [bar.closed for bar in bars] == [True]
