"""The cost-model benchmark's options."""

import pytest

from spantrain.experiments import bench_costmodel


@pytest.mark.parametrize("flag,value,error", [("--repeats", "0", "--repeats must be >= 1, got 0"),
                                              ("--repeats", "-1", "--repeats must be >= 1, got -1"),
                                              *[("--seconds", v, f"--seconds must be from 0 to 60, got {v}")
                                                for v in ("-1", "nan", "inf", "1e+300")]])
def test_bad_option_is_a_one_line_error(capsys, flag, value, error):
    # no repeats used to end in a traceback (no median of nothing), inf or nan seconds in a
    # repeat that never ends
    assert bench_costmodel.main([flag, value]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == f"bench_costmodel: error: {error}" and not captured.out
