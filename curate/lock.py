"""One writer per folder: a curation output or a training run folder is locked while a run writes it.

Two runs writing one folder corrupt each other (one clears what the other wrote; a second trainer
resumes the first's state and then fails on its files). ``FolderLock`` lets the first run in and
refuses the second at once, naming the holder (host, pid, start time) and the way on.

* A local folder: ``<folder>/.winnow-lock``, held with ``flock``. The kernel drops the lock when its
  process dies however it dies, so a lock left by a killed run is taken over by the next one, with
  no guessing about stale pids; the file only carries the holder's details for the message. The
  file is removed on release, and an acquirer checks that the file it locked is still the one at
  the path (a release may unlink it in between).
* An object store (``s3://bucket/job``): an object ``<prefix>/.winnow-lock`` with a lease. It is
  created only if absent (S3 conditional write, ``If-None-Match: *``); the holder renews the lease
  from a thread every ``lease_seconds / 4`` (``If-Match`` its own ETag, so a renewal never
  overwrites another holder); a lease not renewed for ``lease_seconds``, or held by a process of this host
  that no longer runs, belongs to a dead run and is
  taken over with ``If-Match`` on the ETag read, so of two runs taking it over at once one wins.
  Hosts' clocks must agree to within a small part of the lease. A holder that finds its lease
  taken (it stalled past the lease) reports it, and the curation runner stops at its next phase.
  Stores without conditional writes get the same protocol with check-then-write (best effort).

The lock is per process: a process that already holds a folder's lock may take it again (a
count), which is how one ``winnow run`` trains into a folder it curated into.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from winnow.curate.errors import FolderInUseError, OutputError

log = logging.getLogger(__name__)

LOCK = ".winnow-lock"
LEASE_SECONDS = 60.0

_held: dict[str, FolderLock] = {}  # this process's locks, by folder
_held_guard = threading.Lock()


def _holder(lease: float | None = None) -> dict[str, Any]:
    now = time.time()
    info = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "boot": _boot_id(),
        "token": uuid.uuid4().hex,
        "started": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return info if lease is None else {**info, "lease_seconds": lease, "renewed": now}


def _describe(info: dict | None) -> str:
    if not info:
        return "its holder is writing its details right now"
    return f"host {info.get('host')}, pid {info.get('pid')}, started {info.get('started')}"


class FolderLock:
    """The lock of one folder (a local path or an fsspec URL); ``what`` names the folder's role in messages."""

    def __init__(
        self,
        folder: str | Path,
        *,
        what: str,
        storage_options: dict | None = None,
        lease_seconds: float = LEASE_SECONDS,
        setting: str | None = None,
    ) -> None:
        self.folder, self.what, self.lease = str(folder).rstrip("/"), what, float(lease_seconds)
        self.setting = setting  # the key that names the folder (job.output), for a store's errors
        self.remote = "://" in self.folder
        self.storage_options = dict(storage_options or {})
        self.lost: str | None = None  # why the lease was lost, for a remote lock whose holder stalled
        self._fd: int | None = None
        self._count = 0
        self._etag: str | None = None
        self._info: dict | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def key(self) -> str:
        return self.folder if self.remote else str(Path(self.folder).resolve())

    # -- the way in and out --------------------------------------------------------------------------------
    def acquire(self) -> FolderLock:
        """Take the lock, or raise ``OutputError`` naming who holds it; returns the lock actually held."""
        with _held_guard:
            mine = _held.get(self.key)
            if mine is not None:
                mine._count += 1
                return mine
            if self.remote:
                try:
                    self._take_remote()
                except OutputError:
                    raise
                except Exception as err:  # the store's own errors: a missing bucket, credentials, the network
                    raise self._store_error(err) from err
            else:
                self._take_local()
            self._count = 1
            _held[self.key] = self
            return self

    def release(self) -> None:
        with _held_guard:
            if self._count == 0:
                return
            self._count -= 1
            if self._count:
                return
            _held.pop(self.key, None)
            self._drop_remote() if self.remote else self._drop_local()

    def check(self) -> None:
        """Raise ``OutputError`` if a remote lease was lost (another run took the folder over)."""
        if self.lost:
            raise OutputError(
                f"{self.what} {self.folder}: this run lost its lock ({self.lost}); another run now "
                "writes the folder, so this one stops. Re-run once that one is done"
            )

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _not_ours(self, path: Path, what: str) -> OutputError:
        return OutputError(
            f"{self.what} {self.folder}: {path.name} there is {what} winnow did not write (winnow keeps a lock of "
            "that name in the folders it writes); move it away and run again, or give this run another folder"
        )

    def _refuse(self, info: dict | None) -> FolderInUseError:
        return FolderInUseError(
            f"{self.what} {self.folder} is in use by another winnow run ({_describe(info)}): one run writes a folder "
            f"at a time. Wait for that run to end (or stop it), or give this one another folder; a lock left by a run "
            f"that died is taken over by the next run by itself"
            + (
                f" once its lease of {info.get('lease_seconds', self.lease):g} s has run out"
                if self.remote and info
                else ""
            )
        )

    def _store_error(self, err: Exception) -> OutputError:
        where = f"{self.setting} = {self.folder!r}" if self.setting else f"{self.what} {self.folder}"
        if isinstance(err, PermissionError):
            return OutputError(f"{where}: the store refused access ({err}); check the credentials or storage_options")
        return OutputError(
            f"{where}: cannot write its lock object ({type(err).__name__}: {err}); check the URL, the "
            "network and the credentials (storage_options)"
        )

    # -- a local folder: flock ---------------------------------------------------------------------------------
    def _take_local(self) -> None:
        folder = Path(self.folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputError(
                f"cannot write the {self.what} {folder}: {err.strerror or err}; choose a folder you "
                "can write or fix its permissions"
            ) from err
        path = folder / LOCK
        while True:
            if path.is_symlink() or (path.exists() and not path.is_file()):
                raise self._not_ours(path, "a link" if path.is_symlink() else "a folder")
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as err:
                raise OutputError(
                    f"cannot write the {self.what} {folder}: {err.strerror or err}; choose a folder "
                    "you can write or fix its permissions"
                ) from err
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise OutputError(f"cannot lock the {self.what} {folder}: {err.strerror or err}") from err
                raise self._refuse(_read_info(path)) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                held = os.pread(fd, 1 << 16, 0)
                if held and not _is_holder(held):  # a killed run's lock holds its holder; empty: killed before that
                    os.close(fd)
                    raise self._not_ours(path, "a file")
                break
            os.close(fd)  # the holder released (and unlinked) it between our open and our flock: try again
        self._fd, self._info = fd, _holder()
        data = json.dumps(self._info).encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except OSError as err:  # a full disk: said with the lock's path
            raise OSError(err.errno, err.strerror, str(path)) from err

    def _drop_local(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(Path(self.folder) / LOCK)  # while still held: a waiter that opened it sees another inode
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    # -- an object store: a lock object with a lease ----------------------------------------------------------
    def _store(self) -> tuple[Any, str]:
        import fsspec

        fs, path = fsspec.core.url_to_fs(self.folder, **self.storage_options)
        return fs, f"{path.rstrip('/')}/{LOCK}"

    def _take_remote(self) -> None:
        fs, path = self._store()
        info = _holder(self.lease)
        while True:
            try:
                self._etag = _put(fs, path, info, create=True)
                break
            except FileExistsError:
                held, etag = _get(fs, path)
            if etag is None:
                continue  # its holder released it between our write and our read: try again
            live = held is not None and time.time() - float(held.get("renewed", 0)) <= float(
                held.get("lease_seconds", self.lease)
            )
            if live and not _dead_here(held):
                raise self._refuse(held) from None
            why = "whose holder died on this host" if live else "whose lease ran out"
            log.warning("%s %s: taking over a lock %s (%s)", self.what, self.folder, why, _describe(held))
            try:
                self._etag = _put(fs, path, info, etag=etag)
                break
            except _Conflict:  # another run took it over first
                raise self._refuse(_get(fs, path)[0]) from None
        self._info = info
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew, name=f"winnow-lock {self.folder}", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        fs, path = self._store()
        while not self._stop.wait(self.lease / 4):
            try:
                self._info = {**self._info, "renewed": time.time()}
                self._etag = _put(fs, path, self._info, etag=self._etag)
            except _Conflict:
                self.lost = f"its lease on {self.folder}/{LOCK} was taken over after {self.lease:g} s without renewal"
                log.error("%s %s: %s", self.what, self.folder, self.lost)
                return
            except OSError as err:  # a network error: try again; the lease is long enough to miss a few
                log.warning("%s %s: could not renew the lock's lease: %s", self.what, self.folder, err)

    def _drop_remote(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.lost:
            return
        fs, path = self._store()
        try:
            _delete(fs, path, self._etag)
        except (_Conflict, OSError) as err:
            log.warning("%s %s: the lock object was not removed (%s)", self.what, self.folder, err)


def lock_info(folder: str | Path, storage_options: dict | None = None) -> dict | None:
    """The holder's details of ``folder``'s lock, if the file or object is there (it may be stale)."""
    if "://" in str(folder):
        return _get(*FolderLock(folder, what="folder", storage_options=storage_options)._store())[0]
    return _read_info(Path(folder) / LOCK)


def _is_holder(data: bytes) -> bool:
    """Whether ``data`` is what a lock of winnow's holds: its holder's details (``_holder``), or their start where
    a kill cut the writing short."""
    try:
        info = json.loads(data)
    except ValueError:
        return data.startswith(b'{"host": ')
    return isinstance(info, dict) and {"host", "pid", "token"} <= set(info)


def _read_info(path: Path) -> dict | None:
    try:
        info = json.loads(path.read_bytes()[: 1 << 16])
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


class _Conflict(Exception):
    """A conditional write or delete found the object changed (or gone)."""


def _boot_id() -> str | None:
    """This machine's boot id (Linux), or None where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _dead_here(info: dict) -> bool:
    """Whether the lock's holder ran on this host and its process is gone (a killed run re-run on the same machine
    takes its folder over at once, without waiting for the lease to run out)."""
    here = _boot_id()
    if info.get("host") != socket.gethostname() or here is None or info.get("boot") != here:
        return False  # another machine (containers share host names; the boot id tells them apart), or unknown
    if not isinstance(info.get("pid"), int):
        return False
    try:
        os.kill(info["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _is_s3(fs: Any) -> bool:
    return hasattr(fs, "call_s3")


def _put(fs: Any, path: str, info: dict, *, create: bool = False, etag: str | None = None) -> str | None:
    """Write the lock object: only if absent (``create``: FileExistsError otherwise) or only if still ``etag``."""
    body = json.dumps(info).encode()
    if _is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        condition = {"IfNoneMatch": "*"} if create else {"IfMatch": etag} if etag else {}
        try:
            return fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body, **condition).get("ETag")
        except FileExistsError:
            raise
        except OSError as err:
            if "PreconditionFailed" in repr(err.__cause__) or "ConditionalRequestConflict" in repr(err.__cause__):
                raise FileExistsError(path) if create else _Conflict(str(err)) from err
            raise
    # Stores without conditional writes: check, then write (best effort; S3 is exact).
    if create and fs.exists(path):
        raise FileExistsError(path)
    if etag is not None and _get(fs, path)[1] != etag:
        raise _Conflict(f"{path} changed")
    fs.pipe_file(path, body)
    return _get(fs, path)[1]


def _get(fs: Any, path: str) -> tuple[dict | None, str | None]:
    """The lock object's holder details and its ETag (a digest of its bytes where the store has none)."""
    try:
        if _is_s3(fs):  # the ETag first: bytes read after it are as new or newer, never older
            fs.invalidate_cache(path)
            etag = fs.info(path).get("ETag")
            data = fs.cat_file(path)
        else:
            data = fs.cat_file(path)
            etag = hashlib.sha256(data).hexdigest()
    except FileNotFoundError:
        return None, None
    try:
        info = json.loads(data[: 1 << 16])
    except ValueError:
        info = None
    return (info if isinstance(info, dict) else None), etag


def _delete(fs: Any, path: str, etag: str | None) -> None:
    if _is_s3(fs):
        bucket, key, _ = fs.split_path(path)
        try:
            fs.call_s3("delete_object", Bucket=bucket, Key=key, **({"IfMatch": etag} if etag else {}))
        except OSError as err:
            if "PreconditionFailed" in repr(err.__cause__):
                raise _Conflict(str(err)) from err
            raise
        return
    if _get(fs, path)[1] == etag:
        fs.rm_file(path)
