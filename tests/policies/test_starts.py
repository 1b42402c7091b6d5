"""Cached heuristic starts: computed once, and a damaged cache file is recomputed, not fatal."""

from __future__ import annotations

from spantrain.env.evaluator import Evaluator
from spantrain.env.plan_env import scenario_workload
from spantrain.policies.heuristic import HeuristicPlanner
from spantrain.policies.starts import HeuristicStarts
from spantrain.profiler.topology import generate

KEY = ("cee", 5, 3, "gpt2-medium", 1.0)


def _evaluator() -> Evaluator:
    profile, n, seed, model, scale = KEY
    return Evaluator(generate(n, seed=seed, profile=profile), scenario_workload(model, scale))


def test_a_start_is_cached_and_equals_the_heuristic_plan(tmp_path):
    starts = HeuristicStarts(tmp_path)
    assert starts.prepare([KEY, KEY], progress=False) == 1
    assert starts.prepare([KEY], progress=False) == 0
    files = list(tmp_path.iterdir())
    assert [p.suffix for p in files] == [".json"]  # no temporary file left behind
    want = HeuristicPlanner().best_candidate(_evaluator())
    got = HeuristicStarts(tmp_path)(KEY, _evaluator())
    assert (got.layout, got.shares, got.knobs, got.time) == (want.layout, want.shares, want.knobs, want.time)


def test_a_half_written_cache_file_is_recomputed(tmp_path):
    HeuristicStarts(tmp_path).prepare([KEY], progress=False)
    (path,) = tmp_path.iterdir()
    whole = path.read_text()
    path.write_text(whole[: len(whole) // 2])  # as if interrupted mid-write by an older version
    assert HeuristicStarts(tmp_path).prepare([KEY], progress=False) == 1
    assert path.read_text() == whole
    path.write_text("{")
    assert HeuristicStarts(tmp_path)(KEY, _evaluator()).feasible
    assert path.read_text() == whole
