"""Names and bookkeeping of emulator runs, and removal of everything a run created.

Every object a run creates carries its run id: namespaces ``spt-<id>-hub`` and
``spt-<id>-<k>``, the cgroup ``/sys/fs/cgroup/cpu/spt-<id>``, the run directory
``<state dir>/<id>/`` (holding ``state.json`` with the owner's pid and start time, and
the emulation file). The state file is written *before* anything else is created, so at
any moment every ``spt-<id>-*`` object either belongs to a live owner or is a leftover of
a crashed one (a SIGKILL, a power cut): `sweep_leftovers` removes the latter at the next
start and leaves other live emulators alone.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from spantrain.errors import EmulationError
from spantrain.runtime.emulator import cpu, netns

__all__ = ["PREFIX", "state_dir", "RunNames", "new_run", "live_run_ids", "teardown", "teardown_network",
           "sweep_leftovers"]

PREFIX = "spt"
_RUN_ID = re.compile(rf"^{PREFIX}-([0-9a-f]{{4}})-")


def state_dir() -> Path:
    """Where run directories live: ``$SPANTRAIN_EMULATOR_DIR``, default /tmp/spantrain-emulator for
    root and /tmp/spantrain-emulator-<uid> for any other user.

    One directory per user: a shared one, made by whoever ran first, let no other user register
    a run in it, so without root the emulator failed ('Permission denied') instead of falling
    back to local processes. Only root's runs make namespaces and cgroups, so only root's
    directory names runs whose leftovers need root to remove."""
    uid = os.geteuid()
    default = "/tmp/spantrain-emulator" if uid == 0 else f"/tmp/spantrain-emulator-{uid}"
    return Path(os.environ.get("SPANTRAIN_EMULATOR_DIR", default))


@dataclass(frozen=True)
class RunNames:
    """Every name one run uses; interface names stay within Linux's 15 characters."""

    run_id: str

    @property
    def hub(self) -> str:
        return f"{PREFIX}-{self.run_id}-hub"

    def device_ns(self, k: int) -> str:
        return f"{PREFIX}-{self.run_id}-{k}"

    def hub_if(self, k: int) -> str:
        name = f"{PREFIX}{self.run_id}h{k}"
        if len(name) > 15:
            raise EmulationError(f"too many devices to name interface {k} (at most 99999)")
        return name

    @property
    def cgroup(self) -> Path:
        return cpu.CGROUP_CPU / f"{PREFIX}-{self.run_id}"

    @property
    def run_dir(self) -> Path:
        return state_dir() / self.run_id


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (field 22 of /proc/pid/stat), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def new_run() -> RunNames:
    """A fresh run id, registered to this process before anything is created."""
    base = state_dir()
    for _ in range(100):
        names = RunNames(secrets.token_hex(2))
        try:
            base.mkdir(parents=True, exist_ok=True)
            names.run_dir.mkdir()
        except FileExistsError:
            if not base.is_dir():
                raise EmulationError(f"{base} is not a directory: set SPANTRAIN_EMULATOR_DIR to one") from None
            continue
        except OSError as e:
            raise EmulationError(f"cannot register a run in {base} ({e.strerror or e}): set SPANTRAIN_EMULATOR_DIR "
                                 "to a directory this user can write") from None
        state = {"run_id": names.run_id, "pid": os.getpid(), "start": _start_time(os.getpid())}
        (names.run_dir / "state.json").write_text(json.dumps(state) + "\n")
        return names
    raise EmulationError(f"no free run id under {base}")


def _owner_alive(run_dir: Path) -> bool:
    try:
        state = json.loads((run_dir / "state.json").read_text())
    except (OSError, json.JSONDecodeError):
        # A run directory is made a moment before its state file: young means being born.
        try:
            return time.time() - run_dir.stat().st_mtime < 30
        except OSError:
            return False
    pid = state.get("pid")
    return isinstance(pid, int) and _start_time(pid) is not None and _start_time(pid) == state.get("start")


def live_run_ids() -> set[str]:
    base = state_dir()
    if not base.is_dir():
        return set()
    return {d.name for d in base.iterdir() if d.is_dir() and _owner_alive(d)}


def teardown(names: RunNames) -> list[str]:
    """Remove every object of run `names`: processes, namespaces, cgroups, run directory.

    Tries every step even when one fails and returns the failures (empty when all went).
    """
    problems = teardown_network(names)
    try:
        cpu.remove_tree(names.cgroup)
    except (EmulationError, OSError) as e:
        problems.append(f"cgroup {names.cgroup}: {e}")
    shutil.rmtree(names.run_dir, ignore_errors=True)
    return problems


def teardown_network(names: RunNames) -> list[str]:
    """Delete run `names`' namespaces (and the processes in them); returns the failures."""
    problems: list[str] = []
    if shutil.which("ip") is None:
        return problems
    prefix = f"{PREFIX}-{names.run_id}-"
    spaces = [ns for ns in netns.list_namespaces() if ns.startswith(prefix)]
    # Files for namespaces that were never made (a crash in between) go too.
    if netns.NETNS_ETC.is_dir():
        for d in netns.NETNS_ETC.iterdir():
            if d.name.startswith(prefix) and d.name not in spaces:
                shutil.rmtree(d, ignore_errors=True)
    # Devices first so nothing is left talking to the bridge; the hub last.
    for ns in sorted(spaces, key=lambda s: s == names.hub):
        try:
            netns.delete_namespace(ns)
        except EmulationError as e:
            problems.append(str(e))
    return problems


def _registered_ids() -> set[str]:
    base = state_dir()
    return {d.name for d in base.iterdir() if re.fullmatch(r"[0-9a-f]{4}", d.name)} if base.is_dir() else set()


def _leftover_ids() -> set[str]:
    if os.geteuid() != 0:
        # Namespaces and cgroups belong to root's runs, registered in root's directory: another
        # user would take live ones for leftovers (and could not remove them anyway).
        return _registered_ids()
    ids = _registered_ids()
    if shutil.which("ip"):
        ids |= {m.group(1) for ns in netns.list_namespaces() if (m := _RUN_ID.match(ns + "-"))}
    if netns.NETNS_ETC.is_dir():
        ids |= {m.group(1) for d in netns.NETNS_ETC.iterdir() if (m := _RUN_ID.match(d.name + "-"))}
    if cpu.CGROUP_CPU.is_dir():
        ids |= {m.group(1) for d in cpu.CGROUP_CPU.iterdir() if (m := _RUN_ID.match(d.name + "-"))}
    return ids


def sweep_leftovers() -> list[str]:
    """Tear down runs whose owner is gone; returns their ids. Live runs are never touched."""
    live = live_run_ids()
    cleaned = []
    for run_id in sorted(_leftover_ids() - live):
        teardown(RunNames(run_id))
        cleaned.append(run_id)
    return cleaned
