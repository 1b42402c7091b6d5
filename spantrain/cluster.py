"""The cluster: devices and the network between every ordered pair of them.

A `Cluster` is built from the cluster spec file of DESIGN.md (YAML or JSON) and saved
back to it. The network section is declarative (per-region, per region pair, default,
per device pair); the cluster turns it into two dense arrays indexed by device position:
`bandwidth[i, j]` in bytes/s and `latency[i, j]` in seconds, for traffic from i to j.
The arrays are the truth: a cluster whose arrays were changed (a network change, a
measured profile) saves the differences as device-pair overrides, so files round-trip.

Spec extensions beyond DESIGN.md (all optional): a device may carry `host` and
`local_rank` (where the profiler measured it), and `layer_times` (measured per-layer
forward/backward seconds for a model, used by the cost model instead of FLOP counts);
an override may be directional, written `{from: a, to: b, ...}` instead of `between`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from spantrain._spec import (
    FIGURE_MAX,
    FIGURE_MIN,
    check_keys,
    fmt_number,
    is_figure,
    nonempty_str,
    nonneg_number,
    other_kind,
    positive_int,
    positive_number,
    read_structured,
    save_text,
    shown,
)
from spantrain.errors import SpecError, join_problems

__all__ = ["GBPS", "MAX_DEVICES", "LayerTimes", "Device", "NetLink", "Network", "Cluster"]

GBPS = 1e9 / 8
"""Bytes per second in one Gbit/s."""
MAX_DEVICES = 4096
"""Most devices a cluster may have (the dense pair arrays grow with its square)."""

_DEVICE_KEYS = {"id", "count", "region", "tier", "gpu", "tflops", "memory_gb", "host", "local_rank",
                "layer_times"}
_LINK_KEYS = {"gbps", "latency_ms"}
# A device-pair override may add a figure in the unit the arrays hold, which wins: a few percent
# of bandwidths (bytes/s) have no gbps figure that reads back to them, and of latencies (s) no
# latency_ms figure. Saved specs keep the spec's own keys (DESIGN.md) and add these beside them.
_BASE_KEYS = {"gbps": "bytes_per_s", "latency_ms": "latency_s"}
# and measured layer times in seconds: about 2 % of times have no ms figure that reads back to them
_TIME_KEYS = {"forward_ms": "forward_s", "backward_ms": "backward_s"}
_SAME_FIGURE = 1e-6
"""How far (relative) a figure and its base-unit twin may differ: a rounding, not another value."""


@dataclass(frozen=True, kw_only=True)
class LayerTimes:
    """Measured compute times of one device on one model's layers."""

    batch: int
    """Micro-batch size (samples) the times were measured at."""
    forward_s: tuple[float, ...]
    """Forward seconds per layer for one micro-batch of `batch` samples."""
    backward_s: tuple[float, ...]
    """Backward seconds (input plus weight gradient) per layer for the same micro-batch."""

    def __post_init__(self) -> None:
        # built in code, unequal lengths were taken and saved to a spec that could not be read back
        problems: list[str] = []
        positive_int({"batch": self.batch}, "batch", "layer_times", problems)
        for key in ("forward_s", "backward_s"):
            vals = getattr(self, key)
            # up to the seconds a spec holds (FIGURE_MAX ms): 1e28 s was taken and saved as a time no spec reads
            if isinstance(vals, str) or not isinstance(vals, tuple | list) or not vals \
                    or not all(is_figure(v) and v <= FIGURE_MAX / 1e3 for v in vals):
                problems.append(f"layer_times: {key} must be a non-empty tuple of numbers from 0 to "
                                f"{FIGURE_MAX / 1e3:g}, got {shown(vals)}")
        if not problems and len(self.forward_s) != len(self.backward_s):
            problems.append(f"layer_times: forward_s and backward_s have different lengths "
                            f"({len(self.forward_s)} and {len(self.backward_s)})")
        if problems:
            raise SpecError(join_problems(problems))

    def to_spec(self) -> dict[str, Any]:
        """Times in ms; a list holding a time no ms figure reads back to exactly is also given in
        seconds (`forward_s`, `backward_s`), which readers that know it take instead."""
        out: dict[str, Any] = {"batch": self.batch}
        for key, times in (("forward_ms", self.forward_s), ("backward_ms", self.backward_s)):
            figures = [_in_unit(t, 1e3, _from_ms) for t in times]
            out[key] = [fmt_number(t * 1e3) if f is None else f for t, f in zip(times, figures, strict=True)]
            if None in figures:
                out[_TIME_KEYS[key]] = [fmt_number(t) for t in times]
        return out


@dataclass(frozen=True, kw_only=True)
class Device:
    """One accelerator (or CPU process standing in for one)."""

    id: str
    """Unique name, used by plans."""
    region: str
    """Network region; must be listed under `network.regions`."""
    tier: str = "cloud"
    """Free label such as cloud, edge or end."""
    gpu: str = ""
    """Hardware label, informational."""
    tflops: float
    """Sustained dense TFLOP/s on the workload's layers (not datasheet peak)."""
    memory_gb: float
    """Memory available for training, GB (1e9 bytes)."""
    host: str | None = None
    """Host the profiler measured this device on (maps plan devices to processes)."""
    local_rank: int | None = None
    """Local rank on `host` the profiler measured this device as."""
    layer_times: Mapping[str, LayerTimes] = field(default_factory=dict)
    """Measured per-layer times by workload name; the cost model prefers them to FLOPs."""

    def __post_init__(self) -> None:
        # the spec parser checks its entries; a Device built in code met no check (tflops=-5 or nan planned)
        # the checked fields only: asdict deep-copied every measured layer time at each Device made
        fields = {"id": self.id, "tflops": self.tflops, "memory_gb": self.memory_gb}
        where = f"device {shown(self.id)}"
        problems: list[str] = []
        nonempty_str(fields, "id", "device", problems)
        if not isinstance(self.region, str):
            problems.append(f"{where}: region must be a string, got {shown(self.region)}")
        positive_number(fields, "tflops", where, problems)
        positive_number(fields, "memory_gb", where, problems)
        if problems:
            raise SpecError(join_problems(problems))

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    @property
    def flops(self) -> float:
        """Sustained FLOP/s."""
        return self.tflops * 1e12


@dataclass(frozen=True, kw_only=True)
class NetLink:
    """Bandwidth and latency of a network path."""

    gbps: float
    """Bandwidth in Gbit/s."""
    latency_ms: float
    """One-way latency in milliseconds."""

    def __post_init__(self) -> None:
        fields = {"gbps": self.gbps, "latency_ms": self.latency_ms}
        problems: list[str] = []
        positive_number(fields, "gbps", "link", problems)
        nonneg_number(fields, "latency_ms", "link", problems)
        if problems:
            raise SpecError(join_problems(problems))

    @property
    def bytes_per_s(self) -> float:
        return self.gbps * GBPS

    @property
    def latency_s(self) -> float:
        return self.latency_ms / 1e3

    def to_spec(self) -> dict[str, float]:
        return {"gbps": fmt_number(self.gbps), "latency_ms": fmt_number(self.latency_ms)}


@dataclass(frozen=True, kw_only=True)
class Network:
    """The declarative network section of a spec (device-pair overrides live in the arrays)."""

    regions: Mapping[str, NetLink]
    """Network inside each region."""
    links: Mapping[tuple[str, str], NetLink] = field(default_factory=dict)
    """Between two regions, keyed by the sorted region pair; symmetric."""
    default: NetLink | None = None
    """Region pairs not listed in `links`."""

    def between(self, a: str, b: str) -> NetLink | None:
        if a == b:
            return self.regions[a]
        return self.links.get(tuple(sorted((a, b))), self.default)


class Cluster:
    """Devices and the bandwidth/latency arrays between every ordered pair of them."""

    def __init__(self, *, name: str, devices: Iterable[Device], network: Network,
                 bandwidth: np.ndarray | None = None, latency: np.ndarray | None = None):
        # a name of 5 was saved to a spec that could not be read back; None as devices or network was a TypeError
        wrong = [f"{what} must be {kind}, got {shown(value)}" for what, value, ok, kind in (
            ("name", name, isinstance(name, str), "a string"),
            ("devices", devices, isinstance(devices, Iterable) and not isinstance(devices, str | Mapping),
             "a sequence of Device"),
            ("network", network, isinstance(network, Network), "a Network")) if not ok]
        if wrong:
            raise SpecError("cluster: " + "; ".join(wrong))
        self.name = name
        self.devices: tuple[Device, ...] = tuple(devices)
        self.network = network
        if not all(isinstance(d, Device) for d in self.devices):
            raise SpecError(f"cluster {shown(name)}: devices must be Device objects, got "
                            f"{shown(next(d for d in self.devices if not isinstance(d, Device)))}")
        problems = _check_devices(self.devices, network)
        if problems:
            raise SpecError(f"cluster {shown(name)}: " + join_problems(problems))
        self._index = {d.id: i for i, d in enumerate(self.devices)}
        base_bw, base_lat = self._network_arrays()
        self.bandwidth = base_bw if bandwidth is None else _checked_array(bandwidth, "bandwidth", len(self))
        self.latency = base_lat if latency is None else _checked_array(latency, "latency", len(self))
        np.fill_diagonal(self.bandwidth, np.inf)
        np.fill_diagonal(self.latency, 0.0)
        self.bandwidth.setflags(write=False)
        self.latency.setflags(write=False)

    # ---- basic views -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.devices)

    def __repr__(self) -> str:
        return f"Cluster(name={self.name!r}, devices={len(self)}, regions={len(self.regions)})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Cluster) and self.name == other.name and self.devices == other.devices
                and np.array_equal(self.bandwidth, other.bandwidth)
                and np.array_equal(self.latency, other.latency))

    __hash__ = None  # mutable-looking arrays; compare, do not hash

    @property
    def ids(self) -> list[str]:
        return [d.id for d in self.devices]

    @property
    def regions(self) -> list[str]:
        """Regions that hold at least one device, in order of first appearance."""
        return list(dict.fromkeys(d.region for d in self.devices))

    def index(self, device_id: str) -> int:
        try:
            return self._index[device_id]
        except (KeyError, TypeError):  # TypeError: an unhashable id (a list) is no device either
            raise SpecError(f"cluster {shown(self.name)} has no device {shown(device_id)}") from None

    def __contains__(self, device_id: object) -> bool:
        return isinstance(device_id, str) and device_id in self._index

    def device(self, device_id: str) -> Device:
        return self.devices[self.index(device_id)]

    @property
    def tflops(self) -> np.ndarray:
        return np.array([d.tflops for d in self.devices])

    @property
    def memory_bytes(self) -> np.ndarray:
        return np.array([d.memory_bytes for d in self.devices])

    @property
    def region_index(self) -> np.ndarray:
        """For each device, the position of its region in `regions`."""
        pos = {r: i for i, r in enumerate(self.regions)}
        return np.array([pos[d.region] for d in self.devices], dtype=np.int64)

    # ---- derived clusters --------------------------------------------------------------

    def with_arrays(self, *, bandwidth: np.ndarray | None = None, latency: np.ndarray | None = None,
                    name: str | None = None) -> Cluster:
        """The same devices with a changed network (a fluctuation, a measurement)."""
        return Cluster(name=name or self.name, devices=self.devices, network=self.network,
                       bandwidth=self.bandwidth if bandwidth is None else bandwidth,
                       latency=self.latency if latency is None else latency)

    def subset(self, device_ids: Iterable[str], name: str | None = None) -> Cluster:
        """The cluster restricted to some devices (links between them unchanged)."""
        idx = [self.index(i) for i in device_ids]
        devices = [self.devices[i] for i in idx]
        used = {d.region for d in devices}
        network = Network(regions={r: v for r, v in self.network.regions.items() if r in used},
                          links={k: v for k, v in self.network.links.items() if set(k) <= used},
                          default=self.network.default)
        return Cluster(name=name or self.name, devices=devices, network=network,
                       bandwidth=self.bandwidth[np.ix_(idx, idx)].copy(),
                       latency=self.latency[np.ix_(idx, idx)].copy())

    # ---- spec file ---------------------------------------------------------------------

    @classmethod
    def from_spec(cls, spec: Any, source: str = "cluster spec") -> Cluster:
        """Build from a parsed spec; every problem is reported at once in a `SpecError`."""
        return _parse_spec(spec, source)

    @classmethod
    def from_file(cls, path: str | Path) -> Cluster:
        return _parse_spec(read_structured(path, SpecError), str(path))

    def to_spec(self) -> dict[str, Any]:
        """The spec dict; consecutive identical devices `x-0..x-N` collapse into `count: N`."""
        net: dict[str, Any] = {"regions": {r: v.to_spec() for r, v in self.network.regions.items()}}
        if self.network.links:
            net["links"] = [{"between": list(k), **v.to_spec()} for k, v in self.network.links.items()]
        if self.network.default is not None:
            net["default"] = self.network.default.to_spec()
        overrides = self._overrides()
        if overrides:
            net["overrides"] = overrides
        return {"name": self.name, "devices": _group_devices(self.devices), "network": net}

    def save(self, path: str | Path) -> None:
        """Write the spec, as JSON for a .json path and YAML otherwise; a path it cannot write is a
        `SpecError` naming it."""
        spec = self.to_spec()
        if isinstance(path, str | os.PathLike) and Path(path).suffix.lower() == ".json":
            text = json.dumps(spec, indent=2) + "\n"
        else:
            text = yaml.safe_dump(spec, sort_keys=False, default_flow_style=None, width=100)
        save_text(path, text, SpecError, "cluster spec", "cluster.yaml")

    # ---- internals ---------------------------------------------------------------------

    def _network_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Arrays implied by the declarative network alone (no device-pair overrides)."""
        regions = list(dict.fromkeys(d.region for d in self.devices))
        pos = {name: k for k, name in enumerate(regions)}
        # filled per listed link, not per region pair: thousands of regions have millions of pairs
        default = self.network.default
        region_bw = np.full((len(regions),) * 2, np.nan if default is None else default.bytes_per_s)
        region_lat = np.full((len(regions),) * 2, np.nan if default is None else default.latency_s)
        for (a, b), link in self.network.links.items():
            if a in pos and b in pos:
                i, j = pos[a], pos[b]
                region_bw[i, j] = region_bw[j, i] = link.bytes_per_s
                region_lat[i, j] = region_lat[j, i] = link.latency_s
        for name, k in pos.items():
            region_bw[k, k] = self.network.regions[name].bytes_per_s
            region_lat[k, k] = self.network.regions[name].latency_s
        assert not np.isnan(region_bw).any(), "_check_devices lets no region pair go without a link"
        idx = np.array([pos[d.region] for d in self.devices], dtype=np.int64)
        return region_bw[np.ix_(idx, idx)], region_lat[np.ix_(idx, idx)]

    def _overrides(self) -> list[dict[str, Any]]:
        """Device pairs whose arrays differ from the declarative network, as spec entries."""
        base_bw, base_lat = self._network_arrays()
        # exact: a change within a tolerance was not saved, and the file read back was another cluster
        differs = (self.bandwidth != base_bw) | (self.latency != base_lat)
        np.fill_diagonal(differs, False)
        out = []
        ii, jj = np.nonzero(differs | differs.T)
        for i, j in zip(ii.tolist(), jj.tolist()):
            if j <= i:
                continue
            fwd = (self.bandwidth[i, j], self.latency[i, j])
            bwd = (self.bandwidth[j, i], self.latency[j, i])
            a, b = self.devices[i].id, self.devices[j].id
            if _close(fwd, bwd):
                out.append({"between": [a, b], **_link_spec(*fwd)})
                continue
            if differs[i, j]:
                out.append({"from": a, "to": b, **_link_spec(*fwd)})
            if differs[j, i]:
                out.append({"from": b, "to": a, **_link_spec(*bwd)})
        return out


def _close(x: tuple[float, float], y: tuple[float, float]) -> bool:
    return bool(x[0] == y[0] and x[1] == y[1])


def _link_spec(bandwidth: float, latency: float) -> dict[str, float]:
    """An override's figures, gbps and latency_ms; where no figure reads back exactly, also the
    value in the arrays' unit (bytes_per_s, latency_s), which readers that know it take instead."""
    out: dict[str, float] = {}
    for key, value, scale, back in (
            ("gbps", float(bandwidth), 1 / GBPS, lambda g: NetLink(gbps=g, latency_ms=0).bytes_per_s),
            ("latency_ms", float(latency), 1e3, lambda ms: NetLink(gbps=1, latency_ms=ms).latency_s)):
        figure = _in_unit(value, scale, back)
        out[key] = fmt_number(value * scale) if figure is None else figure
        if figure is None:
            out[_BASE_KEYS[key]] = fmt_number(value)
    return out


def _from_ms(ms: float) -> float:
    return float(ms) / 1e3  # as `_parse_layer_times` reads them


def _in_unit(value: float, scale: float, back: Callable[[float], float]) -> float | int | None:
    """`value * scale` as the spec writes it: the figure (9 digits when they do) that reading
    (`back`) turns into exactly `value` again, so a saved cluster reads back the same arrays.
    None when no figure does (the caller writes the base unit)."""
    x = value * scale
    short = fmt_number(x)
    if back(short) == value:
        return short
    up = down = x
    for _ in range(8):  # a product or quotient is within a few ulps of the figure that undoes it
        for candidate in (up, down):
            if back(candidate) == value:
                return candidate
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
    return None


def _checked_array(a: np.ndarray, what: str, n: int) -> np.ndarray:
    try:
        arr = np.array(a, dtype=np.float64)
    except (TypeError, ValueError):  # a string or ragged lists: a bare ValueError
        raise SpecError(f"{what} must be an array of numbers, got {shown(a)}") from None
    if arr.shape != (n, n):
        raise SpecError(f"{what} array has shape {arr.shape}, expected ({n}, {n})")
    off = ~np.eye(n, dtype=bool)
    # within the spec's figures (inf or 1e300 were taken, and to_spec then wrote a file no one could read back)
    if what == "bandwidth" and not np.all((arr[off] >= FIGURE_MIN * GBPS) & (arr[off] <= FIGURE_MAX * GBPS)):
        raise SpecError(f"bandwidth must be positive and finite between every pair of devices (a spec's gbps: "
                        f"{FIGURE_MIN:g} to {FIGURE_MAX:g})")
    if what == "latency" and not np.all((arr[off] >= 0) & (arr[off] <= FIGURE_MAX / 1e3)):
        raise SpecError(f"latency must be >= 0 and finite between every pair of devices (a spec's latency_ms: "
                        f"0 to {FIGURE_MAX:g})")
    return arr


def _check_devices(devices: tuple[Device, ...], network: Network) -> list[str]:
    problems = []
    if not devices:
        problems.append("no devices: add at least one entry under 'devices'")
    if len(devices) > MAX_DEVICES:
        problems.append(f"{len(devices)} devices, at most {MAX_DEVICES} are supported")
    seen: set[str] = set()
    for d in devices:
        if d.id in seen:
            problems.append(f"duplicate device id {shown(d.id)}")
        seen.add(d.id)
        if d.region not in network.regions:
            problems.append(f"device {shown(d.id)}: region {shown(d.region)} is not listed under network.regions")
    return problems + _missing_region_links((d.region for d in devices), network)


def _missing_region_links(used: Iterable[str], network: Network) -> list[str]:
    """With a default every region pair has a link; without one, each pair of the regions
    devices are in (`used`) must be listed."""
    problems = []
    regions = [] if network.default is not None else list(dict.fromkeys(r for r in used if r in network.regions))
    for i, a in enumerate(regions):
        for b in regions[i + 1:]:
            if network.between(a, b) is None:
                problems.append(f"no link between regions {shown(a)} and {shown(b)}: add it to network.links "
                                "or set network.default")
    return problems


def _group_devices(devices: tuple[Device, ...]) -> list[dict[str, Any]]:
    """Device entries, collapsing runs `base-0 .. base-(N-1)` with equal fields into `count`."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(devices):
        d = devices[i]
        base, _, suffix = d.id.rpartition("-")
        run = 1
        if base and suffix == "0":
            while (i + run < len(devices)
                   and devices[i + run].id == f"{base}-{run}"
                   and _same_but_id(devices[i + run], d)):
                run += 1
        if run > 1:
            out.append(_device_spec(d, id=base, count=run))
        else:
            out.append(_device_spec(d, id=d.id))
        i += run
    return out


def _same_but_id(a: Device, b: Device) -> bool:
    return dataclasses.replace(a, id=b.id) == b and a.host is None and a.local_rank is None \
        and not a.layer_times


def _device_spec(d: Device, *, id: str, count: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": id}
    if count:
        entry["count"] = count
    entry.update({"region": d.region, "tier": d.tier})
    if d.gpu:
        entry["gpu"] = d.gpu
    entry.update({"tflops": fmt_number(d.tflops), "memory_gb": fmt_number(d.memory_gb)})
    if d.host is not None:
        entry["host"] = d.host
    if d.local_rank is not None:
        entry["local_rank"] = d.local_rank
    if d.layer_times:
        entry["layer_times"] = {k: v.to_spec() for k, v in d.layer_times.items()}
    return entry


def _parse_link(obj: Any, where: str, problems: list[str], extra: set[str] = frozenset()) -> NetLink | None:
    if not isinstance(obj, dict):
        problems.append(f"{where}: expected a mapping with gbps and latency_ms, got {shown(obj)}")
        return None
    check_keys(obj, _LINK_KEYS | extra, _LINK_KEYS, where, problems)
    gbps = positive_number(obj, "gbps", where, problems)
    lat = nonneg_number(obj, "latency_ms", where, problems)
    if gbps is None or lat is None:
        return None
    return NetLink(gbps=gbps, latency_ms=lat)


def _parse_pair_link(obj: dict, where: str, problems: list[str], extra: set[str]) -> tuple[float, float] | None:
    """A device-pair override's (bytes/s, s): each figure in the spec's unit or in the arrays' one."""
    check_keys(obj, _LINK_KEYS | set(_BASE_KEYS.values()) | extra, set(), where, problems)
    out: list[float | None] = []
    for key, check, to_base, lo, hi in (
            ("gbps", positive_number, lambda g: NetLink(gbps=g, latency_ms=0).bytes_per_s,
             FIGURE_MIN * GBPS, FIGURE_MAX * GBPS),
            ("latency_ms", nonneg_number, lambda ms: NetLink(gbps=1, latency_ms=ms).latency_s, 0.0, FIGURE_MAX / 1e3)):
        base = _BASE_KEYS[key]
        figure = exact = None
        if key in obj:
            value = check(obj, key, where, problems)
            # read as NetLink reads it, so specs written before the base units load the same arrays
            figure = None if value is None else to_base(value)
        if base in obj:
            value = obj[base]
            # the range _checked_array takes, which is a figure's range in the spec's unit
            ok = isinstance(value, int | float) and not isinstance(value, bool) and lo <= value <= hi
            if not ok:
                problems.append(f"{where}: {base} must be a number from {lo:g} to {hi:g}, got {shown(value)}")
            exact = float(value) if ok else None
        if key not in obj and base not in obj:
            problems.append(f"{where}: missing required key {shown(key)}")
        if figure is not None and exact is not None and not math.isclose(figure, exact, rel_tol=_SAME_FIGURE):
            problems.append(f"{where}: {key} {shown(obj[key])} and {base} {shown(obj[base])} are different values: "
                            f"{base} is the same figure in the arrays' unit; give one, or both alike")
            exact = figure = None
        out.append(exact if exact is not None else figure)
    return None if None in out else (out[0], out[1])


def _parse_layer_times(obj: Any, where: str, problems: list[str]) -> dict[str, LayerTimes]:
    out: dict[str, LayerTimes] = {}
    if not isinstance(obj, dict):
        problems.append(f"{where}: layer_times must map a model name to measured times")
        return out
    for model, entry in obj.items():
        w = f"{where}.layer_times[{model}]"
        if not isinstance(entry, dict):
            problems.append(f"{w}: expected a mapping with batch, forward_ms, backward_ms")
            continue
        check_keys(entry, {"batch"} | set(_TIME_KEYS) | set(_TIME_KEYS.values()), {"batch"}, w, problems)
        batch = positive_int(entry, "batch", w, problems)
        lists: list[tuple[float, ...] | None] = []
        names = []
        for key, base in _TIME_KEYS.items():
            name = base if base in entry else key  # the seconds win where both are given
            names.append(name)
            if name not in entry:
                problems.append(f"{w}: missing required key {shown(key)}")
                lists.append(None)
                continue
            read: dict[str, tuple[float, ...] | None] = {}
            for given in (k for k in (key, base) if k in entry):
                vals = entry[given]
                # like every figure of a spec: an infinite or 1e308 ms time overflowed the cost model's sums;
                # seconds up to the figure that is FIGURE_MAX ms, as latency_s
                hi = FIGURE_MAX if given == key else FIGURE_MAX / 1e3
                if not isinstance(vals, list) or not vals or not all(is_figure(v) and v <= hi for v in vals):
                    problems.append(f"{w}: {given} must be a non-empty list of numbers from 0 to {hi:g}")
                    read[given] = None
                else:
                    # ms read as before the base units, so older specs load the same times
                    read[given] = tuple(_from_ms(v) if given == key else float(v) for v in vals)
            ms, s = read.get(key), read.get(base)
            if ms is not None and s is not None and (
                    len(ms) != len(s) or not all(math.isclose(a, b, rel_tol=_SAME_FIGURE) for a, b in zip(ms, s))):
                problems.append(f"{w}: {key} and {base} hold different times: {base} is the same list in seconds; "
                                "give one, or both alike")
                read[name] = None
            lists.append(read[name])
        if lists[0] and lists[1] and len(lists[0]) != len(lists[1]):
            problems.append(f"{w}: {names[0]} and {names[1]} have different lengths")
        elif lists[0] and lists[1] and not any(lists[0] + lists[1]):
            # the cost model would run the model in no time: plans scored infinitely fast, bounds divided by 0
            problems.append(f"{w}: every {names[0]} and {names[1]} is 0, which no device measures: profile it "
                            "again (spantrain profile) or remove layer_times")
        elif batch and lists[0] and lists[1]:
            out[str(model)] = LayerTimes(batch=batch, forward_s=lists[0], backward_s=lists[1])
    return out


def _parse_spec(spec: Any, source: str) -> Cluster:
    problems: list[str] = []
    if spec is None:  # an empty file, or one of comments only
        raise SpecError(f"{source}: empty: a cluster spec is a mapping with 'devices' and 'network' ("
                        "spantrain topo generate writes one)")
    if not isinstance(spec, dict):
        raise SpecError(f"{source}: expected a mapping with 'devices' and 'network', got {type(spec).__name__}")
    if wrong := other_kind(spec, "cluster spec"):
        raise SpecError(f"{source}: {wrong}")
    # top-level problems go unprefixed: the raise below names the source once
    check_keys(spec, {"name", "devices", "network"}, {"devices", "network"}, "", problems)
    name = spec.get("name", Path(source).stem if source != "cluster spec" else "cluster")
    if not isinstance(name, str):
        problems.append("name must be a string")
        name = "cluster"

    # network first: devices are checked against its regions
    net = spec.get("network")
    regions: dict[str, NetLink] = {}
    links: dict[tuple[str, str], NetLink] = {}
    default = None
    raw_overrides: list[tuple[str, Any]] = []
    # region names other entries may use; None when network.regions itself is wrong (reported
    # once, not again as an unknown region at every device and link)
    known: set[str] | None = None
    if "network" in spec and not isinstance(net, dict):
        problems.append("network: expected a mapping with regions, links, default, overrides")
    elif isinstance(net, dict):
        check_keys(net, {"regions", "links", "default", "overrides"}, {"regions"}, "network", problems)
        raw_regions = net.get("regions", {})
        if not isinstance(raw_regions, dict) or not raw_regions:
            problems.append("network.regions: expected a non-empty mapping of region name to {gbps, latency_ms}")
        else:
            known = set()
            for r, v in raw_regions.items():
                if not isinstance(r, str):  # YAML reads `1:` as a number, which no device's region matches
                    hint = (f"quote it: '{r}'" if isinstance(r, int | float) and not isinstance(r, bool) else
                            "YAML reads yes, no, on, off, true, false and null unquoted as such: quote the name")
                    problems.append(f"network.regions: region name {shown(r)} must be a string ({hint})")
                    known = None
                    continue
                if known is not None:
                    known.add(r)
                link = _parse_link(v, f"network.regions.{r}", problems)
                if link:
                    regions[r] = link
        raw_links = net.get("links") or []
        if not isinstance(raw_links, list):
            problems.append("network.links: expected a list of {between: [a, b], gbps, latency_ms}")
            raw_links = []
        for k, v in enumerate(raw_links):
            where = f"network.links[{k}]"
            link = _parse_link(v, where, problems, {"between"})
            between = v.get("between") if isinstance(v, dict) else None
            if not (isinstance(between, list) and len(between) == 2 and all(isinstance(x, str) for x in between)):
                problems.append(f"{where}: between must be a list of two region names")
                continue
            for r in between:
                if known is not None and r not in known:
                    problems.append(f"{where}: unknown region {shown(r)} (not listed under network.regions)")
            if between[0] == between[1]:
                problems.append(f"{where}: links join two different regions; set {shown(between[0])} "
                                "under network.regions instead")
                continue
            key = tuple(sorted(between))
            if key in links:
                problems.append(f"{where}: duplicate link between {shown(key[0])} and {shown(key[1])}")
            if link:
                links[key] = link
        if net.get("default") is not None:
            default = _parse_link(net["default"], "network.default", problems)
        raw_ov = net.get("overrides") or []
        if not isinstance(raw_ov, list):
            problems.append("network.overrides: expected a list of {between: [a, b], gbps, latency_ms}")
            raw_ov = []
        raw_overrides = [(f"network.overrides[{k}]", v) for k, v in enumerate(raw_ov)]

    # devices, with count expansion
    devices: list[Device] = []
    expected = 0  # devices after count expansion
    refused: set[str] = set()  # ids of refused entries: overrides naming their devices are not "unknown"
    # How often each id occurs after count expansion, over every entry whose id (and count) is
    # known, refused or not: a duplicate id is reported with the entry's other problems.
    id_counts: dict[str, int] = {}
    counted = 0  # ids counted so far; past MAX_DEVICES the spec is refused anyway (too many, or bad entries)
    raw_devices = spec.get("devices")
    if "devices" in spec and (not isinstance(raw_devices, list) or not raw_devices):
        problems.append("devices: expected a non-empty list of devices (the cluster is empty)")
        raw_devices = []
    used_regions: list[str] = []  # of every entry, its other figures right or not
    for k, entry in enumerate(raw_devices or []):
        where = f"devices[{k}]"
        if not isinstance(entry, dict):
            problems.append(f"{where}: expected a mapping, got {shown(entry)}")
            continue
        if isinstance(entry.get("id"), str):
            where = f"devices[{k}] ({entry['id']})"
        check_keys(entry, _DEVICE_KEYS, {"id", "region", "tflops", "memory_gb"}, where, problems)
        did = nonempty_str(entry, "id", where, problems)
        region = entry.get("region")
        if "region" in entry and not isinstance(region, str):
            problems.append(f"{where}: region must be a string")
            region = None
        elif isinstance(region, str) and known is not None and region not in known:
            problems.append(f"{where}: unknown region {shown(region)} (not listed under network.regions)")
        if isinstance(region, str):
            used_regions.append(region)
        tflops = positive_number(entry, "tflops", where, problems)
        mem = positive_number(entry, "memory_gb", where, problems)
        count = positive_int(entry, "count", where, problems) if "count" in entry else 1
        if count is not None and count > MAX_DEVICES:
            problems.append(f"{where}: count must be at most {MAX_DEVICES} (the most devices a cluster may have), "
                            f"got {shown(count)}")
            count = None
        tier = entry.get("tier", "cloud")
        gpu = entry.get("gpu", "")
        if not isinstance(tier, str) or not isinstance(gpu, str):
            problems.append(f"{where}: tier and gpu must be strings")
        host = entry.get("host")
        if host is not None and not isinstance(host, str):
            problems.append(f"{where}: host must be a string")
        local_rank = entry.get("local_rank")
        if local_rank is not None and (isinstance(local_rank, bool) or not isinstance(local_rank, int)
                                       or local_rank < 0):
            problems.append(f"{where}: local_rank must be an integer >= 0")
        layer_times = _parse_layer_times(entry["layer_times"], where, problems) if "layer_times" in entry else {}
        if did is not None and count is not None and counted + count <= MAX_DEVICES:
            counted += count
            for i in [did] if "count" not in entry else [f"{did}-{c}" for c in range(count)]:
                id_counts[i] = id_counts.get(i, 0) + 1
        if None in (did, region, tflops, mem, count):
            refused.add(str(entry.get("id")))
            continue
        expected += count
        if expected > MAX_DEVICES:
            refused.add(did)
            continue  # refused below; expanding would only cost memory and time
        ids = [did] if "count" not in entry else [f"{did}-{c}" for c in range(count)]
        for i in ids:
            devices.append(Device(id=i, region=region, tier=tier, gpu=gpu, tflops=tflops, memory_gb=mem,
                                  host=host, local_rank=local_rank, layer_times=layer_times))

    if expected > MAX_DEVICES:
        problems.append(f"devices: {expected} devices after count expansion, at most {MAX_DEVICES} are supported "
                        "(lower the counts)")
    seen = {d.id for d in devices}
    for did, c in id_counts.items():
        if c > 1:
            problems.append(f"devices: duplicate device id {shown(did)} (ids must be unique after count expansion)")
    # overrides refer to expanded device ids
    pair_overrides: list[tuple[str, str, tuple[float, float], bool]] = []
    first_given: dict[tuple[str, str], str] = {}  # (from, to) -> the override that set it
    for where, v in raw_overrides:
        if not isinstance(v, dict):
            problems.append(f"{where}: expected a mapping")
            continue
        directed = "from" in v or "to" in v
        link = _parse_pair_link(v, where, problems, {"from", "to"} if directed else {"between"})
        if directed:
            pair = [v.get("from"), v.get("to")]
        else:
            pair = v.get("between")
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            problems.append(f"{where}: give either between: [device, device] or from: device, to: device")
            continue
        for x in pair:
            if x not in seen and not any(x == r or x.startswith(f"{r}-") for r in refused):
                problems.append(f"{where}: unknown device {shown(x)}")
        if pair[0] == pair[1]:
            problems.append(f"{where}: a device pair needs two different devices")
            continue  # no link to check further (its two directions are one pair, "already set" by itself)
        # given twice, the last one silently won
        for a, b in [tuple(pair)] if directed else [tuple(pair), tuple(pair[::-1])]:
            if (a, b) in first_given:
                problems.append(f"{where}: the link from {shown(a)} to {shown(b)} is already set by "
                                f"{first_given[a, b]}: give each device pair once (from/to for one direction)")
                break
            first_given[a, b] = where
        if link:
            pair_overrides.append((pair[0], pair[1], link, directed))

    network = Network(regions=regions, links=links, default=default)
    # with the file's other problems, and under its name (the cluster's own check came after them, named the cluster)
    problems.extend(_missing_region_links(used_regions, network))
    if problems:
        raise SpecError(f"{source}: " + join_problems(problems))

    cluster = Cluster(name=name, devices=devices, network=network)
    if not pair_overrides:
        return cluster
    bw = cluster.bandwidth.copy()
    lat = cluster.latency.copy()
    for a, b, link, directed in pair_overrides:
        i, j = cluster.index(a), cluster.index(b)
        bw[i, j], lat[i, j] = link
        if not directed:
            bw[j, i], lat[j, i] = link
    return cluster.with_arrays(bandwidth=bw, latency=lat)


