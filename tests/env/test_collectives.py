"""Data-parallel collectives against closed forms, and their serialization per device."""

from __future__ import annotations

import numpy as np
import pytest

from spantrain.env.collectives import hierarchical_time, ring_order, ring_time, schedule_collectives


def links(n, bw, lat):
    b = np.full((n, n), float(bw))
    la = np.full((n, n), float(lat))
    np.fill_diagonal(b, np.inf)
    np.fill_diagonal(la, 0.0)
    return b, la


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_matches_closed_form(n):
    bw, lat = links(n, 1e9, 1e-3)
    nbytes = 4e8
    t = ring_time(np.arange(n), nbytes, bw, lat, 0.0)
    assert t == pytest.approx(2 * (n - 1) / n * nbytes / 1e9 + 2 * (n - 1) * 1e-3, rel=1e-12)


def test_ring_slowest_hop_bounds_and_order_avoids_slow_pairs():
    bw, lat = links(4, 1e9, 0.0)
    # devices 0,1 and 2,3 are close; 0<->2 and 1<->3 are terrible
    for i, j in ((0, 2), (2, 0), (1, 3), (3, 1)):
        bw[i, j] = 1e6
    order, step = ring_order(np.arange(4), 1e8 / 4, bw, lat, 0.0)
    hops = {(int(order[k]), int(order[(k + 1) % 4])) for k in range(4)}
    assert not hops & {(0, 2), (2, 0), (1, 3), (3, 1)}
    assert step == pytest.approx(1e8 / 4 / 1e9)
    bw[0, 1] = bw[1, 0] = 1e8  # now one hop of any ring is slow: it sets every step
    t = ring_time(np.arange(4), 1e8, bw, lat, 0.0)
    assert t >= 6 * (1e8 / 4 / 1e8) - 1e-12


def test_hierarchical_by_hand():
    # regions {0,1} and {2,3}: 10 GB/s inside, 0.1 GB/s across, latencies 1 ms / 50 ms
    n = 4
    bw, lat = links(n, 1e10, 1e-3)
    region = np.array([0, 0, 1, 1])
    for i in range(n):
        for j in range(n):
            if i != j and region[i] != region[j]:
                bw[i, j] = 1e8
                lat[i, j] = 0.05
    B = 1e9
    reduce_ = B / 1e10 + 1e-3  # chain of one hop to the leader
    leaders = 2 * (2 - 1) / 2 * B / 1e8 + 2 * (2 - 1) * 0.05
    expected = reduce_ + leaders + reduce_
    assert hierarchical_time(np.arange(n), B, bw, lat, 0.0, region) == pytest.approx(expected, rel=1e-12)
    flat = ring_time(np.arange(n), B, bw, lat, 0.0)
    assert flat == pytest.approx(2 * 3 / 4 * B / 1e8 + 6 * 0.05)  # crosses the slow link on every step
    assert hierarchical_time(np.arange(n), B, bw, lat, 0.0, region) < flat


def test_hierarchical_in_one_region_is_a_ring():
    bw, lat = links(3, 1e9, 1e-4)
    nodes = np.arange(3)
    assert hierarchical_time(nodes, 1e8, bw, lat, 0.0, np.zeros(3, np.int64)) == ring_time(nodes, 1e8, bw, lat, 0.0)


def test_collectives_sharing_a_device_run_one_after_another():
    # groups in layer order; the last runs first (backward order)
    members = np.array([[3, 4], [1, 2], [0, 1]])
    start, end = schedule_collectives(np.array([0.0, 0.5, 0.0]), np.array([1.0, 1.0, 2.0]), members, 5)
    assert list(start) == [0.0, 2.0, 0.0]  # the middle one waits for device 1; the first is independent
    assert list(end) == [1.0, 3.0, 2.0]


@pytest.mark.parametrize("seed, sizes", [(seed, (2, 3, 5, 9, 17, 33)) for seed in range(6)] + [(6, (130,))])
def test_the_pruned_ring_search_finds_what_trying_every_start_in_full_finds(seed, sizes):
    """`_ring` drops starts, stops early and, from 128 nodes, sorts neighbours; the
    reference scans every node for every hop of every start."""
    from spantrain.env import reference
    from spantrain.env.kernel import _SORTED_RING_FROM

    assert max(sizes) < _SORTED_RING_FROM or min(sizes) >= _SORTED_RING_FROM  # one path per case
    rng = np.random.default_rng(seed)
    for n in sizes:
        # a few fast groups, slow between them, some asymmetric links and repeated figures
        group = rng.integers(0, 1 + n // 4, n)
        bw = np.where(group[:, None] == group[None, :], 1e10, 1e8) * rng.choice([1.0, 1.0, 0.5, 2.0], (n, n))
        lat = np.where(group[:, None] == group[None, :], 1e-5, 1e-2) * rng.choice([1.0, 3.0], (n, n))
        np.fill_diagonal(bw, np.inf)
        np.fill_diagonal(lat, 0.0)
        nodes = rng.permutation(n)[:max(2, n - int(rng.integers(0, 3)))]
        want = reference.ring_allreduce(nodes.tolist(), 1e9, bw, lat, 1e-5)
        assert ring_time(nodes, 1e9, bw, lat, 1e-5) == pytest.approx(want, rel=1e-12), (seed, n)
        order, step = ring_order(nodes, 1e9 / len(nodes), bw, lat, 1e-5)
        assert sorted(order.tolist()) == sorted(nodes.tolist())
        hops = [1e9 / len(nodes) / bw[a, z] + lat[a, z] + 1e-5 for a, z in zip(order, np.roll(order, -1))]
        assert max(hops) == pytest.approx(step, rel=1e-12)
