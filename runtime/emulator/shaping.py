"""Bandwidth: htb classes on each device's egress, one per destination region (u32 filters).

Device i's interface gets an htb root qdisc with one class per region (the spec's
bandwidth from i's region to that region, filter: destination in the region's /24) and
one class per device pair that deviates from its region figure (a device-pair override,
filter: destination /32, matched first). Every such class hangs directly off the qdisc,
so none borrows from another: each is a separate pipe of exactly its rate. Traffic from i
to several devices of one region shares that region's class (a site uplink); one transfer
at a time sees the full rate.

Each pipe has two children: small packets (IP length < 128: TCP ACKs, tiny messages) at
htb priority 0 with 10 % of the rate guaranteed, and the rest at priority 1 with 90 %;
both may borrow up to the whole rate. Without that, a device sending bulk data towards a
peer queues the ACKs of the peer's own transfer behind seconds of data in the same FIFO
and the reverse transfer collapses (measured: 0.5 instead of 8 Mbit/s); the kernel here
has no fq_codel or sfq to separate flows.

Rates, as emulated:

- **Scale and cap.** Spec rates run up to hundreds of Gbit/s, far more than veth on two
  shared cores carries, so the emulated goodput is ``min(spec x scale, max_gbps)``
  (defaults scale 1, cap 1 Gbit/s: wide-area links stay exact, fast LANs are clamped;
  choose ``scale = max_gbps / fastest link`` to keep every ratio instead). The emulation
  file records both and the matrix actually enforced.
- **Goodput.** Spec figures are what a transfer achieves. htb counts whole frames, and a
  full TCP segment carries 1448 payload bytes in a 1514-byte frame (Ethernet 14, IPv4 20,
  TCP 20 + timestamps 12), so the class rate is the goodput x 1514/1448; without that a
  transfer measured 4.4 % short.
- **Segments.** htb lets a packet through whenever its class is not in debt, so a 64 kB
  GSO super-packet passes at once and is paid back afterwards: a free head start for
  every transfer (measured: 16 kB crossed a 10 Mbit/s class in 5 ms instead of 13). The
  interface's GSO size is therefore capped at 1 ms of its slowest class (`gso_bytes`,
  one frame below ~12 Mbit/s); above that, large segments keep veth fast (with one
  segment per packet a 1 Gbit/s class carried only ~700 Mbit/s on the loaded 2 cores).
- **Burst.** ``burst = cburst = max(2 frames, 2 ms at the rate)``: at 1-100 Mbit/s a
  message gets no more than two frames ahead of the rate, so short transfers are not
  flattered; at 1 Gbit/s 2 ms of tokens cover the timer slack (a 15 kB burst lost 1 %).
  ``quantum`` is one frame (classes never borrow, so it only silences htb's r2q warning).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spantrain.cluster import GBPS, Cluster
from spantrain.errors import EmulationError
from spantrain.runtime.emulator.netns import region_subnet
from spantrain.runtime.emulator.options import EMULATE_OPTIONS, Options
from spantrain.runtime.emulator.system import run

__all__ = ["FRAME_BYTES", "PAYLOAD_BYTES", "MIN_GBPS", "MAX_GBPS", "RateLimits", "TcClass", "emulated_gbps",
           "check_rates", "device_classes", "gso_bytes", "tc_batch", "apply_shaping"]

FRAME_BYTES = 1514
"""Ethernet frame of a full-size segment at MTU 1500."""
PAYLOAD_BYTES = 1448
"""TCP payload in that frame (with the timestamp option Linux sends by default)."""
_BURST_S = 0.002


@dataclass(frozen=True)
class RateLimits:
    """How spec bandwidths map to emulated goodput: ``min(spec x scale, max_gbps)``."""

    scale: float = 1.0
    max_gbps: float = 1.0

    def __post_init__(self) -> None:
        if not all(math.isfinite(x) and x > 0 for x in (self.scale, self.max_gbps)):  # inf overflows tc's rates
            raise EmulationError(f"bandwidth scale and cap must be finite and positive (got {self.scale:g}, "
                                 f"{self.max_gbps:g})")

    def emulate(self, spec_gbps: float) -> float:
        return min(spec_gbps * self.scale, self.max_gbps)

    @classmethod
    def fit(cls, cluster: Cluster, max_gbps: float) -> RateLimits:
        """The scale that brings the fastest link down to `max_gbps` (never up): no pair is clamped."""
        bw = cluster.bandwidth[~np.eye(len(cluster), dtype=bool)]
        fastest = float(bw.max()) / GBPS if bw.size else max_gbps
        return cls(scale=min(1.0, max_gbps / fastest), max_gbps=max_gbps)


@dataclass(frozen=True)
class TcClass:
    """One htb class and the u32 filter that feeds it."""

    minor: int
    """htb minor of the pipe (< 0x4000; its children add 0x4000 and 0x8000)."""
    gbps: float
    """Goodput this class lets through."""
    dst: str
    """Destination prefix (a region's /24 or a device's /32)."""
    prio: int
    """Filter priority: 1 for device pairs (matched first), 2 for regions."""


def emulated_gbps(cluster: Cluster, limits: RateLimits) -> np.ndarray:
    """The goodput matrix the emulator enforces, Gbit/s, [src][dst] (nan on the diagonal)."""
    out = np.minimum(cluster.bandwidth / GBPS * limits.scale, limits.max_gbps)
    np.fill_diagonal(out, np.nan)
    return out


MIN_GBPS = 1e-7
"""Slowest goodput shaped (100 bit/s): a pipe's small-packet child, 10 % of it, needs tc's 1 byte/s."""
MAX_GBPS = 16_000.0
"""Fastest cap shaped: a class's burst (`_BURST_S` of its rate in frames) must fit tc's 32 bits (16,430 Gbit/s)."""


def check_rates(cluster: Cluster, limits: RateLimits, options: Options = EMULATE_OPTIONS) -> None:
    """Refuse a rate the kernel's shaper cannot enforce, naming the slowest; else `tc` failed
    with 'Command failed -:9', which mode auto took for namespaces being unavailable. The fix
    names the caller's `options`."""
    if limits.max_gbps > MAX_GBPS:  # tc failed with 'Command failed -:2', which mode auto took for no namespaces
        raise EmulationError(f"{options.max_gbps or 'the bandwidth cap'} {limits.max_gbps:g} Gbit/s is above the "
                             f"{MAX_GBPS:g} Gbit/s the kernel's shaper can enforce: lower it")
    rates = {options.max_gbps or "the bandwidth cap": limits.max_gbps}
    for a in cluster.regions:  # every region class is installed, even one whose pairs all have overrides
        for b in cluster.regions:
            rates[f"{a} -> {b}"] = limits.emulate(cluster.network.between(a, b).gbps)
    if len(cluster) > 1:
        pairs = emulated_gbps(cluster, limits)
        i, j = np.unravel_index(np.nanargmin(pairs), pairs.shape)
        rates[f"{cluster.devices[i].id} -> {cluster.devices[j].id}"] = float(pairs[i, j])
    where, slowest = min(rates.items(), key=lambda kv: kv[1])
    if slowest < MIN_GBPS:
        raise EmulationError(f"{where}: emulated bandwidth {slowest:.3g} Gbit/s is below the {MIN_GBPS:g} Gbit/s "
                             "(100 bit/s) the kernel's shaper can enforce: raise it"
                             + (f" (or {options.bandwidth_scale})" if options.bandwidth_scale else "")
                             + (f", or emulate without namespaces ({options.mode} local)" if options.mode else ""))


def device_classes(cluster: Cluster, i: int, addrs: list[str], limits: RateLimits) -> list[TcClass]:
    """Classes for device `i`: one per region, one per device pair differing from its region figure."""
    src_region = cluster.devices[i].region
    region_idx = cluster.region_index
    classes: list[TcClass] = []
    region_gbps = {}
    for r, name in enumerate(cluster.regions):
        link = cluster.network.between(src_region, name)
        region_gbps[r] = link.gbps
        classes.append(TcClass(minor=0x10 + r, gbps=limits.emulate(link.gbps), dst=region_subnet(r), prio=2))
    for j in range(len(cluster)):
        if j == i:
            continue
        # Compare emulated rates: an override that the cap flattens needs no class of its own.
        pair = limits.emulate(cluster.bandwidth[i, j] / GBPS)
        if not np.isclose(pair, limits.emulate(region_gbps[int(region_idx[j])]), rtol=1e-9):
            classes.append(TcClass(minor=0x1000 + j, gbps=pair, dst=f"{addrs[j]}/32", prio=1))
    return classes


_SMALL_SHARE = 0.1
_SMALL, _BULK = 0x8000, 0x4000
# u32 on the IPv4 total length (offset 2): (length & 0xff80) == 0 <=> length < 128 bytes.
_SMALL_MATCH = "match u16 0x0000 0xff80 at 2"


_GSO_S = 0.001
_GSO_MAX = 65536


def gso_bytes(classes: list[TcClass], default_gbps: float) -> int:
    """Largest packet TCP may hand the interface: 1 ms at its slowest class, one frame to 64 kB."""
    slowest = min([c.gbps for c in classes] + [default_gbps])
    return int(min(_GSO_MAX, max(FRAME_BYTES, slowest * GBPS * _GSO_S)))


def _htb_class(ifname: str, parent: str, minor: int, gbps: float, ceil_gbps: float | None = None,
               prio: int | None = None) -> str:
    rate_bytes = gbps * GBPS * FRAME_BYTES / PAYLOAD_BYTES
    ceil_bytes = (ceil_gbps or gbps) * GBPS * FRAME_BYTES / PAYLOAD_BYTES
    burst = max(2 * FRAME_BYTES, round(ceil_bytes * _BURST_S))
    return (f"class add dev {ifname} parent {parent} classid 1:{minor:x} htb rate {round(rate_bytes * 8)}bit "
            f"ceil {round(ceil_bytes * 8)}bit burst {burst}b cburst {burst}b quantum {FRAME_BYTES}"
            + (f" prio {prio}" if prio is not None else ""))


def tc_batch(ifname: str, classes: list[TcClass], default_gbps: float) -> str:
    """The `tc -batch` script shaping `ifname`; unclassified traffic (ARP, ...) gets `default_gbps`."""
    lines = [f"qdisc add dev {ifname} root handle 1: htb default 1", _htb_class(ifname, "1:", 1, default_gbps)]
    for c in classes:
        pipe = f"1:{c.minor:x}"
        small, bulk = c.minor + _SMALL, c.minor + _BULK
        lines += [_htb_class(ifname, "1:", c.minor, c.gbps),
                  _htb_class(ifname, pipe, small, c.gbps * _SMALL_SHARE, c.gbps, prio=0),
                  _htb_class(ifname, pipe, bulk, c.gbps * (1 - _SMALL_SHARE), c.gbps, prio=1),
                  # Filters with a lower prio number are tried first: small packets, then the rest.
                  f"filter add dev {ifname} parent 1: protocol ip prio {2 * c.prio - 1} u32 "
                  f"match ip dst {c.dst} {_SMALL_MATCH} flowid 1:{small:x}",
                  f"filter add dev {ifname} parent 1: protocol ip prio {2 * c.prio} u32 "
                  f"match ip dst {c.dst} flowid 1:{bulk:x}"]
    return "\n".join(lines) + "\n"


def apply_shaping(ns: str, ifname: str, classes: list[TcClass], default_gbps: float) -> None:
    """Install the shaper on `ifname` inside namespace `ns` (one `tc` call for all of it)."""
    run(["tc", "-n", ns, "-batch", "-"], input=tc_batch(ifname, classes, default_gbps))
