"""Pipeline schedules: closed forms, zero-bubble properties, orders the runtime can run."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spantrain.env.schedules import (
    SCHEDULE_CODES,
    best_order,
    fixed_order,
    memory_bounds,
    simulate_order,
    stage_orders,
    zb_greedy,
)
from spantrain.errors import PlanError


def run(schedule, S, M, f=1.0, b=1.0, w=1.0, comm=0.0):
    fv = np.full(S, f) if np.isscalar(f) else np.asarray(f, float)
    bv = np.full(S, b) if np.isscalar(b) else np.asarray(b, float)
    wv = np.full(S, w) if np.isscalar(w) else np.asarray(w, float)
    c = np.full(max(S - 1, 1), comm) if np.isscalar(comm) else np.asarray(comm, float)
    z = np.zeros_like(c)
    kind, mb, start, end, per = best_order(SCHEDULE_CODES[schedule], M, fv, bv, wv, bv + wv, c, z, c, z)
    busy = float((end - start).sum())
    return per, 1.0 - busy / (S * per), kind, mb, start, end


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("S", "M", "f", "b", "w"), [(4, 8, 1, 1, 1), (3, 5, 1.0, 2.0, 0.5), (6, 24, 0.3, 0.5, 0.2),
                                                      (1, 4, 2, 1, 1), (5, 2, 1, 1, 1)])
def test_homogeneous_closed_form(schedule, S, M, f, b, w):
    per, *_ = run(schedule, S, M, f, b, w, comm=1e-12)
    assert per == pytest.approx((M + S - 1) * (f + b + w), rel=1e-9)


@pytest.mark.parametrize(("S", "M"), [(2, 4), (4, 8), (4, 32), (8, 16), (6, 6)])
def test_zb_h1_bubble_at_most_a_third_of_1f1b(S, M):
    p1, b1, *_ = run("1f1b", S, M)
    pz, bz, *_ = run("zb-h1", S, M)
    idle_1f1b = p1 - 3 * M  # per stage, F = B = W = 1
    idle_zb = pz - 3 * M
    assert idle_zb <= idle_1f1b / 3 + 1e-9
    assert bz < b1
    assert pz == pytest.approx(3 * M + (S - 1))  # the paper's (p-1)(F+B-W)


@pytest.mark.parametrize(("S", "M"), [(4, 32), (8, 32), (3, 24)])
def test_zb_h2_bubble_near_zero(S, M):
    _, bubble, *_ = run("zb-h2", S, M)
    assert bubble < 0.01
    _, bubble_h1, *_ = run("zb-h1", S, M)
    assert bubble < bubble_h1


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "zb-h1", "zb-h2"])
def test_more_micro_batches_never_increase_bubble_homogeneous(schedule):
    bubbles = [run(schedule, 4, M, 1.0, 1.3, 0.7)[1] for M in range(1, 40)]
    assert all(b2 <= b1 + 1e-12 for b1, b2 in pairwise(bubbles))


times = st.lists(st.floats(0.05, 3.0), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(times, st.integers(1, 12), st.integers(0, 2**31 - 1))
def test_greedy_timing_equals_simulating_its_order(f, M, seed):
    rng = np.random.default_rng(seed)
    S = len(f)
    fv = np.array(f)
    bv = fv * rng.uniform(0.5, 2.0, S)
    wv = fv * rng.uniform(0.2, 1.5, S)
    c = rng.uniform(0, 1.0, max(S - 1, 1))
    lat = rng.uniform(0, 0.3, max(S - 1, 1))
    for lim_fb, lim_tot in ([S - s for s in range(S)], [S] * S), ([2 * (S - s) - 1 for s in range(S)], [2 * S - 1] * S):
        kind, mb, start, end, chf, chb = zb_greedy(M, fv, bv, wv, c, lat, c[::-1].copy(), lat, np.array(lim_fb),
                                                   np.array(lim_tot))
        s2, e2, f2, b2 = simulate_order(kind, mb, fv, bv, wv, bv + wv, c, lat, c[::-1].copy(), lat)
        np.testing.assert_array_equal(start, s2)
        np.testing.assert_array_equal(end, e2)
        np.testing.assert_array_equal(chf, f2)
        np.testing.assert_array_equal(chb, b2)


@settings(max_examples=40, deadline=None)
@given(times, st.integers(1, 10), st.sampled_from(["gpipe", "1f1b", "zb-h1", "zb-h2"]), st.integers(0, 2**31 - 1))
def test_orders_are_complete_causal_and_within_memory_bounds(f, M, schedule, seed):
    rng = np.random.default_rng(seed)
    S = len(f)
    b = list(rng.uniform(0.1, 2, S))
    w = list(rng.uniform(0.1, 2, S))
    comm = list(rng.uniform(0, 1, S - 1))
    orders = stage_orders(schedule, S, M, f, b, w, comm)
    assert len(orders) == S
    split = schedule.startswith("zb")
    for s, ops in enumerate(orders):
        kinds = ["F", "B", "W"] if split else ["F", "BW"]
        assert sorted(ops) == sorted((k, i) for k in kinds for i in range(M))
        seen: set = set()
        fb = fw = 0
        lim_fb, lim_tot = memory_bounds(schedule, S)[s]
        for kind, i in ops:
            if kind in ("B", "BW"):
                assert ("F", i) in seen
            if kind == "W":
                assert ("B", i) in seen
            seen.add((kind, i))
            fb += {"F": 1, "B": -1, "BW": -1}.get(kind, 0)
            fw += {"F": 1, "W": -1, "BW": -1}.get(kind, 0)
            assert fb <= lim_fb and fw <= lim_tot
        assert [i for k, i in ops if k == "F"] == list(range(M))


@settings(max_examples=40, deadline=None)
@given(times, st.integers(1, 10), st.integers(0, 2**31 - 1))
def test_zero_bubble_never_slower_than_1f1b(f, M, seed):
    rng = np.random.default_rng(seed)
    S = len(f)
    b, w = rng.uniform(0.1, 2, S), rng.uniform(0.1, 2, S)
    comm = rng.uniform(0, 1, max(S - 1, 1))
    p1 = run("1f1b", S, M, f, b, w, comm)[0]
    ph1 = run("zb-h1", S, M, f, b, w, comm)[0]
    ph2 = run("zb-h2", S, M, f, b, w, comm)[0]
    assert ph1 <= p1 + 1e-9
    assert ph2 <= ph1 + 1e-9


def test_slow_link_throttles_pipeline():
    # one message needs 5 s on the link, compute is 1 s: the link sets the pace
    per, *_ = run("1f1b", 2, 10, comm=[5.0])
    assert per >= 10 * 5.0


def test_fixed_orders_match_textbook():
    kind, mb = fixed_order(1, 3, 4, False)
    first = [("B" if k == 3 else "F") + str(i) for k, i in zip(kind[0], mb[0])]
    assert first == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
    kind, mb = fixed_order(0, 2, 3, False)
    assert list(kind[1]) == [0, 0, 0, 3, 3, 3]


def test_stage_orders_rejects_bad_input():
    with pytest.raises(PlanError):
        stage_orders("zb-h3", 2, 2, [1, 1], [1, 1], [1, 1])
    with pytest.raises(PlanError):
        stage_orders("1f1b", 2, 2, [1, 1], [1, 1], [1])
    with pytest.raises(PlanError):
        stage_orders("1f1b", 2, 2, [1, 1], [1, 1], [1, 1], [-1.0])
