"""Smoke run of the policy evaluation script with the shipped policy on its quick case set."""

import json

import pytest

from spantrain.experiments import eval_policy


@pytest.mark.slow
def test_quick_evaluation_writes_table_plots_and_json(tmp_path, capsys):
    code = eval_policy.main(["--quick", "--json", "--no-track", "--no-progress", "--ga-budget-s", "0.2",
                             "--out", str(tmp_path)])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["planning"], summary
    for entry in summary["planning"].values():
        # auto is the better of ppo and heuristic, so it is never below the heuristic
        assert entry["auto"]["worse"] == 0.0
        # the headroom searches start from the heuristic's plan and keep the best they visit
        assert entry["lookahead"]["worse"] == 0.0
    assert summary["planning"]["training sizes (8-32)"]["beam"]["worse"] == 0.0
    assert "beam" not in summary["planning"]["64 devices"]  # too costly beyond training sizes
    assert {p.name for p in tmp_path.glob("*.png")} >= {"policy_ratios.png", "policy_latency.png"}
    assert (tmp_path / "eval_policy_quick.md").read_text().startswith("| cases | planner |")


def test_negative_beam_width_is_a_one_line_error(tmp_path, capsys):
    assert eval_policy.main(["--beam-width", "-1", "--out", str(tmp_path), "--no-track"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "eval_policy: error: --beam-width must be >= 0, got -1" and not list(tmp_path.iterdir())
