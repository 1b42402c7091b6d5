"""Run registration and the sweep of leftovers: a live run is never swept, whatever state
directory it uses; a dead one's objects are."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from spantrain.cluster import Cluster
from spantrain.errors import EmulationError
from spantrain.runtime.emulator import EmulatedCluster, cpu, netns, state

SPEC = {
    "name": "state",
    "devices": [{"id": "a", "count": 2, "region": "r", "tflops": 10, "memory_gb": 4}],
    "network": {"regions": {"r": {"gbps": 0.1, "latency_ms": 1}}},
}


@pytest.fixture
def machine(tmp_path, monkeypatch) -> Path:
    """Root on a pretend machine: its register, cgroups and namespaces are directories in tmp_path."""
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(state, "REGISTRY", tmp_path / "registry")
    monkeypatch.setattr(state, "_NETNS_RUN", tmp_path / "netns")
    monkeypatch.setattr(cpu, "CGROUP_CPU", tmp_path / "cgroup")
    monkeypatch.setattr(netns, "NETNS_ETC", tmp_path / "etc-netns")
    for d in ("netns", "cgroup", "etc-netns"):
        (tmp_path / d).mkdir()
    monkeypatch.setattr(state.shutil, "which", lambda name: f"/usr/sbin/{name}")
    monkeypatch.setattr(netns, "list_namespaces", lambda: sorted(p.name for p in (tmp_path / "netns").iterdir()))
    monkeypatch.setattr(netns, "delete_namespace", lambda ns: (tmp_path / "netns" / ns).unlink())
    return tmp_path


def _bring_up(names: state.RunNames) -> list[Path]:
    """A pretend run's objects: its cgroup with a device group, a hub and a device namespace."""
    (names.cgroup / "d0").mkdir(parents=True)
    spaces = [netns.NETNS_ETC.parent / "netns" / ns for ns in (names.hub, names.device_ns(0))]
    for ns in spaces:
        ns.touch()
    return [names.cgroup, *spaces]


def test_a_live_run_of_another_state_directory_is_not_swept(machine, monkeypatch):
    # root's sweep took every namespace and cgroup not registered in its own state directory
    # for a leftover, and killed the devices of runs using another one (the tests use one each)
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(machine / "theirs"))
    theirs = state.new_run()
    objects = _bring_up(theirs)
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(machine / "mine"))
    assert state.sweep_leftovers() == []
    assert all(p.exists() for p in objects)
    mine = state.new_run()
    assert mine.run_id != theirs.run_id and state.live_run_ids() >= {theirs.run_id, mine.run_id}
    # once its owner is gone they are leftovers, also to a sweep from another state directory
    entry = state.REGISTRY / f"{theirs.run_id}.json"
    entry.write_text(json.dumps({"run_id": theirs.run_id, "pid": os.getpid(), "start": "0"}))  # a reused pid
    assert state.sweep_leftovers() == [theirs.run_id]
    assert not any(p.exists() for p in objects) and not entry.exists()
    assert state.live_run_ids() == {mine.run_id}
    assert state.teardown(mine) == [] and not any(state.REGISTRY.iterdir())


def test_objects_no_run_claims_are_leftovers_and_their_id_is_not_reused(machine, monkeypatch):
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(machine / "mine"))
    objects = _bring_up(state.RunNames("beef"))  # a run that crashed between its teardown's steps
    ids = iter(["beef", "cafe"])
    monkeypatch.setattr(state.secrets, "token_hex", lambda n: next(ids))
    assert state.new_run().run_id == "cafe"
    assert all(p.exists() for p in objects)
    assert state.sweep_leftovers() == ["beef"]
    assert not any(p.exists() for p in objects)


def test_a_run_that_ends_while_the_sweep_looks_is_not_called_a_crashed_one(machine, monkeypatch):
    # the sweep found its objects, then its owner tore them down and released it, so it was no
    # longer live: the next emulator start said "removed leftovers of crashed run(s)" about it
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(machine / "mine"))
    sibling = state.new_run()
    _bring_up(sibling)
    live_run_ids = state.live_run_ids

    def ends_meanwhile() -> set[str]:
        state.teardown(sibling)
        return live_run_ids()

    monkeypatch.setattr(state, "live_run_ids", ends_meanwhile)
    assert state.sweep_leftovers() == []


@pytest.mark.skipif(cpu.unavailable_reason() is not None, reason=f"needs CPU quotas: {cpu.unavailable_reason()}")
def test_a_root_run_leaves_the_cgroup_of_a_live_run_elsewhere_alone(tmp_path, monkeypatch):
    # on the real machine (cgroups, no namespaces): the second set-up removed the first's cgroup
    cluster = Cluster.from_spec(SPEC)
    monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "first"))
    first = EmulatedCluster(cluster, mode="local", cpus=1, log=lambda s: None).setup()
    try:
        group = first.names.cgroup
        assert first.cpu_limited and group.is_dir()
        monkeypatch.setenv("SPANTRAIN_EMULATOR_DIR", str(tmp_path / "second"))
        with EmulatedCluster(cluster, mode="local", cpus=1, log=lambda s: None) as second:
            assert second.names.cgroup.is_dir()
            assert group.is_dir()
    finally:
        first.cleanup()
    assert not group.exists() and not (state.REGISTRY / f"{group.name[4:]}.json").exists()


@pytest.fixture
def default_dir(tmp_path, monkeypatch) -> Path:
    """This user's default state directory, moved into tmp_path."""
    monkeypatch.delenv("SPANTRAIN_EMULATOR_DIR", raising=False)
    monkeypatch.setattr(state, "DEFAULT_DIR", tmp_path / "spantrain-emulator")
    uid = os.geteuid()
    return state.DEFAULT_DIR if uid == 0 else Path(f"{state.DEFAULT_DIR}-{uid}")


@pytest.mark.parametrize("made_by", ["another user", "anyone-writable", "a link"])
def test_a_default_state_directory_someone_else_controls_is_refused(default_dir, tmp_path, monkeypatch, made_by):
    # the default name is predictable: another user could make it first and block or tamper with runs
    if made_by == "another user":
        monkeypatch.setattr(os, "geteuid", lambda: 4242)  # the directory is this process's real user's
        default_dir = Path(f"{state.DEFAULT_DIR}-4242")
    if made_by == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        default_dir.symlink_to(tmp_path / "elsewhere")
    else:
        default_dir.mkdir()
        default_dir.chmod(0o777 if made_by == "anyone-writable" else 0o700)
    with pytest.raises(EmulationError, match="set SPANTRAIN_EMULATOR_DIR") as err:
        state.new_run()
    assert str(default_dir) in str(err.value) and "\n" not in str(err.value)
    assert not any(p.is_dir() for p in (tmp_path / "elsewhere").glob("*"))


def test_a_default_state_directory_is_made_private(default_dir):
    names = state.new_run()
    try:
        assert default_dir.is_dir() and default_dir.stat().st_mode & 0o077 == 0
        assert names.run_dir.parent == default_dir
        assert state.state_dir() == default_dir  # still accepted: ours
    finally:
        state.teardown(names)


_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _nobody_runs_python() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    return subprocess.run([*_NOBODY, sys.executable, "-c", "import spantrain"], capture_output=True,
                          timeout=30).returncode == 0


@contextlib.contextmanager
def _made_for_the_test(path: Path):
    """`path` as a directory during the block; removed afterwards if the block made it (and left it empty)."""
    existed = path.exists()
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    finally:
        if not existed:
            with contextlib.suppress(OSError):  # in use by a run started meanwhile: not ours to remove
                path.rmdir()


@pytest.mark.skipif(not _nobody_runs_python(), reason="needs root, setpriv and a Python user nobody can run")
def test_another_user_falls_back_beside_roots_state_directory():
    # root's runs made the default state directory, which other users cannot write in: a user's
    # emulate failed ('Permission denied') instead of falling back to local processes
    theirs = Path(f"{state.DEFAULT_DIR}-65534")
    existed = theirs.exists()
    with _made_for_the_test(state.DEFAULT_DIR), tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        spec = Path(tmp) / "c.json"
        spec.write_text(json.dumps(SPEC))
        spec.chmod(0o644)
        env = {k: v for k, v in os.environ.items() if k != "SPANTRAIN_EMULATOR_DIR"}
        try:
            proc = subprocess.run([*_NOBODY, sys.executable, "-m", "spantrain", "emulate", "-c", str(spec), "--",
                                   "sh", "-c", "echo $RANK"], capture_output=True, text=True, timeout=60, env=env,
                                  cwd=tmp)
        finally:
            if not existed:
                shutil.rmtree(theirs, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    assert "network namespaces unavailable (not running as root)" in proc.stderr
    assert sorted(proc.stdout.split()) == ["0", "1", "[a-0]", "[a-1]"]
