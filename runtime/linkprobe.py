"""Measuring links with point-to-point messages: the profiler's device pairs, and a run's own links.

Per pair (a < b), over torch.distributed point-to-point messages, with the emulator's
per-message latency injected through `delay_before_send` exactly as the runtime's
transport does (a no-op when not emulated):

- **latency**: ping-pong of one-element messages after one warm-up; one-way latency =
  the shortest round trip / 2 (the two directions cannot be told apart without
  synchronized clocks, so both get it). The minimum, like ping's, keeps the link's
  latency and drops the wake-up delays a busy machine adds to round trips, which only
  ever lengthen them.
- **bandwidth**, each direction in turn: probes of doubling size (from 16 kB) until one
  takes 50 ms, then three messages sized to last `transfer_s` at the probed rate (capped
  at 256 MB). The receiver acknowledges each with one element; bandwidth = bytes /
  (elapsed - round trip), which removes both messages' latency and the fixed
  per-message cost. The best of the three counts: a device descheduled mid-transfer
  only ever slows a transfer down, never speeds it up.

`spantrain profile` measures every pair of a cluster this way
(`spantrain.profiler.network`). A training run measures the links its plan uses
(`measure_links`), in-band, between two iterations: the pairs of neighbouring stages of
every pipeline and of every holder group's sync rings (its ranks in order, cyclic; under
hierarchical sync each region's ranks and the regions' leaders, `sync_rings`). Every
rank walks the same list; a pair's two ranks measure while the others wait at a barrier
(where the ranks also vote on stopping), one pair at a time, since pairs sharing a
bottleneck would slow each other down.
`link_figures` turns the measurements into spec figures (under the emulator the shaped
rates are the spec's scaled, `emulated_gbps`, so a measured rate counts as spec x
measured / emulated), and `measured_cluster` writes the links that changed into the
cluster, as overrides of their pairs and, between regions, as the regions' link (which the
pairs the plan does not use share): the cluster as the run measured it, for re-planning.
"""

from __future__ import annotations

import itertools
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spantrain.runtime.emulator.latency import delay_before_send

__all__ = ["TIMED_TRANSFERS", "PairMeasurement", "measure_pair", "plan_pairs", "sync_rings", "measure_links",
           "LinkFigure", "link_figures", "measured_cluster", "links_message", "CHANGE_FACTOR"]

_PROBE_START = 16 * 1024
_PROBE_ENOUGH_S = 0.05
_MAX_MESSAGE = 256 * 1024 * 1024
_MIN_PINGS, _MAX_PINGS = 5, 200
TIMED_TRANSFERS = 3
"""Timed messages per direction after the probes; the best counts (module docstring)."""
RUN_LATENCY_SLOT_S = 0.1
"""A training run's ping-pong time per pair (at least 5 round trips)."""
RUN_TRANSFER_S = 0.2
"""How long each of a training run's timed messages lasts at the probed rate."""
RUN_TIMED_TRANSFERS = 2
"""A training run's timed messages per direction (it waits for them; the profiler takes 3)."""
RUN_PROBE_START = 2 * 1024
"""A training run's first probe: small, so a slow link's probes take little time (a shaper's burst
allowance passes small probes at once, and the doubling goes on past it)."""
CHANGE_FACTOR = 2.0
"""A link counts as changed when its measured bandwidth is this factor off the spec's, or its
latency this factor and `MIN_LATENCY_CHANGE_S` above (a message's fixed cost, a fraction of
a millisecond, would otherwise make every fast LAN look slow)."""
MIN_LATENCY_CHANGE_S = 1e-3
GBPS = 1e9 / 8
"""Bytes/s in a Gbit/s."""


@dataclass(frozen=True)
class PairMeasurement:
    """What one pair measured; bandwidths are goodput in bytes/s, latency one-way seconds."""

    a: int
    b: int
    latency_s: float
    a_to_b: float
    b_to_a: float


def _settle(torch, device) -> None:
    """On a GPU, wait until the queued transfers are done: NCCL's send and receive return
    before they are, which would time their launch, not the link."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _ping_pong(dist, torch, me: int, peer: int, first: bool, slot_s: float, device=None) -> float:
    """Shortest round trip over pings that fit `slot_s` (the side with `first` starts and times)."""
    x = torch.zeros(1, device=device)
    rtts = []
    t_start = time.perf_counter()
    # Both sides must agree on the count, so the timing side decides and says "stop" with -1.
    for k in range(_MAX_PINGS + 1):
        if first:
            stop = k > _MIN_PINGS and time.perf_counter() - t_start > slot_s
            x.fill_(-1.0 if stop else 1.0)
            _settle(torch, device)
            t0 = time.perf_counter()
            delay_before_send(me, peer)
            dist.send(x, peer)
            if stop:
                break
            dist.recv(x, peer)
            _settle(torch, device)
            if k > 0:  # the first exchange warms the connection up
                rtts.append(time.perf_counter() - t0)
        else:
            dist.recv(x, peer)
            if x.item() < 0:
                break
            delay_before_send(me, peer)
            dist.send(x, peer)
    return min(rtts, default=0.0)


def _timed_send(dist, torch, me: int, peer: int, nbytes: int, device=None) -> float:
    """Send `nbytes` to `peer` and wait for its one-element acknowledgement; elapsed seconds."""
    size = torch.tensor([nbytes], dtype=torch.int64, device=device)
    dist.send(size, peer)
    data = torch.empty(nbytes, dtype=torch.uint8, device=device)
    ack = torch.zeros(1, device=device)
    _settle(torch, device)
    t0 = time.perf_counter()
    delay_before_send(me, peer, nbytes)
    dist.send(data, peer)
    dist.recv(ack, peer)
    _settle(torch, device)
    return time.perf_counter() - t0


def _serve_receive(dist, torch, me: int, peer: int, device=None) -> bool:
    """The receiving side of one `_timed_send`; False when the sender says it is done (size 0)."""
    size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(size, peer)
    nbytes = int(size.item())
    if nbytes <= 0:
        return False
    data = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dist.recv(data, peer)
    delay_before_send(me, peer)
    dist.send(torch.ones(1, device=device), peer)
    return True


def _send_bandwidth(dist, torch, me: int, peer: int, rtt: float, transfer_s: float, device=None,
                    probe_start: int = _PROBE_START, timed: int = TIMED_TRANSFERS) -> float:
    """Bytes/s from `me` to `peer` (the peer runs `_serve_receive` until told to stop)."""
    nbytes, rate = probe_start, 0.0
    while True:
        elapsed = _timed_send(dist, torch, me, peer, nbytes, device)
        net = max(elapsed - rtt, 1e-6)
        rate = nbytes / net
        if net >= _PROBE_ENOUGH_S or nbytes >= _MAX_MESSAGE:
            break
        nbytes *= 2
    if net < transfer_s * 0.9:
        nbytes = int(min(_MAX_MESSAGE, max(nbytes, rate * transfer_s)))
        nets = [_timed_send(dist, torch, me, peer, nbytes, device) - rtt for _ in range(timed)]
        # A timed message sized to last transfer_s that came back within about the round trip
        # measured nothing but the round trip's noise (a round trip slowed by bytes still queued,
        # a shaper's burst allowance): it would give an absurd rate, so it does not count.
        rates = [nbytes / t for t in nets if t >= _PROBE_ENOUGH_S / 2]
        rate = max(rates) if rates else rate
    dist.send(torch.zeros(1, dtype=torch.int64, device=device), peer)  # done
    return rate


def measure_pair(dist, torch, me: int, a: int, b: int, *, latency_slot_s: float, transfer_s: float,
                 device=None, probe_start: int = _PROBE_START, timed: int = TIMED_TRANSFERS) -> PairMeasurement | None:
    """Run this rank's side of pair (a, b); rank `a` returns the measurement, `b` returns None.
    `device`: where the messages' tensors live (a GPU under NCCL; None: the CPU); `probe_start`:
    the first probe's bytes; `timed`: timed messages per direction."""
    peer = b if me == a else a
    first = me == a
    # The round trip is exchanged so both sides subtract the same figure from their transfers.
    rtt = torch.tensor([_ping_pong(dist, torch, me, peer, first, latency_slot_s, device)], dtype=torch.float64,
                       device=device)
    if first:
        dist.send(rtt, peer)
    else:
        dist.recv(rtt, peer)
    rtt_s = float(rtt.item())
    if first:
        a_to_b = _send_bandwidth(dist, torch, me, peer, rtt_s, transfer_s, device, probe_start, timed)
        while _serve_receive(dist, torch, me, peer, device):
            pass
        back = torch.zeros(1, dtype=torch.float64, device=device)
        dist.recv(back, peer)
        return PairMeasurement(a=a, b=b, latency_s=rtt_s / 2, a_to_b=a_to_b, b_to_a=float(back.item()))
    while _serve_receive(dist, torch, me, peer, device):
        pass
    b_to_a = _send_bandwidth(dist, torch, me, peer, rtt_s, transfer_s, device, probe_start, timed)
    dist.send(torch.tensor([b_to_a], dtype=torch.float64, device=device), peer)
    return None


def plan_pairs(pipelines: list[list[int]], holder_groups: list[tuple[int, ...]]) -> list[tuple[int, int]]:
    """The rank pairs ``(a, b)``, ``a < b``, a plan's traffic crosses: neighbouring stages of every
    pipeline (`pipelines`: each pipeline's ranks in stage order) and neighbours in every holder
    group's ring (`holder_groups`: each group's ranks), sorted, each once."""
    pairs = set()
    for ranks in pipelines:
        pairs.update(itertools.pairwise(ranks))
    for group in holder_groups:
        ring = sorted(group)
        if len(ring) > 1:
            pairs.update(zip(ring, ring[1:] + ring[:1], strict=True))
    return sorted({(min(a, b), max(a, b)) for a, b in pairs if a != b})


def sync_rings(holder_groups) -> list[tuple[int, ...]]:
    """The rank groups whose rings a plan's data-parallel sync crosses, for `plan_pairs`: each holder
    group's ranks, or under hierarchical sync (`spantrain.runtime.sync.HolderGroup.region_ranks` set)
    each region's ranks and the regions' leaders, which are the only ranks that talk across regions."""
    rings = []
    for g in holder_groups:
        if g.region_ranks:
            rings.extend([*g.region_ranks.values(), g.leaders])
        else:
            rings.append(g.ranks)
    return rings


def measure_links(transport, pairs: list[tuple[int, int]], rank: int,
                  stop: Callable[[], bool] = lambda: False) -> list[PairMeasurement] | None:
    """Measure `pairs` one after another (a collective: every rank calls it with the same pairs);
    every rank gets every measurement. None when a rank's `stop()` (Ctrl-C, SIGTERM) cut it short:
    the ranks vote between pairs, so a stop waits for one pair at most, not for all of them."""
    import torch
    import torch.distributed as dist

    transport.flush()  # the iteration's delayed sends are out: nothing else on the wire
    device = transport.device if transport.backend == "nccl" else None
    mine = []
    for a, b in pairs:
        if transport.any_rank(stop()):  # every rank votes, so all leave at the same pair
            return None
        if rank in (a, b):
            m = measure_pair(dist, torch, rank, a, b, latency_slot_s=RUN_LATENCY_SLOT_S, transfer_s=RUN_TRANSFER_S,
                             device=device, probe_start=RUN_PROBE_START, timed=RUN_TIMED_TRANSFERS)
            if m is not None:
                mine.append(m)
    if pairs and transport.any_rank(stop()):  # asked during the last pair: the run stops here all the same
        return None
    return [m for part in transport.all_gather_object(mine) for m in part]


@dataclass(frozen=True)
class LinkFigure:
    """One measured link in spec terms, beside what the cluster spec said."""

    a: str
    b: str
    """Device ids."""
    gbps: float
    """Measured bandwidth (the slower direction: the spec's links are symmetric), in spec Gbit/s."""
    latency_ms: float
    spec_gbps: float
    spec_latency_ms: float

    @property
    def changed(self) -> bool:
        """Whether the link differs from the spec by `CHANGE_FACTOR` or more."""
        bw = self.gbps / self.spec_gbps
        slower = self.latency_ms / 1e3 - self.spec_latency_ms / 1e3
        return (bw <= 1 / CHANGE_FACTOR or bw >= CHANGE_FACTOR
                or (self.latency_ms >= CHANGE_FACTOR * self.spec_latency_ms and slower >= MIN_LATENCY_CHANGE_S))

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "gbps": self.gbps, "latency_ms": self.latency_ms,
                "spec_gbps": self.spec_gbps, "spec_latency_ms": self.spec_latency_ms, "changed": self.changed}


def link_figures(measurements: list[PairMeasurement], device_of: dict[int, str], cluster,
                 emulation=None) -> list[LinkFigure]:
    """Measurements by rank -> `LinkFigure` by device id, against `cluster` (the spec the run
    follows). `emulation`: the emulator's contract (`latency.current()`), whose shaped rates are
    the spec's scaled; None when not emulated."""
    out = []
    for m in measurements:
        a, b = device_of[m.a], device_of[m.b]
        i, j = cluster.index(a), cluster.index(b)
        # the measured figure is the slower direction's: so is the spec's it is held against (a
        # one-way override 300x slower in the direction the plan used went unnoticed)
        spec_gbps = float(min(cluster.bandwidth[i, j], cluster.bandwidth[j, i])) / GBPS
        gbps = min(m.a_to_b, m.b_to_a) / GBPS
        if emulation is not None and emulation.emulated_gbps[m.a][m.b]:
            gbps *= emulation.spec_gbps[m.a][m.b] / emulation.emulated_gbps[m.a][m.b]
        out.append(LinkFigure(a=a, b=b, gbps=gbps, latency_ms=m.latency_s * 1e3, spec_gbps=spec_gbps,
                              spec_latency_ms=float(max(cluster.latency[i, j], cluster.latency[j, i])) * 1e3))
    return out


def measured_cluster(cluster, figures: list[LinkFigure]):
    """`cluster` with every changed link of `figures` as an override (its measured figures), and
    each link between two regions that a changed pair crosses set to the slowest such pair:
    the spec describes the link between two regions as one, so its pairs the plan does not use
    (and the run could not measure) are taken to have changed alike. The cluster as the run
    measured it."""
    from spantrain.cluster import Cluster

    changed = {frozenset((f.a, f.b)): f for f in figures if f.changed}
    spec = cluster.to_spec()
    network = spec.setdefault("network", {})
    # overrides are {between: [a, b]} or one-way {from: a, to: b} (what `spantrain profile` writes):
    # a measured pair replaces both directions
    kept = [o for o in network.get("overrides", [])
            if frozenset(o["between"] if "between" in o else (o["from"], o["to"])) not in changed]
    network["overrides"] = kept + [_figures(f, {"between": [f.a, f.b]}) for f in changed.values()]
    between: dict[frozenset, LinkFigure] = {}
    for f in changed.values():
        regions = frozenset((cluster.device(f.a).region, cluster.device(f.b).region))
        if len(regions) == 2 and (regions not in between or f.gbps < between[regions].gbps):
            between[regions] = f
    if between:
        links = [x for x in network.get("links", []) if frozenset(x["between"]) not in between]
        network["links"] = links + [_figures(f, {"between": sorted(r)}) for r, f in between.items()]
    return Cluster.from_spec(spec, f"{cluster.name} as measured")


def _figures(f: LinkFigure, entry: dict[str, Any]) -> dict[str, Any]:
    """A spec network entry with `f`'s measured figures (4 significant digits)."""
    return {**entry, "gbps": float(f"{f.gbps:.4g}"), "latency_ms": float(f"{max(f.latency_ms, 1e-3):.4g}")}


def _rate(gbps: float) -> str:
    return f"{gbps:.3g} Gbit/s" if gbps >= 1 else f"{gbps * 1e3:.3g} Mbit/s"


def links_message(event: dict[str, Any], adapting: bool = False) -> str:
    """What to tell the user about a ``links`` event (the worker's measurement); `adapting`: an
    ``--adapt`` run, which re-plans on the measured cluster itself."""
    why = "iterations drifted" if event.get("reason") == "drift" else "at the start"
    links = event["links"]
    shown = sorted(links, key=lambda f: not f["changed"])[:4]
    parts = [f"{f['a']} <-> {f['b']} {_rate(f['gbps'])}, {f['latency_ms']:.3g} ms (spec {_rate(f['spec_gbps'])}, "
             f"{f['spec_latency_ms']:.3g} ms{'; changed' if f['changed'] else ''})" for f in shown]
    more = f" and {len(links) - len(shown)} more" if len(links) > len(shown) else ""
    head = (f"measured the plan's {len(links)} link(s) after iteration {event['step']} ({why}) in "
            f"{event['measure_s']:.1f} s: {'; '.join(parts)}{more}")
    if not event.get("cluster"):
        return head + f": all within {CHANGE_FACTOR:g}x of the spec"
    if adapting:
        return head + f"; the cluster as measured is in {event['cluster']}, and this run re-plans on it"
    # without checkpoints there is nothing to --resume: the new plan starts over
    then = "spantrain run --resume --plan NEW.json" if event.get("checkpoints", True) else "run NEW.json (this " \
        "run keeps no checkpoints: add --checkpoint-dir to continue it on another plan)"
    # the command as it runs: the run's model (and batch), quoted for a shell (a path may hold spaces)
    model = shlex.quote(event["model"]) if event.get("model") else "MODEL"
    batch = f" --global-batch {event['global_batch']}" if event.get("global_batch") else ""
    return head + (f"; the cluster as measured is in {event['cluster']}: re-plan on it with spantrain plan --cluster "
                   f"{shlex.quote(event['cluster'])} --model {model}{batch} --from "
                   f"{shlex.quote(event['plan']) if event.get('plan') else 'PLAN'} -o NEW.json, then {then}")
