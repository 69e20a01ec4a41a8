"""Atomic writes and the work-folder layout: nothing half-written under a final name."""

from __future__ import annotations

import json
import os
import stat

import pytest

from winnow.curate.atomic import rename_into_place, write_json_atomic, write_text_atomic
from winnow.curate.workdir import WorkDir, fresh_tmp


def test_json_lands_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "result.json"
    write_json_atomic(target, {"a": 1, "path": tmp_path})
    assert json.loads(target.read_text()) == {"a": 1, "path": str(tmp_path)}
    assert os.listdir(target.parent) == ["result.json"]


def test_failed_write_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "manifest.json"
    write_json_atomic(target, {"v": 1})

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        write_json_atomic(target, {"v": 2})
    assert json.loads(target.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["manifest.json"]


def test_published_file_gets_the_umask_mode_not_mkstemps_0600(tmp_path):
    write_text_atomic(tmp_path / "page.html", "<p>")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "page.html").stat().st_mode) == 0o666 & ~mask


def test_task_folder_counts_only_once_renamed_into_place(tmp_path):
    work = WorkDir(str(tmp_path))
    final = work.task(0, 3)
    assert final == tmp_path / "_work" / "phase-0" / "task-00003"
    tmp = fresh_tmp(final)
    (tmp / "rows.parquet").write_bytes(b"x")
    assert work.task_files(0, "rows.parquet") == []  # a temporary folder is not a finished task
    assert fresh_tmp(final) == tmp and not any(tmp.iterdir())  # a crashed attempt's left-overs are cleared
    (tmp / "rows.parquet").write_bytes(b"x")
    rename_into_place(tmp, final)
    assert work.task_files(0, "rows.parquet") == [str(final / "rows.parquet")]


def test_plan_marker_and_decision_paths(tmp_path):
    work = WorkDir(str(tmp_path))
    assert not work.plan_done("02.dedup.exact")
    work.plan("02.dedup.exact").mkdir(parents=True)
    work.mark_plan_done("02.dedup.exact")
    assert work.plan_done("02.dedup.exact")
    assert (
        work.decision("02.dedup.exact", 7)
        == tmp_path / "_work" / "plans" / "02.dedup.exact" / "decision" / "task-00007.parquet"
    )


def test_the_umask_at_write_time_applies(tmp_path):
    old = os.umask(0o077)  # what [output] mode = 0o600 sets for a job
    try:
        write_json_atomic(tmp_path / "manifest.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "manifest.json").stat().st_mode) == 0o600


def test_a_killed_processs_scratch_folder_is_removed_by_the_next_one_and_nothing_else(tmp_path, monkeypatch):
    """SIGKILL skips cleanup: the next task sweeps scratch folders of dead pids, never a live one's or the user's."""
    import subprocess
    import sys

    from winnow.curate.workdir import task_scratch

    monkeypatch.setenv("WINNOW_SCRATCH", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = [tmp_path / f"winnow-task-pid{dead_pid}-abcd1234", tmp_path / f"winnow-0123abcd-pid{dead_pid}-x_y9z8w7"]
    live = tmp_path / f"winnow-task-pid{os.getppid()}-live0000"
    users = [tmp_path / f"winnow-notes-pid{dead_pid}-mine", tmp_path / "winnow-task-keep"]
    for folder in stale + [live] + users:
        folder.mkdir()
        (folder / "rows.parquet").write_bytes(b"x")
    with task_scratch("s3://bucket/job"):
        mine = [p for p in tmp_path.iterdir() if p.name.startswith(f"winnow-task-pid{os.getpid()}-")]
        assert len(mine) == 1
    assert not any(p.exists() for p in stale) and not mine[0].exists()
    assert live.exists() and all(p.exists() for p in users)


def test_a_full_disk_is_said_with_the_file_and_inodes_that_ran_out_are_told_from_bytes(tmp_path, monkeypatch):
    """A failed write names no file (the CLI could only say "free space there"), and a device out of inodes
    with bytes to spare was said to be out of space, beside a free-space figure that said otherwise."""
    from winnow.curate.errors import no_space

    def full(fd, *args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as err:
        write_text_atomic(tmp_path / "report.html", "<html>")
    assert err.value.filename == str(tmp_path / "report.html") and err.value.errno == 28
    monkeypatch.undo()
    assert str(no_space(tmp_path, err.value, then="run it again")).startswith("no space left on the device holding")
    real = os.statvfs(tmp_path)
    fields = {name: getattr(real, name) for name in dir(real) if name.startswith("f_")}
    monkeypatch.setattr(os, "statvfs", lambda path: type("S", (), {**fields, "f_files": 60, "f_favail": 3})())
    said = str(no_space(tmp_path, err.value, then="run it again"))
    assert said.startswith(f"no file can be created on the device holding {tmp_path}: its inodes") and "3 left" in said
