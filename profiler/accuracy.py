"""How close a profile came to the emulated cluster it measured.

For every directed pair: measured goodput against the goodput the emulator enforced, and
measured one-way latency (round trip / 2) against the mean of the two injected one-way
latencies. Used by ``spantrain profile --cluster`` (a table on stderr) and by the tests.
"""

from __future__ import annotations

from typing import Any

from spantrain.runtime.emulator.latency import Emulation

__all__ = ["pair_errors", "accuracy_lines"]


def pair_errors(document: dict[str, Any], emulation: Emulation) -> list[dict[str, Any]]:
    """Per measured pair: emulated and measured figures and relative errors (measured / emulated - 1)."""
    rows = []
    for p in document["pairs"]:
        i, j = emulation.rank_of(p["a"]), emulation.rank_of(p["b"])
        target_gbps = float(emulation.emulated_gbps[i][j])
        target_ms = (emulation.latency_s(i, j) + emulation.latency_s(j, i)) / 2 * 1e3
        rows.append({"a": p["a"], "b": p["b"], "emulated_gbps": target_gbps, "gbps": p["gbps"],
                     "gbps_error": p["gbps"] / target_gbps - 1,
                     "emulated_latency_ms": target_ms, "latency_ms": p["latency_ms"],
                     "latency_error": p["latency_ms"] / target_ms - 1 if target_ms > 0 else None})
    return rows


def accuracy_lines(document: dict[str, Any], emulation: Emulation) -> list[str]:
    """A readable table of `pair_errors` and the worst errors."""
    rows = pair_errors(document, emulation)
    if not rows:
        return []
    lines = ["profile vs emulated: pair | Mbit/s emulated / measured (error) | ms emulated / measured (error)"]
    for r in rows:
        lat_err = "n/a" if r["latency_error"] is None else f"{r['latency_error']:+.0%}"
        lines.append(f"  {r['a']} -> {r['b']} | {r['emulated_gbps'] * 1e3:.1f} / {r['gbps'] * 1e3:.1f} "
                     f"({r['gbps_error']:+.1%}) | {r['emulated_latency_ms']:.2f} / {r['latency_ms']:.2f} ({lat_err})")
    worst_bw = max(abs(r["gbps_error"]) for r in rows)
    lat = [abs(r["latency_error"]) for r in rows if r["latency_error"] is not None]
    lines.append(f"profile vs emulated: worst bandwidth error {worst_bw:.1%}"
                 + (f", worst latency error {max(lat):.1%}" if lat else ""))
    return lines
