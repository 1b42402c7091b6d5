"""`topo show` views at scale: exact vectorized region figures, a capped region table, capped WAN lines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spantrain.cluster import GBPS, Cluster
from spantrain.profiler.topology import generate


def _reference_pair_stats(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """The per-pair loop `topo show` used: the figures the vectorized version must match exactly."""
    idx = cluster.region_index
    r = len(cluster.regions)
    bw, lat = np.zeros((r, r)), np.zeros((r, r))
    groups = [np.nonzero(idx == k)[0] for k in range(r)]
    for a in range(r):
        for b in range(r):
            block_bw = cluster.bandwidth[np.ix_(groups[a], groups[b])]
            block_lat = cluster.latency[np.ix_(groups[a], groups[b])]
            if a == b:
                mask = ~np.eye(len(groups[a]), dtype=bool)
                if not mask.any():
                    link = cluster.network.regions[cluster.regions[a]]
                    bw[a, b], lat[a, b] = link.gbps, link.latency_ms
                    continue
                block_bw, block_lat = block_bw[mask], block_lat[mask]
            bw[a, b] = float(np.median(block_bw)) / GBPS
            lat[a, b] = float(np.median(block_lat)) * 1e3
    return bw, lat


@pytest.mark.parametrize("profile, n", [("cee", 12), ("cee", 90), ("geo", 40), ("datacenter", 48)])
def test_region_pair_stats_match_the_per_pair_loop(profile, n):
    from spantrain.profiler.regionstats import region_pair_stats

    cluster = generate(n, seed=1, profile=profile)
    noise = np.random.default_rng(0).uniform(0.5, 2.0, (n, n))  # measured: every device pair its own figure
    for c in (cluster, cluster.with_arrays(bandwidth=cluster.bandwidth * noise, latency=cluster.latency * noise.T)):
        got, want = region_pair_stats(c), _reference_pair_stats(c)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_the_region_table_is_capped_and_says_what_it_left_out():
    from spantrain.profiler.topoview import tables

    cluster = generate(1024, seed=0, profile="datacenter")  # 128 regions: the table printed all 128
    regions = tables(cluster)[0]
    assert regions.row_count == 64
    assert "first 64 of 128 regions" in regions.caption and "no device table past 64 devices" in regions.caption
    small = tables(generate(64, seed=0, profile="datacenter"), max_regions=3)[0]
    assert small.row_count == 3 and small.caption.startswith("first 3 of 8 regions")
    assert tables(generate(12, seed=0, profile="cee"))[0].caption is None  # nothing left out, nothing said


def _drawn(monkeypatch, cluster, path, **kwargs) -> tuple[int, str]:
    """WAN lines `plot_topology` draws (one per segment), and the title."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    from spantrain.profiler.topoview import plot_topology

    seen = {}
    real = Figure.savefig

    def spy(self, *args, **kw):
        ax = self.axes[0]
        seen["lines"] = len(ax.lines) + sum(len(c.get_segments()) for c in ax.collections
                                            if isinstance(c, LineCollection))
        seen["title"] = ax.get_title()
        return real(self, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    plot_topology(cluster, path, **kwargs)
    return seen["lines"], seen["title"]


def test_the_plot_draws_at_most_some_hundred_wan_lines_and_says_which(monkeypatch, tmp_path):
    from spantrain.profiler.topoview import MAX_WAN_LINES

    # 128 regions: 8,128 pairs, one line each
    lines, title = _drawn(monkeypatch, generate(1024, seed=0, profile="datacenter"), tmp_path / "dc.png")
    assert 128 <= lines <= MAX_WAN_LINES and f"lines: {lines} of 8,128 region pairs, each region's 3 fastest" in title
    lines, title = _drawn(monkeypatch, generate(90, seed=0, profile="cee"), tmp_path / "cee.png", max_lines=20)
    assert lines == 20 and "each region's 3 fastest, the fastest 20" in title
    small = generate(24, seed=0, profile="geo")
    lines, title = _drawn(monkeypatch, small, tmp_path / "small.png")
    r = len(small.regions)
    assert r > 4 and lines == r * (r - 1) // 2 and "lines:" not in title  # every pair, as before


def test_strongest_pairs_keep_each_regions_fastest_link():
    from spantrain.profiler.regionstats import strongest_pairs

    rng = np.random.default_rng(1)
    bw = rng.uniform(0.1, 10, (30, 30))
    bw = (bw + bw.T) / 2
    lat = np.ones((30, 30))
    pairs = strongest_pairs(bw, lat, per_region=1, limit=1000)
    np.fill_diagonal(bw, -np.inf)
    want = {tuple(sorted((a, int(np.argmax(bw[a]))))) for a in range(30)}
    assert {tuple(p) for p in pairs.tolist()} == want
    assert np.all(np.diff(bw[pairs[:, 0], pairs[:, 1]]) >= 0)  # slowest first: the fastest drawn on top
    top = strongest_pairs(bw, lat, per_region=1, limit=5)
    assert len(top) == 5 and set(map(tuple, top.tolist())) <= want


def test_names_without_glyphs_in_the_font_draw_without_warnings(run_cli, tmp_path):
    import warnings

    import yaml

    spec = {"name": "クラスタ🚀", "devices": [{"id": "云-🚀", "count": 2, "region": "東京", "tflops": 10,
                                                 "memory_gb": 16}],
            "network": {"regions": {"東京": {"gbps": 10, "latency_ms": 1}}}}
    path = tmp_path / "uni.yaml"
    path.write_text(yaml.safe_dump(spec, allow_unicode=True), encoding="utf-8")
    plan = tmp_path / "plan.json"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, _, err = run_cli("topo", "show", path, "--plot", tmp_path / "topo.png")
        assert code == 0, err
        code, _, err = run_cli("plan", "-c", path, "-m", "tiny-gpt", "--planner", "ddp", "-o", plan)
        assert code == 0, err
        code, _, err = run_cli("simulate", "-c", path, "-m", "tiny-gpt", "--plan", plan, "--timeline",
                               tmp_path / "t.png")
        assert code == 0, err
    assert (tmp_path / "topo.png").exists() and (tmp_path / "t.png").exists()
    assert not [w for w in caught if "missing from font" in str(w.message)]


def test_the_ring_layout_leaves_room_for_every_disc_and_labels_the_outer_ring_outside(monkeypatch, tmp_path):
    import math
    from collections import Counter

    from matplotlib.axes import Axes

    from spantrain.profiler.topoview import _region_positions, plot_topology

    # 32 datacenter nodes sat on the unit ring: each disc (radius 0.33) overlapped its neighbours
    # three deep and hid every link drawn under them; their labels ran into each other
    cluster = generate(256, seed=0, profile="datacenter")
    pos, geo = _region_positions(cluster)
    counts = Counter(d.region for d in cluster.devices)
    disc = {r: 0.25 * (0.6 + 0.15 * math.sqrt(counts[r])) * 1.3 for r in pos}  # the plot's disc radius
    assert not geo and len(pos) == 32
    names = list(pos)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert math.dist(pos[a], pos[b]) > disc[a] + disc[b], (a, b)
    labels = {}
    real = Axes.annotate

    def spy(self, text, xy, *args, **kwargs):
        labels[text.split("\n")[0]] = xy
        return real(self, text, xy, *args, **kwargs)

    monkeypatch.setattr(Axes, "annotate", spy)
    plot_topology(cluster, tmp_path / "dc.png")
    assert set(labels) == set(pos)
    for r, (x, y) in labels.items():  # beyond its disc, away from the centre (or near that, where crowded)
        px, py = pos[r]
        assert math.dist((x, y), (px, py)) > disc[r], r
        away = math.acos(min(1.0, ((x - px) * px + (y - py) * py) / math.dist((x, y), (px, py)) / math.hypot(px, py)))
        assert away <= math.radians(46), r


def test_a_one_region_plot_names_no_fabric_between_regions(monkeypatch, tmp_path):
    # a one-node datacenter cluster's title gave the default between regions, which no pair of
    # its devices uses, as "one fabric: 200 Gb/s" while its only link is the node's 2.4 Tb/s
    _, title = _drawn(monkeypatch, generate(2, seed=0, profile="datacenter"), tmp_path / "one.png")
    assert "one fabric" not in title, title
    _, title = _drawn(monkeypatch, generate(16, seed=0, profile="datacenter"), tmp_path / "two.png")
    assert "one fabric: " in title, title


def test_a_device_of_huge_tflops_does_not_cover_the_plot(monkeypatch, tmp_path):
    from matplotlib.collections import PathCollection
    from matplotlib.figure import Figure

    from spantrain.profiler.topoview import plot_topology

    # marker area grew linearly with tflops: a device of 1e30 TFLOP/s (the spec's limit) painted
    # the whole figure one colour, hiding every region, label and link
    spec = {"name": "huge", "devices": [{"id": "a", "region": "r1", "tflops": 1e30, "memory_gb": 16},
                                        {"id": "b", "region": "r2", "tflops": 10, "memory_gb": 16}],
            "network": {"regions": {"r1": {"gbps": 10, "latency_ms": 0.1}, "r2": {"gbps": 10, "latency_ms": 0.1}},
                        "default": {"gbps": 1, "latency_ms": 10}}}
    seen = {}
    real = Figure.savefig

    def spy(self, *args, **kw):
        seen["sizes"] = [float(s) for c in self.axes[0].collections if isinstance(c, PathCollection)
                         for s in c.get_sizes()]
        return real(self, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    plot_topology(Cluster.from_spec(spec), tmp_path / "t.png")
    assert seen["sizes"] and max(seen["sizes"]) <= 300, seen["sizes"]
    assert 12 + 0.5 * 10 in seen["sizes"]  # an ordinary device keeps its size


def _label_boxes(monkeypatch, cluster, path):
    """Pixel boxes of the region labels as saved, and the discs (centre x, y, radius in pixels)."""
    from matplotlib.collections import PatchCollection
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation

    from spantrain.profiler.topoview import plot_topology

    seen = {}
    real = Figure.savefig

    def spy(self, *args, **kw):
        ax = self.axes[0]
        renderer = self.canvas.get_renderer()
        seen["labels"] = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts if isinstance(t, Annotation)]
        discs = next(c for c in ax.collections if isinstance(c, PatchCollection))
        seen["discs"] = []
        for path_ in discs.get_paths():
            (x0, y0), (x1, y1) = ax.transData.transform(path_.get_extents().get_points())
            seen["discs"].append(((x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2))
        seen["title"] = ax.get_title()
        return real(self, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    plot_topology(cluster, path)
    return seen["labels"], seen["discs"], seen["title"]


@pytest.mark.parametrize("profile, devices, seed", [("cee", 256, 0), ("geo", 32, 3), ("geo", 32, 1), ("cee", 96, 2)])
def test_region_labels_overlap_no_other_label_or_disc(monkeypatch, tmp_path, profile, devices, seed):
    # on close cities (London, Frankfurt, Stockholm) and cee-256's inner rings the labels lay over
    # each other and over their neighbours' discs, unreadable
    cluster = generate(devices, seed=seed, profile=profile)
    labels, discs, title = _label_boxes(monkeypatch, cluster, tmp_path / "t.png")
    regions = len(cluster.regions)
    assert len(labels) >= 0.9 * regions, (len(labels), regions)  # crowded ones may go, not most
    names = [text.split("\n")[0] for text, _ in labels]
    assert len(set(names)) == len(names) and set(names) <= set(cluster.regions)
    left_out = regions - len(labels)
    assert (f"{left_out} crowded label" in title) == (left_out > 0), title
    for i, (a, box) in enumerate(labels):
        for b, other in labels[i + 1:]:
            assert not box.overlaps(other), (a, b)
        for cx, cy, r in discs:
            nx, ny = min(max(cx, box.x0), box.x1), min(max(cy, box.y0), box.y1)
            assert math.hypot(cx - nx, cy - ny) >= r - 0.5, (a, (cx, cy, r))


@pytest.mark.parametrize("profile, devices, seed", [("geo", 32, 1), ("geo", 24, 0), ("geo", 512, 0), ("cee", 96, 2),
                                                    ("datacenter", 48, 0)])
def test_the_legend_and_axis_labels_lie_inside_the_figure(monkeypatch, tmp_path, profile, devices, seed):
    # geo-32 seed 1: "latitude" and the legend's right edge were cut off (tight_layout measured the
    # map at its equal-aspect size before the layout)
    from matplotlib.figure import Figure

    from spantrain.profiler.topoview import plot_topology

    seen = {}
    real = Figure.savefig

    def spy(self, *args, **kw):
        renderer = self.canvas.get_renderer()
        boxes = {}
        for k, ax in enumerate(self.axes):
            for what, artist in (("legend", ax.get_legend()), ("xlabel", ax.xaxis.label), ("ylabel", ax.yaxis.label),
                                 ("title", ax.title)):
                if artist is not None and artist.get_visible() and (what == "legend" or artist.get_text()):
                    boxes[f"axes {k} {what}"] = artist.get_window_extent(renderer)
            boxes[f"axes {k}, all of it"] = ax.get_tightbbox(renderer)
        seen["boxes"], seen["canvas"] = boxes, self.bbox
        return real(self, *args, **kw)

    monkeypatch.setattr(Figure, "savefig", spy)
    plot_topology(generate(devices, seed=seed, profile=profile), tmp_path / "t.png")
    canvas, boxes = seen["canvas"], seen["boxes"]
    assert "axes 0 legend" in boxes and ("axes 0 ylabel" in boxes) == (profile == "geo")
    for what, box in boxes.items():
        assert box.x0 >= canvas.x0 and box.y0 >= canvas.y0 and box.x1 <= canvas.x1 and box.y1 <= canvas.y1, \
            (what, box, canvas)


def _closest_markers(monkeypatch, cluster, path) -> list[float]:
    """Per region of several devices: its two closest markers' distance over their radii's sum, as saved
    (under 1: they overlap)."""
    from matplotlib.collections import PathCollection
    from matplotlib.figure import Figure

    from spantrain.profiler.topoview import plot_topology

    seen = []
    real = Figure.savefig

    def spy(self, *args, **kw):
        ax = self.axes[0]
        dots = next(c for c in ax.collections if isinstance(c, PathCollection) and len(c.get_offsets()))
        xy = ax.transData.transform(dots.get_offsets())
        r = np.sqrt(dots.get_sizes()) / 2 * self.dpi / 72
        start = 0
        for n in np.bincount(cluster.region_index, minlength=len(cluster.regions)):  # drawn region by region
            m, start = np.arange(start, start + n), start + n
            if n > 1:
                apart = np.hypot(*(xy[m][:, None] - xy[m][None]).transpose(2, 0, 1)) / (r[m][:, None] + r[m][None])
                seen.append(float(apart[~np.eye(len(m), dtype=bool)].min()))
        return real(self, *args, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(Figure, "savefig", spy)
        plot_topology(cluster, path)
    return seen


def test_a_crowded_regions_devices_stand_apart(monkeypatch, tmp_path):
    # geo-512's cities put 11 to 31 devices on a ring: a cogwheel of markers over each other in
    # every city (the closest two 0.29 of their width apart in the median city)
    ratios = _closest_markers(monkeypatch, generate(512, seed=0, profile="geo"), tmp_path / "geo.png")
    assert len(ratios) == 24 and np.median(ratios) > 0.5, ratios
    # where markers made at most _MIN_MARKER_SHRINK smaller fit, none overlaps (9 of geo-64's 16
    # cities' did, 4 of cee-256's regions)
    for profile, n in (("geo", 64), ("cee", 256)):
        ratios = _closest_markers(monkeypatch, generate(n, seed=0, profile=profile), tmp_path / f"{profile}.png")
        assert min(ratios) > 0.99, (profile, sorted(ratios)[:3])
