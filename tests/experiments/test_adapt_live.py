"""`experiments/adapt_live.py` smoke run: plain local processes, a tiny model, a dozen iterations."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from spantrain.experiments import adapt_live

# A 6-layer GPT small enough that a dozen two-process iterations take a few seconds.
MODEL = {"name": "adapt-small", "global_batch": 8, "seq_len": 16, "precision": "fp32",
         "architecture": {"family": "gpt2", "vocab_size": 256, "d_model": 32, "n_layers": 4, "n_heads": 2,
                          "d_ff": 64, "max_seq_len": 32}}


@pytest.mark.slow
def test_smoke_run_switches_plans_and_reports_figures(tmp_path):
    model = tmp_path / "model.json"
    model.write_text(json.dumps(MODEL))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert adapt_live.main(["--json", "--mode", "none", "--steps", "40", "--change-at", "3", "--model", str(model),
                                "--planner", "heuristic"]) == 0
    fig = json.loads(out.getvalue())
    assert fig["chosen"] == "heuristic" and 3 < fig["switched_at"] < 40 and fig["losses_complete"]
    assert "edge-0" not in fig["new_devices"]  # off the slowed cloud-edge link
    keep = next(o for o in fig["options"] if o["name"] == "keep")
    assert keep["iteration_s"] > 100 * min(o["iteration_s"] for o in fig["options"])
    assert fig["before_s"] > 0 and fig["after_s"] > 0 and len(fig["on_slowed_link_s"]) == fig["switched_at"] - 3


@pytest.mark.parametrize("args, expected", [
    (["--steps", "5", "--change-at", "4"], "need 2 < --change-at < --steps - 2 (the first 2 iterations are warm-up), "
                                           "got --change-at 4 and --steps 5"),
    # accepted, and the run ended in a TypeError formatting the median of no iterations
    (["--steps", "12", "--change-at", "2"], "need 2 < --change-at < --steps - 2"),
    (["--model", "no-such-model"], "unknown model 'no-such-model'"),  # was a traceback
    (["--unannounced"], "--unannounced changes the live network, which only --mode netns reshapes (got --mode none)"),
    (["--planner", "no-such-planner"], "unknown planner 'no-such-planner'"),  # was exit code 1
    # the run went to its end and then said it did not switch: its adapter ignored a file that does not load
    (["--slow-gbps", "0"], "--slow-gbps must be a positive link speed in Gbit/s, got 0 (cluster: network.links[0]: "
                           "gbps must be a positive"),
])
def test_bad_arguments_are_one_line(capsys, monkeypatch, args, expected):
    monkeypatch.setattr("spantrain.cli.main", lambda argv: pytest.fail("ran"))
    assert adapt_live.main([*args, "--mode", "none", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"adapt_live: error: {expected}"), err
