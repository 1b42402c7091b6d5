"""Network namespaces: one per device, joined by a bridge that lives in a hub namespace.

The bridge sits in its own namespace rather than the host's, so the emulator adds no
link, route or address to the machine's own network and removing the namespaces removes
everything (a veth pair dies with either of its namespaces).

Addresses: region number r (order of first appearance in the spec) owns 10.77.r.0/24 and
its k-th device gets 10.77.r.(k+1); interfaces carry a /16, so every device reaches every
other directly over the bridge while the shaper can still tell regions apart by /24.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from spantrain.cluster import Cluster
from spantrain.errors import EmulationError
from spantrain.runtime.emulator.system import have_tools, run

__all__ = ["IFNAME", "BRIDGE", "NET_PREFIX", "NETNS_ETC", "PROBE_PREFIX", "unavailable_reason", "addresses", "set_gso",
           "region_subnet",
           "list_namespaces", "create_hub", "add_device", "write_hosts", "namespace_pids", "delete_namespace"]

IFNAME = "spt0"
"""Name of the device-side interface inside every device namespace (GLOO_SOCKET_IFNAME)."""
BRIDGE = "br0"
NETNS_ETC = Path("/etc/netns")
"""`ip netns exec NS` bind-mounts the files of /etc/netns/NS over /etc."""
NET_PREFIX = "10.77"
PROBE_PREFIX = "spt-probe-"
"""The availability probe's namespace: this prefix and the probing process's pid."""
_MAX_REGIONS, _MAX_PER_REGION = 256, 254


def region_subnet(region_index: int) -> str:
    return f"{NET_PREFIX}.{region_index}.0/24"


def addresses(cluster: Cluster) -> list[str]:
    """One IPv4 address per device (in device order), grouped into one /24 per region."""
    regions = cluster.regions
    if len(regions) > _MAX_REGIONS:
        raise EmulationError(f"cannot emulate {len(regions)} regions (at most {_MAX_REGIONS})")
    seen: dict[int, int] = {}
    out = []
    for r in cluster.region_index.tolist():
        seen[r] = seen.get(r, 0) + 1
        if seen[r] > _MAX_PER_REGION:
            raise EmulationError(f"region {regions[r]!r} has more than {_MAX_PER_REGION} devices")
        out.append(f"{NET_PREFIX}.{r}.{seen[r]}")
    return out


def unavailable_reason() -> str | None:
    """Why namespaces with htb shaping cannot be made here (None when they can).

    Checks root and the tools, then makes a throw-away namespace with an htb qdisc, since
    a container may allow neither even to root.
    """
    if os.geteuid() != 0:
        return "not running as root"
    missing = have_tools("ip", "tc")
    if missing:
        return f"{', '.join(missing)} not found"
    from spantrain._interrupt import SignalsHeld

    probe = f"{PROBE_PREFIX}{os.getpid()}"
    # Ctrl-C between the add and the try below left the namespace behind: the probe is a moment
    held = SignalsHeld()
    with held:
        try:
            run(["ip", "netns", "add", probe])
        except EmulationError as e:
            return str(e)
        try:
            run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb"])
        except EmulationError as e:
            return str(e)
        finally:
            run(["ip", "netns", "del", probe], check=False)
    held.deliver()
    return None


def list_namespaces() -> list[str]:
    """Names of the named network namespaces on this machine."""
    out = run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def create_hub(hub: str) -> None:
    """The hub namespace holding the bridge every device's veth plugs into."""
    run(["ip", "netns", "add", hub])
    run(["ip", "-n", hub, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0"])
    run(["ip", "-n", hub, "link", "set", BRIDGE, "up"])


def add_device(hub: str, ns: str, hub_if: str, address: str, gso_bytes: int = 65536) -> None:
    """Namespace `ns` with interface `IFNAME` (address/16) wired to the hub's bridge by a veth pair.

    `gso_bytes` caps the packets TCP hands the interface (see `shaping.gso_bytes`).
    """
    run(["ip", "netns", "add", ns])
    run(["ip", "-n", ns, "link", "set", "lo", "up"])
    run(["ip", "-n", hub, "link", "add", hub_if, "type", "veth", "peer", "name", IFNAME, "netns", ns])
    run(["ip", "-n", hub, "link", "set", hub_if, "master", BRIDGE, "up"])
    set_gso(ns, gso_bytes)
    run(["ip", "-n", ns, "addr", "add", f"{address}/16", "dev", IFNAME])
    run(["ip", "-n", ns, "link", "set", IFNAME, "up"])


def set_gso(ns: str, gso_bytes: int) -> None:
    """Cap the packets TCP hands namespace `ns`'s interface at `gso_bytes` (see `shaping.gso_bytes`)."""
    run(["ip", "-n", ns, "link", "set", IFNAME, "gso_max_size", str(gso_bytes),
         "gso_max_segs", str(max(1, gso_bytes // 1514))])


def write_hosts(ns: str, hosts: Sequence[tuple[str, str]]) -> None:
    """Give namespace `ns` an /etc/hosts naming every device (address, name).

    Inside a namespace the machine's resolver cannot name the bridge addresses, and
    torch's c10d warns on every connection that it cannot; with the devices listed, names
    resolve and the warning goes away.
    """
    d = NETNS_ETC / ns
    d.mkdir(parents=True, exist_ok=True)
    # c10d's sockets are dual-stack and see peers as IPv4-mapped IPv6: list both forms.
    lines = ["127.0.0.1 localhost", "::1 localhost"]
    lines += [f"{addr} {name}" for addr, name in hosts] + [f"::ffff:{addr} {name}" for addr, name in hosts]
    (d / "hosts").write_text("\n".join(lines) + "\n")


def namespace_pids(ns: str) -> list[int]:
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def delete_namespace(ns: str, wait_s: float = 5.0) -> None:
    """Kill whatever still runs in `ns`, then delete it (its veth ends go with it)."""
    deadline = time.monotonic() + wait_s
    while pids := namespace_pids(ns):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise EmulationError(f"processes {pids[:5]} in namespace {ns} did not exit")
        time.sleep(0.05)
    run(["ip", "netns", "del", ns])
    shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
