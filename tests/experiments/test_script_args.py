"""Every experiment script reports a flag it cannot use in one line, code 2, as `spantrain` does."""

from __future__ import annotations

import importlib

import pytest

SCRIPTS = ["adapt_live", "bench_calibrated_planning", "bench_costmodel", "bench_deep_planning", "bench_planners",
           "bench_runtime", "calibrate", "eval_policy"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unusable_flag_is_one_line_naming_it(script, capsys):
    main = importlib.import_module(f"spantrain.experiments.{script}").main
    with pytest.raises(SystemExit) as stop:
        main(["--no-such-flag"])
    out, err = capsys.readouterr()
    # argparse printed its usage (several lines) before the error
    assert stop.value.code == 2 and out == "" and err.count("\n") == 1, err
    assert "error: unrecognized arguments: --no-such-flag" in err and "--help)" in err, err
