from __future__ import annotations

import numpy as np
import pytest

from spantrain.cluster import GBPS, Cluster
from spantrain.errors import SpecError
from spantrain.profiler.catalog import CATALOG
from spantrain.profiler.topology import PROFILES, generate


def test_catalog_is_sustained_not_peak():
    for gpu in CATALOG.values():
        assert 0.1 * gpu.peak_tflops < gpu.tflops < 0.6 * gpu.peak_tflops, gpu.name
    assert CATALOG["A100-40GB"].memory_gb == 40 and CATALOG["RTX3060"].memory_gb == 12


@pytest.mark.parametrize("profile", PROFILES)
def test_generator_is_deterministic_by_seed(profile, tmp_path):
    a, b, other = tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml"
    generate(24, seed=3, profile=profile).save(a)
    generate(24, seed=3, profile=profile).save(b)
    generate(24, seed=4, profile=profile).save(other)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != other.read_bytes()


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("n", [2, 3, 7, 64, 300])
def test_any_size_gives_exactly_n_devices_and_round_trips(profile, n):
    c = generate(n, seed=1, profile=profile)
    assert len(c) == n
    assert Cluster.from_spec(c.to_spec()) == c


@pytest.mark.slow
@pytest.mark.parametrize("profile", PROFILES)
def test_largest_size(profile):
    c = generate(4096, seed=0, profile=profile)
    assert len(c) == 4096 and np.all(c.bandwidth > 0)


def test_cee_has_three_tiers_and_slow_cross_tier_links():
    c = generate(32, seed=0, profile="cee")
    assert {d.tier for d in c.devices} == {"cloud", "edge", "end"}
    cloud = [i for i, d in enumerate(c.devices) if d.tier == "cloud"]
    edge = [i for i, d in enumerate(c.devices) if d.tier == "edge"]
    cross = c.bandwidth[np.ix_(cloud, edge)] / GBPS
    assert cross.max() <= 1.0 and cross.min() >= 0.08      # around DeepCEE's 100 Mbit/s
    inside = c.bandwidth[np.ix_(cloud, cloud)][~np.eye(len(cloud), dtype=bool)] / GBPS
    assert inside.min() >= 100
    assert min(d.tflops for d in c.devices if d.tier == "cloud") > max(d.tflops for d in c.devices
                                                                       if d.tier == "end")


def test_geo_links_are_wan_scale():
    c = generate(64, seed=2, profile="geo")
    r = c.region_index
    cross = r[:, None] != r[None, :]
    gbps = c.bandwidth[cross] / GBPS
    ms = c.latency[cross] * 1e3
    assert gbps.min() >= 0.02 and gbps.max() <= 4.0
    assert ms.min() >= 5 and ms.max() <= 250
    assert len(c.regions) >= 8


def test_datacenter_is_one_fabric_of_mixed_servers():
    c = generate(64, seed=0, profile="datacenter")
    assert len(c.regions) == 8
    assert len({d.gpu for d in c.devices}) >= 2
    r = c.region_index
    cross = c.bandwidth[r[:, None] != r[None, :]] / GBPS
    assert len(np.unique(cross)) == 1 and cross[0] >= 100


@pytest.mark.parametrize("kwargs, message", [
    ({"n_devices": 1}, "from 2 to 4096"), ({"n_devices": 5000}, "from 2 to 4096"),
    ({"n_devices": 8, "profile": "moon"}, "unknown topology profile"), ({"n_devices": 8, "seed": -1}, "seed"),
])
def test_bad_generator_arguments(kwargs, message):
    with pytest.raises(SpecError, match=message):
        generate(**kwargs)


def test_the_topology_plot_labels_its_latency_scale_and_keeps_links_in_sight():
    import math

    from spantrain.profiler.topoview import _nice_ticks, _region_positions, format_gbps

    # a log colour bar labelled only at its decades showed "10" alone for 3-69 ms, or nothing
    assert _nice_ticks(3.2, 69.0) == [5, 10, 20, 50]
    assert _nice_ticks(0.0182, 0.0184) == [0.0182, 0.0184]  # no 1-2-5 value inside: the ends
    assert format_gbps(2400) == "2.4 Tb/s" and format_gbps(0.05) == "50 Mb/s"  # not "2.4e+03 Gb/s"
    # two end regions sat opposite the cloud, and the link between them ran hidden under theirs
    cluster = generate(12, seed=3, profile="cee")
    pos, geo = _region_positions(cluster)
    ends = [r for r in cluster.regions if r.startswith("end")]
    assert not geo and len(ends) == 2
    (ax, ay), (bx, by) = (pos[r] for r in ends)
    angle = math.degrees(abs(math.atan2(ay, ax) - math.atan2(by, bx))) % 360
    assert min(angle, 360 - angle) == pytest.approx(120)
