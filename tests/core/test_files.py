"""`spantrain._spec`'s file writing: whole files or the old ones, and a full disk said as such."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from spantrain._spec import replace_file
from spantrain.errors import DiskFull

Usage = namedtuple("Usage", "total used free")


def _cut_short(tmp):  # what torch.save raised on a 2 MB tmpfs, with part of the file written
    tmp.write_bytes(b"part")
    raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 828352 vs 828244")


def test_a_full_disk_is_said_as_such_and_the_old_file_kept(tmp_path, monkeypatch):
    # train-policy ended in 30 lines of torch traceback
    path = tmp_path / "resume.pt"
    path.write_text("old")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(2**21, 2**21, 0))
    with pytest.raises(DiskFull) as e:
        replace_file(path, _cut_short)
    assert str(e.value) == f"cannot write {path}: its disk is full; free some space (the file as it was before is kept)"
    assert e.value.exit_code == 1 and path.read_text() == "old" and sorted(tmp_path.iterdir()) == [path]
    # with room on the disk the writer's own error stands: it is not about space
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(2**30, 0, 2**30))
    with pytest.raises(RuntimeError, match="unexpected pos"):
        replace_file(path, _cut_short)
    assert sorted(tmp_path.iterdir()) == [path]


def test_a_directory_that_takes_no_file_is_not_a_full_disk():
    # /proc has no free space to tell: a write there was DiskFull, "its disk is full; free some space"
    from spantrain._spec import write_text_atomic

    with pytest.raises(OSError) as e:
        write_text_atomic("/proc/x.json", "{}")
    assert not isinstance(e.value, DiskFull)
    assert str(e.value) == "[Errno 2] cannot create a file in /proc (No such file or directory): '/proc/x.json'"

    def torch_refused(tmp):  # what torch.save raised there, no errno to tell
        raise RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with strerror: No such file")

    with pytest.raises(RuntimeError, match="open file failed"):
        replace_file(Path("/proc/x.pt"), torch_refused)


def test_a_really_full_disk_is_still_said_as_such(tmpfs):
    # what tells it from /proc: the disk has a size, and the write fails with ENOSPC
    from spantrain._spec import write_text_atomic

    disk = tmpfs("64K")
    with pytest.raises(DiskFull, match="its disk is full"):
        write_text_atomic(disk / "big.json", "x" * 2**20)
    assert sorted(disk.iterdir()) == []


def test_from_file_given_no_path_says_so():
    # Cluster / Workload / Plan / Calibration.from_file(None) were TypeErrors from Path()
    from spantrain.cluster import Cluster
    from spantrain.env.calibration import Calibration
    from spantrain.errors import PlanError, SpecError, WorkloadError
    from spantrain.plan import Plan
    from spantrain.workload import Workload
    for read, error in ((Cluster.from_file, SpecError), (Workload.from_file, WorkloadError),
                        (Plan.from_file, PlanError), (Calibration.from_file, SpecError)):
        with pytest.raises(error, match="expected the path of a file, got None"):
            read(None)
