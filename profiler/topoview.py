"""Human views of a cluster: rich tables and a topology plot."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from spantrain._figures import glyphs_may_be_missing, plain_text
from spantrain._spec import plural, readable
from spantrain.cluster import Cluster
from spantrain.profiler.regionstats import RegionStats, region_stats, strongest_pairs

__all__ = ["region_summary", "region_links", "tables", "plot_topology", "format_gbps", "MAX_WAN_LINES",
           "WAN_LINES_PER_REGION"]

_TIER_ORDER = {"cloud": 0, "edge": 1, "end": 2}
MAX_WAN_LINES = 300
"""The plot draws every region pair up to this many; past it, the strongest (see `strongest_pairs`)."""
WAN_LINES_PER_REGION = 3
"""Past `MAX_WAN_LINES`, each region's this many fastest links are candidates."""
MAX_LABELLED_REGIONS = 60
"""The plot labels regions up to this many (past it, the tables name them)."""
_DPI = 110


def format_gbps(gbps: float) -> str:
    if gbps >= 1000:  # NVLink-class fabrics: "2.4 Tb/s", not "2.4e+03 Gb/s"
        return f"{gbps / 1000:.3g} Tb/s"
    if gbps >= 1:
        return f"{gbps:.3g} Gb/s"
    return f"{gbps * 1000:.3g} Mb/s"


def region_summary(cluster: Cluster, *, stats: RegionStats | None = None) -> list[dict]:
    """Per region: tier, devices, GPU mix, total TFLOP/s and memory, LAN bandwidth/latency.
    `stats`: `region_stats(cluster)` when the caller has it already."""
    groups, bw, lat = region_stats(cluster) if stats is None else stats
    out = []
    for k, region in enumerate(cluster.regions):
        members = [cluster.devices[i] for i in groups[k]]
        if len(members) > 1:
            lan_gbps, lan_ms = float(bw[k, k]), float(lat[k, k])
        else:  # the spec figure as written (an int stays an int in `--json`)
            link = cluster.network.regions[region]
            lan_gbps, lan_ms = link.gbps, link.latency_ms
        gpus = Counter(d.gpu or "?" for d in members)
        out.append({"region": region, "tier": members[0].tier, "devices": len(members),
                    "gpus": ", ".join(f"{c}x {g}" for g, c in gpus.most_common()),
                    "tflops": sum(d.tflops for d in members), "memory_gb": sum(d.memory_gb for d in members),
                    "lan_gbps": lan_gbps, "lan_ms": lan_ms})
    return out


def region_links(cluster: Cluster, *, stats: RegionStats | None = None) -> list[dict]:
    """Median bandwidth and latency for every ordered pair of different regions."""
    _, bw, lat = region_stats(cluster) if stats is None else stats
    regions = cluster.regions
    bws, lats = bw.tolist(), lat.tolist()  # Python floats at once: float() per pair was most of the time
    return [{"from": ra, "to": rb, "gbps": bw_a[b], "latency_ms": lat_a[b]}
            for a, (ra, bw_a, lat_a) in enumerate(zip(regions, bws, lats)) for b, rb in enumerate(regions) if a != b]


def tables(cluster: Cluster, max_devices: int = 64, max_matrix: int = 6, max_compact: int = 16,
           max_regions: int = 64, *, stats: RegionStats | None = None):
    """Rich renderables: regions (first `max_regions`), devices (up to `max_devices`), links by region pair."""
    from rich.table import Table

    stats = region_stats(cluster) if stats is None else stats
    _, bw, lat = stats
    summary = region_summary(cluster, stats=stats)
    regions = cluster.regions
    total_tf = sum(d.tflops for d in cluster.devices)
    total_mem = sum(d.memory_gb for d in cluster.devices)
    out = []
    t = Table(title=f"{cluster.name}: {plural(len(cluster), 'device')} in {plural(len(regions), 'region')}, "
                    f"{readable(total_tf)} TFLOP/s, {readable(total_mem)} GB")
    for col in ("region", "tier", "devices", "GPUs", "TFLOP/s", "memory GB", "LAN", "LAN latency"):
        t.add_column(col, justify="right" if col not in ("region", "tier", "GPUs") else "left")
    for s in summary[:max_regions]:
        # a region of one device has no pair inside: its spec figure (a profile's placeholder) is never used
        alone = s["devices"] == 1
        t.add_row(s["region"], s["tier"], str(s["devices"]), s["gpus"], readable(s["tflops"]),
                  readable(s["memory_gb"]), "- (one device)" if alone else format_gbps(s["lan_gbps"]),
                  "-" if alone else f"{s['lan_ms']:.3g} ms")
    left_out = []
    if len(regions) > max_regions:
        left_out.append(f"first {max_regions} of {len(regions):,} regions (all in `topo show --json`)")
    if len(cluster) > max_devices:
        left_out.append(f"no device table past {max_devices} devices")
    if left_out:
        t.caption = "; ".join(left_out)
    out.append(t)

    if len(cluster) <= max_devices:
        t = Table(title="devices")
        for col in ("id", "region", "tier", "gpu", "TFLOP/s", "memory GB"):
            t.add_column(col, justify="right" if col in ("TFLOP/s", "memory GB") else "left")
        for d in cluster.devices:
            t.add_row(d.id, d.region, d.tier, d.gpu, f"{d.tflops:g}", f"{d.memory_gb:g}")
        out.append(t)

    if len(regions) <= max_matrix:
        t = Table(title="links between regions (median bandwidth / latency)")
        t.add_column("from \\ to")
        for r in regions:
            t.add_column(r, justify="right")
        lone = {s["region"] for s in summary if s["devices"] == 1}
        for a, ra in enumerate(regions):
            # as the region table says it: a one-device region has no link inside (10 Gb/s here read as one)
            t.add_row(ra, *["- (one device)" if a == b and ra in lone
                            else f"{format_gbps(bw[a, b])}\n{lat[a, b]:.3g} ms" for b in range(len(regions))])
        out.append(t)
    elif len(regions) <= max_compact:
        t = Table(title="bandwidth between regions (Gbit/s, median; latency in `topo show --json`)")
        t.add_column("from \\ to")
        for k in range(len(regions)):
            t.add_column(str(k), justify="right")
        for a, ra in enumerate(regions):
            t.add_row(f"{a} {ra}", *[f"{bw[a, b]:.2g}" for b in range(len(regions))])
        out.append(t)
    else:
        # Too many regions for a matrix: summarize by tier pair.
        t = Table(title="links between regions, by tier pair")
        for col in ("tiers", "region pairs", "bandwidth min / median / max", "latency min / median / max"):
            t.add_column(col)
        for key, (b, lt) in _tier_pairs([s["tier"] for s in summary], bw, lat):
            t.add_row(" - ".join(key), str(len(b)),
                      " / ".join(format_gbps(x) for x in (b.min(), np.median(b), b.max())),
                      " / ".join(f"{x:.3g} ms" for x in (lt.min(), np.median(lt), lt.max())))
        out.append(t)
    return out


def _tier_pairs(tiers: list[str], bw: np.ndarray, lat: np.ndarray) -> list[tuple[tuple[str, ...], tuple]]:
    """Bandwidths and latencies of region pairs a < b grouped by their tiers (cloud first), sorted by tiers."""
    names, code = np.unique(np.array(tiers, dtype=object), return_inverse=True)
    a, b = np.triu_indices(len(tiers), 1)
    pair_code = code[a] * len(names) + code[b]
    groups: dict[tuple[str, ...], list[np.ndarray]] = {}
    for c in np.unique(pair_code).tolist():
        key = tuple(sorted((names[c // len(names)], names[c % len(names)]), key=lambda x: _TIER_ORDER.get(x, 9)))
        groups.setdefault(key, []).append(np.nonzero(pair_code == c)[0])
    out = []
    for key, parts in sorted(groups.items()):
        sel = np.sort(np.concatenate(parts))
        out.append((key, (bw[a[sel], b[sel]], lat[a[sel], b[sel]])))
    return out


def _region_positions(cluster: Cluster) -> tuple[dict[str, tuple[float, float]], bool]:
    """Region centres, and whether they are geographic (longitude, latitude)."""
    from spantrain.profiler.topology import CITIES

    regions = cluster.regions
    if len(regions) > 1 and all(r in CITIES for r in regions):
        return {r: (CITIES[r][1], CITIES[r][0]) for r in regions}, True
    # Concentric rings by tier: cloud inside, end outside.
    tiers = {d.region: d.tier for d in cluster.devices}
    counts = Counter(d.region for d in cluster.devices)
    rings: dict[int, list[str]] = {}
    for r in regions:
        rings.setdefault(_TIER_ORDER.get(tiers[r], 3), []).append(r)
    pos = {}
    inner_edge = None  # the outer edge of the ring inside this one
    for level in sorted(rings):
        members = rings[level]
        widest = max(_disc_radius(counts[r], _RING_SCALE) for r in members)
        if level == 0 and len(members) == 1:
            radius = 0.0
        else:
            # room for every disc: 32 datacenter nodes on the unit ring overlapped each other
            # three deep and hid every link under them
            radius = max(1.0 + level, max(3, len(members)) * (2 * widest + _DISC_GAP) / (2 * math.pi),
                         0.0 if inner_edge is None else inner_edge + widest + _DISC_GAP)
        inner_edge = radius + widest
        for k, r in enumerate(members):
            # two in a ring: 120 degrees apart, not opposite, where their link would run through the centre
            angle = 2 * math.pi * k / max(3, len(members)) + level * 0.4
            pos[r] = (radius * math.cos(angle), radius * math.sin(angle))
    return pos, False


_MAX_MARKER_TFLOPS = 500.0
"""TFLOP/s past which a device's marker grows no more (the catalog's fastest, H100, is 400): its area was
linear in tflops, and a device of 1e30 (the spec's limit) painted the whole plot and took minutes to draw."""
_SUNFLOWER = math.pi * (3 - math.sqrt(5))
"""The golden angle: devices turned by it, at radii growing as the square root, spread evenly over a disc."""
_SUNFLOWER_SPACING = 0.872
"""A sunflower of n devices in radius R keeps neighbours 0.872 R sqrt(pi / n) apart (measured, any n)."""
_MIN_MARKER_SHRINK = 0.3
"""Markers are made at most this much smaller (in area) to keep crowded regions' devices apart:
smaller still, the slowest devices' markers were specks whose colour no one could tell."""
_RING_SCALE = 0.25
"""Disc scale of the ring layout (regions that are not cities), in ring units."""
_DISC_GAP = 0.15
"""Space left between two discs of the ring layout, in ring units."""


def _disc_radius(devices: int, scale: float) -> float:
    """Radius of a region's disc: its devices sit on a ring inside it."""
    return scale * (0.6 + 0.15 * math.sqrt(devices)) * 1.3


def _nice_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks inside [lo, hi]; the two ends, rounded, when fewer than two fall inside."""
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
             for m in (1, 2, 5) if lo <= m * 10.0**e <= hi]
    return ticks if len(ticks) >= 2 else [lo, hi]


@plain_text
def plot_topology(cluster: Cluster, path: str | Path, max_lines: int = MAX_WAN_LINES,
                  per_region: int = WAN_LINES_PER_REGION, *, stats: RegionStats | None = None) -> Path:
    """Regions as labelled discs with their devices on a ring in them (spread over a crowded one's
    disc, all markers smaller where they would overlap), links drawn by bandwidth: every
    region pair up to `max_lines`, else each region's `per_region` fastest, at most `max_lines`."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import cm, colors
    from matplotlib.collections import LineCollection, PatchCollection

    pos, geo = _region_positions(cluster)
    regions = cluster.regions
    groups, bw, lat = region_stats(cluster) if stats is None else stats
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    span = max(1e-9, max(xs) - min(xs), max(ys) - min(ys))
    scale = _RING_SCALE
    height = 8.0
    if geo:  # discs apart from their nearest neighbour (Paris, Frankfurt), a figure the map's shape
        xy = np.array(list(pos.values()))
        dist = np.hypot(*(xy[:, None, :] - xy[None, :, :]).transpose(2, 0, 1))
        nearest = float(dist[np.triu_indices(len(xy), 1)].min()) if len(xy) > 1 else span
        scale = max(span / 80, min(span / 40, 0.37 * nearest))
        height = min(8.0, max(3.5, 9.5 * (max(ys) - min(ys) + 8 * scale) / (max(xs) - min(xs) + 8 * scale) + 2.0))

    fig, ax = plt.subplots(figsize=(12, height), dpi=_DPI)  # the dpi it is saved at: label boxes measured as drawn
    off = ~np.eye(len(regions), dtype=bool)
    wan_lat = lat[off] if off.any() else np.array([1.0])
    lat_norm = colors.LogNorm(vmin=max(1e-3, wan_lat.min()), vmax=max(wan_lat.max(), wan_lat.min() * 1.01, 1e-2))
    # plasma without its pale-yellow end, which vanished on white for the slowest links
    cmap = colors.LinearSegmentedColormap.from_list("latency", cm.plasma(np.linspace(0.0, 0.85, 256)))
    n_pairs = len(regions) * (len(regions) - 1) // 2
    if n_pairs <= max_lines:  # every pair, slowest first so the fastest lie on top
        a, b = np.triu_indices(len(regions), 1)
        order = np.lexsort((b, a, bw[a, b]))
        wan = np.stack([a[order], b[order]], axis=1)
    else:
        wan = strongest_pairs(bw, lat, per_region, max_lines)
    if len(wan):
        lo, hi = float(bw[off].min()), float(bw[off].max())  # widths on the scale of every pair, drawn or not
        g = bw[wan[:, 0], wan[:, 1]]
        widths = 1.0 + 5.0 * (np.log10(g / lo) / math.log10(hi / lo) if hi > lo else 0.5)
        xy = np.array([pos[r] for r in regions])
        ax.add_collection(LineCollection(xy[wan], colors=cmap(lat_norm(lat[wan[:, 0], wan[:, 1]])),
                                         linewidths=widths, alpha=0.55 if len(wan) < 60 else 0.25, zorder=1))

    # a spec may leave gpu out: "?" in the legend, as in the region table (an empty label is
    # left out of it, and with no label at all matplotlib warns on stderr)
    gpus = sorted({d.gpu or "?" for d in cluster.devices})
    gpu_colors = {g: cm.tab10(i % 10) for i, g in enumerate(gpus)}
    dots: dict[str, list] = {"x": [], "y": [], "s": [], "color": []}
    discs = []
    labels: list[_Label] = []
    crowding: list[tuple[tuple[float, float], float, int, int]] = []  # centre, neighbours' distance, devices
    centres = np.array([pos[r] for r in regions])
    outermost = float(np.hypot(centres[:, 0], centres[:, 1]).max())
    for k, r in enumerate(regions):
        x, y = pos[r]
        members = [cluster.devices[i] for i in groups[k]]
        n = len(members)
        ring = _disc_radius(n, scale) / 1.3
        discs.append(plt.Circle((x, y), ring * 1.3))
        # on a ring while that keeps neighbours further apart, else spread over the disc: 31 devices on
        # geo-512's ring were a cogwheel of markers over each other
        fill = n > 1 and _SUNFLOWER_SPACING * math.sqrt(math.pi / n) > 2 * math.sin(math.pi / n)
        if n > 1:
            apart = ring * (_SUNFLOWER_SPACING * math.sqrt(math.pi / n) if fill else 2 * math.sin(math.pi / n))
            crowding.append(((x, y), apart, len(dots["s"]), n))
        for j, d in enumerate(members):
            if fill:
                ang, rad = j * _SUNFLOWER, ring * math.sqrt((j + 0.5) / n)
            else:
                ang, rad = 2 * math.pi * j / max(1, n), 0 if n == 1 else ring
            dots["x"].append(x + rad * math.cos(ang))
            dots["y"].append(y + rad * math.sin(ang))
            dots["s"].append(12 + 0.5 * min(d.tflops, _MAX_MARKER_TFLOPS))
            dots["color"].append(gpu_colors[d.gpu or "?"])
        if len(regions) <= MAX_LABELLED_REGIONS:
            lan = f", {format_gbps(bw[k, k])}" if n > 1 else ""  # one device: no LAN to speak of
            # the outer ring's away from the centre: out there lies no other ring
            outward = (not geo and math.hypot(x, y) > outermost - 1e-9 > 0)
            labels.append(_Label(name=r, text=f"{r}\n{n} dev{lan}", centre=(x, y), disc=ring * 1.3,
                                 ring=0.0 if n == 1 else ring, marker=max(dots["s"][-n:]),
                                 outward=math.atan2(y, x) if outward else None))
    ax.add_collection(PatchCollection(discs, facecolor="0.92", edgecolor="0.5", zorder=2))
    # one collection for every device: one scatter call per device took 18 s at 4,096 devices
    markers = ax.scatter(dots["x"], dots["y"], s=dots["s"], c=dots["color"], edgecolor="k", linewidth=0.3, zorder=3)
    sizes = np.array(dots["s"], dtype=float)
    for g in gpus:
        ax.scatter([], [], color=gpu_colors[g], edgecolor="k", label=g)
    # beside the map, not on it: it covered Oregon
    ax.legend(title="GPU (marker size ~ TFLOP/s)", loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              title_fontsize=8, framealpha=0.85)
    avoid = [ax.get_legend()]
    if len(regions) > 1 and wan_lat.max() > wan_lat.min() * 1.01:  # one latency (one fabric): the title says it
        sm = cm.ScalarMappable(norm=lat_norm, cmap=cmap)
        bar = fig.colorbar(sm, ax=ax, orientation="horizontal", fraction=0.04, pad=0.14 if geo else 0.06, aspect=40,
                           label="latency between regions (ms)")
        bar.set_ticks(_nice_ticks(lat_norm.vmin, lat_norm.vmax))  # a log axis labelled only its decades: 1 or none
        bar.ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))
        bar.ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        avoid.append(bar.ax)
    note = "line width ~ log bandwidth"
    drawn = ""
    if len(wan) < n_pairs:  # say which links the lines are: not every pair's (a line of its own: one was cut off)
        drawn = (f"\nlines: {len(wan):,} of {n_pairs:,} region pairs, each region's {per_region} fastest"
                 + (f", the fastest {max_lines}" if len(wan) == max_lines else ""))
    # between regions only: one region's devices never use it (a 2-GPU node's title said "one fabric:
    # 200 Gb/s" beside its label's 2.4 Tb/s, its only link)
    if cluster.network.default is not None and not cluster.network.links and len(regions) > 1:
        note += f"; one fabric: {format_gbps(cluster.network.default.gbps)}, {cluster.network.default.latency_ms:g} ms"
    ax.set_aspect("equal")
    ax.margins(0.08, 0.2 if geo else 0.08)  # whole discs and labels at the edges (Oregon's disc was cut)
    ax.autoscale_view()
    if geo:
        ax.set_xlabel("longitude")
        ax.set_ylabel("latitude")
    else:
        ax.axis("off")
    title = ax.set_title(f"{cluster.name}: {plural(len(cluster), 'device')}, {plural(len(regions), 'region')} "
                         f"({note})" + drawn, fontsize=10)
    with glyphs_may_be_missing():
        # the layout first, with each label where it would go alone (so there is room for the outer
        # ones); then the labels placed for good in that layout, which nothing moves afterwards
        rough = [ax.text(lb.centre[0], lb.centre[1] - lb.disc * 1.45, lb.text, ha="center", va="top", fontsize=7)
                 for lb in labels]
        head = title.get_text()
        for again in (False, True):
            _lay_out(fig, ax)
            # one factor for every marker, so that sizes still compare TFLOP/s across regions
            shrink = _marker_shrink(fig, ax, crowding, sizes)
            markers.set_sizes(sizes * shrink)
            dots["s"] = list(sizes * shrink)
            for t in rough:
                t.remove()
            rough, left_out = _place_labels(fig, ax, [replace(lb, marker=lb.marker * shrink)
                                                      for lb in labels], dots, [title, *avoid], geo)
            title.set_text(head + (("; " if drawn else "\n") + f"{plural(left_out, 'crowded label')} left out "
                                   "(spantrain topo show lists every region)" if left_out else ""))
            if not left_out or again:
                break
            # a line more in the title ran off the figure's top: laid out again, labels placed again
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=_DPI)
    plt.close(fig)
    return path


def _lay_out(fig, ax) -> None:
    """tight_layout until the axes' labels and the legend fit the figure: it measures the map at its
    equal-aspect size before the layout, so once (geo-32 seed 1) it cut "latitude" and the legend's edge."""
    for _ in range(4):
        fig.tight_layout()
        ax.apply_aspect()  # else done at draw time: the axes measured before it were another size
        box = fig.get_tightbbox(fig.canvas.get_renderer()).transformed(fig.dpi_scale_trans)
        if box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1:
            return


def _marker_shrink(fig, ax, crowding: list, sizes: np.ndarray) -> float:
    """The factor on marker areas that keeps each region's neighbouring markers from overlapping, laid
    out as the figure is: 1 where they stand apart, at least _MIN_MARKER_SHRINK."""
    pt = fig.dpi / 72  # marker sizes are points squared
    shrink = 1.0
    for centre, apart, first, n in crowding:
        widest = math.sqrt(float(sizes[first:first + n].max())) * pt
        shrink = min(shrink, (_disc_px(ax, centre, apart) / widest) ** 2)
    return max(_MIN_MARKER_SHRINK, shrink)


def _disc_px(ax, centre: tuple[float, float], radius: float) -> float:
    """A disc's radius in display pixels (the axes keep an equal aspect)."""
    (x0, _), (x1, _) = ax.transData.transform([centre, (centre[0] + radius, centre[1])])
    return abs(x1 - x0)


def _label_angles(outward: float | None) -> list[float]:
    """Directions to try a region's label in, best first: away from the centre on the outer ring
    (and beside that), else below, above, right, left and the diagonals."""
    if outward is not None:
        return [outward + d * math.pi / 8 for d in (0, 1, -1, 2, -2)]
    return [math.radians(a) for a in (-90, 90, 0, 180, -45, -135, 45, 135)]


@dataclass(frozen=True)
class _Label:
    """A region's label and what it must keep clear of: its disc, its devices' markers."""

    name: str
    text: str
    centre: tuple[float, float]
    disc: float
    """Disc radius, in data units."""
    ring: float
    """Radius of the ring its devices sit on, in data units."""
    marker: float
    """Largest device marker size (points squared)."""
    outward: float | None
    """Angle away from the plot's centre on the ring layout's outer ring, else None."""


def _place_labels(fig, ax, labels: list[_Label], dots: dict[str, list], avoid: list, geo: bool) -> tuple[list, int]:
    """Draw each region's label beside its disc where it overlaps no other label, disc, device,
    the title or the legend, and stays inside the map (geo) or the figure; where none of its
    places is free, its name alone, smaller; else none (on cee-256's inner rings and close cities
    the labels lay over each other and their neighbours' discs). Returns the labels drawn and how
    many were left out."""
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    pt = fig.dpi / 72  # marker sizes are points squared
    # discs and devices as circles in pixels: a label must miss them all
    circles = [(*to_px(lb.centre), _disc_px(ax, lb.centre, lb.disc)) for lb in labels]
    circles += [(*to_px((x, y)), math.sqrt(s) / 2 * pt) for x, y, s in zip(dots["x"], dots["y"], dots["s"])]
    circ = np.array(circles, dtype=float).reshape(-1, 3)
    inside = ax.get_window_extent(renderer) if geo else fig.bbox
    taken = [a.get_window_extent(renderer) for a in avoid]
    probe = ax.text(0, 0, "", fontsize=7)
    drawn, left_out = [], 0
    for lb in labels:
        cx, cy = to_px(lb.centre)
        # clear of the disc and of markers larger than it (an H100's stands out of a small city's disc)
        gap = max(_disc_px(ax, lb.centre, lb.disc),
                  _disc_px(ax, lb.centre, lb.ring) + math.sqrt(lb.marker) / 2 * pt) + 3
        placed = None
        for text, size in ((lb.text, 7), (lb.name, 7), (lb.name, 6)):
            for angle in _label_angles(lb.outward):
                dx, dy = math.cos(angle), math.sin(angle)
                ha = "left" if dx > 0.35 else "right" if dx < -0.35 else "center"
                va = "bottom" if dy > 0.35 else "top" if dy < -0.35 else "center"
                at = ax.transData.inverted().transform((cx + gap * dx, cy + gap * dy))
                probe.update({"text": text, "fontsize": size, "ha": ha, "va": va, "position": at})
                box = probe.get_window_extent(renderer).padded(1.5)
                if _free(box, inside, taken, circ):
                    placed = (text, size, ha, va, at, box)
                    break
            if placed:
                break
        if placed is None:
            left_out += 1
            continue
        text, size, ha, va, at, box = placed
        drawn.append(ax.annotate(text, tuple(at), ha=ha, va=va, fontsize=size, zorder=4, gid="region-label"))
        taken.append(Bbox(box.get_points()))
    probe.remove()
    return drawn, left_out


def _free(box, inside, taken: list, circles: np.ndarray) -> bool:
    """Whether a label's box lies within `inside` and overlaps no box of `taken` and no circle."""
    if not (box.x0 >= inside.x0 and box.y0 >= inside.y0 and box.x1 <= inside.x1 and box.y1 <= inside.y1):
        return False
    if any(box.overlaps(t) for t in taken):
        return False
    if len(circles):
        # the nearest point of the box to each centre, nearer than the radius: they meet
        nx = np.clip(circles[:, 0], box.x0, box.x1)
        ny = np.clip(circles[:, 1], box.y0, box.y1)
        if np.any(np.hypot(circles[:, 0] - nx, circles[:, 1] - ny) < circles[:, 2]):
            return False
    return True
