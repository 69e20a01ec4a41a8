"""``curate.lock.FolderLock``: one writer per folder, on a local disk (flock) and on S3 (a lease object, moto)."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from winnow.curate.errors import OutputError
from winnow.curate.lock import LOCK, FolderLock, _boot_id, _get, _put, lock_info

FORK = multiprocessing.get_context("fork")


def _hold(folder: str, ready, done) -> None:
    FolderLock(folder, what="output folder").acquire()
    ready.set()
    done.wait(30)


def _holder_process(folder: Path):
    ready, done = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold, args=(str(folder), ready, done))
    child.start()
    assert ready.wait(30)
    return child, done


def test_a_second_writer_is_refused_naming_the_holder(tmp_path):
    child, done = _holder_process(tmp_path / "out")
    try:
        with pytest.raises(
            OutputError,
            match=rf"in use by another winnow run \(host {socket.gethostname()}, "
            rf"pid {child.pid}, started 20",
        ):
            FolderLock(tmp_path / "out", what="output folder").acquire()
    finally:
        done.set()
        child.join()
    with FolderLock(tmp_path / "out", what="output folder"):  # its holder ended: free
        assert lock_info(tmp_path / "out")["pid"] == os.getpid()
    assert not (tmp_path / "out" / LOCK).exists()  # released: nothing left behind


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    child, _ = _holder_process(tmp_path / "out")
    os.kill(child.pid, signal.SIGKILL)
    child.join()
    assert lock_info(tmp_path / "out")["pid"] == child.pid  # its details are still there...
    with FolderLock(tmp_path / "out", what="output folder"):  # ...but the kernel dropped its flock
        assert lock_info(tmp_path / "out")["pid"] == os.getpid()


def _killed_mid_handover(folder: str) -> None:
    """Take the flock and die after writing half of the details (the moment a hand-over can be cut)."""
    import fcntl

    fd = os.open(Path(folder) / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.write(fd, b'{"host": "half-writ')
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_kill_during_hand_over_leaves_a_lock_the_next_run_takes(tmp_path):
    (tmp_path / "out").mkdir()
    child = FORK.Process(target=_killed_mid_handover, args=(str(tmp_path / "out"),))
    child.start()
    child.join()
    assert child.exitcode == -signal.SIGKILL and lock_info(tmp_path / "out") is None  # torn details
    with FolderLock(tmp_path / "out", what="output folder"):
        assert lock_info(tmp_path / "out")["pid"] == os.getpid()


def test_one_process_may_take_its_own_lock_again(tmp_path):
    first = FolderLock(tmp_path, what="run folder").acquire()
    again = FolderLock(tmp_path, what="run folder").acquire()
    assert again is first
    again.release()
    assert (tmp_path / LOCK).exists()  # still held once
    first.release()
    assert not (tmp_path / LOCK).exists()


# -- an object store: a lock object with a lease ----------------------------------------------------------
@pytest.fixture
def bucket(s3_server):
    fs = fsspec.filesystem("s3", client_kwargs={"endpoint_url": s3_server})
    name = f"locks-{time.monotonic_ns()}"
    fs.mkdir(name)
    return fs, f"s3://{name}/job"


def _plant(fs, folder: str, *, age: float, lease: float = 60.0, pid: int = 4242, here: bool = False) -> None:
    """The lock object of another run on another host (``here``: this host), renewed ``age`` seconds ago."""
    info = {
        "host": socket.gethostname() if here else "elsewhere",
        "boot": _boot_id() if here else None,
        "pid": pid,
        "started": "2026-01-01T00:00:00+00:00",
        "token": "t",
        "lease_seconds": lease,
        "renewed": time.time() - age,
    }
    _put(fs, f"{folder.removeprefix('s3://')}/{LOCK}", info, create=True)


def test_s3_a_live_lease_refuses_a_second_writer(bucket):
    fs, folder = bucket
    _plant(fs, folder, age=1.0)
    with pytest.raises(OutputError, match=r"host elsewhere, pid 4242.*once its lease of 60 s has run out"):
        FolderLock(folder, what="output folder").acquire()


def test_s3_a_dead_runs_lease_is_taken_over(bucket):
    fs, folder = bucket
    _plant(fs, folder, age=120.0)
    with FolderLock(folder, what="output folder"):
        assert lock_info(folder)["pid"] == os.getpid()
    assert not fs.exists(f"{folder}/{LOCK}")


def test_s3_a_live_lease_of_a_process_gone_from_this_host_is_taken_over_at_once(bucket):
    fs, folder = bucket
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    _plant(fs, folder, age=1.0, pid=int(gone.stdout), here=True)  # killed a second ago: its lease still runs
    with FolderLock(folder, what="output folder"):
        assert lock_info(folder)["pid"] == os.getpid()
    _plant(fs, folder, age=1.0, pid=os.getppid(), here=True)  # a live process of this host: refused
    with pytest.raises(OutputError, match="in use by another winnow run"):
        FolderLock(folder, what="output folder").acquire()


def test_s3_of_two_runs_taking_over_one_lease_one_wins(bucket):
    fs, folder = bucket
    _plant(fs, folder, age=120.0)
    path = f"{folder.removeprefix('s3://')}/{LOCK}"
    _, etag = _get(fs, path)
    _put(fs, path, {"host": "first", "pid": 1}, etag=etag)  # the other run wins the race...
    with pytest.raises(Exception, match="changed|pre-conditions"):
        _put(fs, path, {"host": "second", "pid": 2}, etag=etag)  # ...and the loser's conditional write fails
    assert _get(fs, path)[0]["host"] == "first"


def test_s3_the_holder_renews_its_lease_and_notices_a_takeover(bucket):
    fs, folder = bucket
    lock = FolderLock(folder, what="output folder", lease_seconds=0.8).acquire()
    try:
        first = lock_info(folder)["renewed"]
        time.sleep(0.7)
        assert lock_info(folder)["renewed"] > first  # renewed every lease / 4
        fs.pipe_file(f"{folder}/{LOCK}", json.dumps({"host": "thief", "pid": 9}).encode())  # taken over
        deadline = time.time() + 10
        while lock.lost is None and time.time() < deadline:
            time.sleep(0.1)
        with pytest.raises(OutputError, match="lost its lock"):
            lock.check()
    finally:
        lock.release()
    assert lock_info(folder)["host"] == "thief"  # never deleted from under its new holder
