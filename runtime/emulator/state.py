"""Names and bookkeeping of emulator runs, and removal of everything a run created.

Every object a run creates carries its run id: namespaces ``spt-<id>-hub`` and
``spt-<id>-<k>``, the cgroup ``/sys/fs/cgroup/cpu/spt-<id>``, the run directory
``<state dir>/<id>/`` (holding ``state.json`` with the owner's pid and start time, and
the emulation file). The state file is written *before* anything else is created, so at
any moment every ``spt-<id>-*`` object either belongs to a live owner or is a leftover of
a crashed one (a SIGKILL, a power cut): `sweep_leftovers` removes the latter at the next
start and leaves other live emulators alone.

Namespaces and cgroups are the machine's, not a state directory's, and root's runs may
use different state directories (``SPANTRAIN_EMULATOR_DIR``; the tests set one per
test). So a root run also claims its id in one system-wide register, `REGISTRY`
(``/run/spantrain-emulator/<id>.json``, the same pid and start time), before it creates
anything: ids are unique on the machine, and whether a namespace or cgroup is a
leftover is decided there, whatever state directory its owner used. An object whose id
has no entry, or an entry whose owner is dead, is a leftover; the entry goes last, when
its run's teardown ends. (Looking only in the caller's state directory, a root run took
every other directory's live runs for leftovers and killed their devices.) The run
directory of a dead run in another state directory stays until a run there sweeps it.
Other users make neither namespaces nor cgroups: they sweep their own state directory only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from spantrain.errors import EmulationError
from spantrain.runtime.emulator import cpu, netns

__all__ = ["PREFIX", "DEFAULT_DIR", "state_dir", "RunNames", "new_run", "live_run_ids", "teardown", "teardown_network",
           "sweep_leftovers"]

PREFIX = "spt"
DEFAULT_DIR = Path("/tmp/spantrain-emulator")
"""Root's state directory; other users' have ``-<uid>`` appended (`state_dir`)."""
REGISTRY = Path("/run/spantrain-emulator")
"""Root's system-wide register of runs, one ``<id>.json`` each (module docstring)."""
_NETNS_RUN = Path("/run/netns")
"""Where `ip netns` keeps its named namespaces."""
_RUN_ID = re.compile(rf"^{PREFIX}-([0-9a-f]{{4}})-")


def state_dir() -> Path:
    """Where run directories live: ``$SPANTRAIN_EMULATOR_DIR``, default /tmp/spantrain-emulator for
    root and /tmp/spantrain-emulator-<uid> for any other user.

    One directory per user: a shared one, made by whoever ran first, let no other user register
    a run in it, so without root the emulator failed ('Permission denied') instead of falling
    back to local processes. Only root's runs make namespaces and cgroups, so only root's
    directory names runs whose leftovers need root to remove.

    A default directory's name is known to everyone, so anyone can make it first: it is used
    only when it is this user's own directory and nobody else can write in it (else a one-line
    error names SPANTRAIN_EMULATOR_DIR); `new_run` makes it private (0700)."""
    explicit = os.environ.get("SPANTRAIN_EMULATOR_DIR")
    if explicit:
        return Path(explicit)
    uid = os.geteuid()
    path = DEFAULT_DIR if uid == 0 else Path(f"{DEFAULT_DIR}-{uid}")
    _check_private(path, uid)
    return path


def _check_private(path: Path, uid: int) -> None:
    """Refuse `path` unless it is missing or a directory (not a link) of `uid`'s that only it can write."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        problem = f"cannot be checked ({e.strerror or e})"
    else:
        if not stat.S_ISDIR(st.st_mode):
            problem = "is not a directory"
        elif st.st_uid != uid:
            problem = f"belongs to another user (uid {st.st_uid})"
        elif st.st_mode & 0o022:
            problem = "is writable by other users"
        else:
            return
    raise EmulationError(f"emulator state directory {path} {problem}: set SPANTRAIN_EMULATOR_DIR to a directory "
                         "of yours that only you can write")


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
    owner = {"pid": os.getpid(), "start": _start_time(os.getpid())}
    for _ in range(100):
        names = RunNames(secrets.token_hex(2))
        if os.geteuid() == 0 and not _claim(names.run_id, {"run_id": names.run_id, **owner, "state_dir": str(base)}):
            continue
        try:
            base.mkdir(mode=0o700, parents=True, exist_ok=True)
            names.run_dir.mkdir()  # checks `base` again (`state_dir`): it might be new
        except FileExistsError:
            _release(names.run_id)
            if not base.is_dir():
                raise EmulationError(f"{base} is not a directory: set SPANTRAIN_EMULATOR_DIR to one") from None
            continue
        except OSError as e:
            _release(names.run_id)
            raise EmulationError(f"cannot register a run in {base} ({e.strerror or e}): set SPANTRAIN_EMULATOR_DIR "
                                 "to a directory this user can write") from None
        (names.run_dir / "state.json").write_text(json.dumps({"run_id": names.run_id, **owner}) + "\n")
        return names
    raise EmulationError(f"no free run id under {base}")


def _claim(run_id: str, owner: dict) -> bool:
    """Enter `run_id` in `REGISTRY` for `owner`; False when it is taken (by a run, or by its leftovers)."""
    entry = REGISTRY / f"{run_id}.json"
    tmp = REGISTRY / f".{run_id}.{os.getpid()}.tmp"
    try:
        REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_text(json.dumps(owner) + "\n")
        try:
            os.link(tmp, entry)  # atomic, and never an entry without its owner
        except FileExistsError:
            return False
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as e:
        raise EmulationError(f"cannot register a run in {REGISTRY}: {e.strerror or e}") from None
    if _objects_exist(run_id):  # a crashed run's, not yet swept: its objects are not ours
        _release(run_id)
        return False
    return True


def _release(run_id: str) -> None:
    if os.geteuid() == 0:
        with contextlib.suppress(OSError):
            (REGISTRY / f"{run_id}.json").unlink()


def _objects_exist(run_id: str) -> bool:
    prefix = f"{PREFIX}-{run_id}-"
    return ((cpu.CGROUP_CPU / f"{PREFIX}-{run_id}").exists()
            or any(d.is_dir() and any(x.name.startswith(prefix) for x in d.iterdir())
                   for d in (_NETNS_RUN, netns.NETNS_ETC)))


def _alive(state_file: Path) -> bool | None:
    """Whether the owner named in `state_file` runs; None when the file cannot be read."""
    try:
        state = json.loads(state_file.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    pid = state.get("pid") if isinstance(state, dict) else None
    return isinstance(pid, int) and _start_time(pid) is not None and _start_time(pid) == state.get("start")


def _owner_alive(run_dir: Path) -> bool:
    alive = _alive(run_dir / "state.json")
    if alive is None:
        # A run directory is made a moment before its state file: young means being born.
        try:
            return time.time() - run_dir.stat().st_mtime < 30
        except OSError:
            return False
    return alive


def live_run_ids() -> set[str]:
    """Ids of the runs whose owner runs: in this state directory and, for root, in `REGISTRY`."""
    base = state_dir()
    ids = {d.name for d in base.iterdir() if d.is_dir() and _owner_alive(d)} if base.is_dir() else set()
    if os.geteuid() == 0:
        ids |= {run_id for run_id in _registry_ids() if _alive(REGISTRY / f"{run_id}.json")}
    return ids


def _registry_ids() -> set[str]:
    if not REGISTRY.is_dir():
        return set()
    return {m.group(1) for p in REGISTRY.iterdir() if (m := re.fullmatch(r"([0-9a-f]{4})\.json", p.name))}


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
    _release(names.run_id)  # last: whatever could not be removed is a leftover now, swept at the next start
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
    ids = _registered_ids() | _registry_ids()
    if shutil.which("ip"):
        ids |= {m.group(1) for ns in netns.list_namespaces() if (m := _RUN_ID.match(ns + "-"))}
    if netns.NETNS_ETC.is_dir():
        ids |= {m.group(1) for d in netns.NETNS_ETC.iterdir() if (m := _RUN_ID.match(d.name + "-"))}
    if cpu.CGROUP_CPU.is_dir():
        ids |= {m.group(1) for d in cpu.CGROUP_CPU.iterdir() if (m := _RUN_ID.match(d.name + "-"))}
    return ids


def sweep_leftovers() -> list[str]:
    """Tear down runs whose owner is gone; returns their ids. Live runs are never touched."""
    # Objects first, owners second: a run registers before it creates anything, so the owner of
    # any object found is in the register by the time it is read.
    found = _leftover_ids()
    live = live_run_ids()
    # A run that ended normally while we looked (its teardown removes its objects, then releases
    # it) is not in `live` but has left nothing: only what is still there now is a leftover.
    cleaned = []
    for run_id in sorted((found - live) & _leftover_ids()):
        teardown(RunNames(run_id))
        cleaned.append(run_id)
    for ns in netns.list_namespaces():  # an availability probe whose process is gone (killed mid-probe)
        pid = ns.removeprefix(netns.PROBE_PREFIX)
        if ns.startswith(netns.PROBE_PREFIX) and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            netns.delete_namespace(ns)
            cleaned.append(ns)
    return cleaned
