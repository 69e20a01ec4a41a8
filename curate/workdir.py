"""The layout of a job's work folder, ``<output>/_work``: phase → task → completion marker.

::

    _work/fingerprint                          the job's fingerprint; another job clears the folder
    _work/phase-<k>/prefix                     the key of the job prefix the phase depends on (curate.reuse)
    _work/phase-<k>/task-<NNNNN>/              one map task's outputs, renamed from .task-<NNNNN>.tmp/
        rows.parquet | sorted.parquet          kept rows (lz4; sorted by ``order`` in an ordered final phase)
        val.parquet                            final phase: validation rows, gathered into shards afterwards
        keys.parquet                           the next barrier's spilled keys (with ``_task``)
        stats.json                             the task's stats and outputs (what a re-run returns)
        released                               rows, keys and ids deleted: the next phase has read them
        reused.json                            adopted from another job's work folder (curate.reuse)
    _work/plans/<stage id>/                    a barrier's global step (prefix and reused.json as a phase's)
        decision/task-<NNNNN>.parquet          that task's rows of the decision
        report.json, seconds.json, _SUCCESS    _SUCCESS is written last
    _work/write/task-<NNNNN>.json              an ordered-write task's result (its presence marks it done)
    _work/write-val/task-<NNNNN>.json          a validation write group's result, named by its first task

A non-final phase's rows, keys and ids are deleted once every task of the next phase has finished
(``release``; not with ``[job] keep_work``), so the folder holds about two phases of rows at a time.

Rejects and shards go to the output folder itself, not here (``rejects/p<k>-t<NNNNN>.parquet``).
A folder or file is final only under its final name; everything is first written under a
temporary one (``fresh_tmp``) and renamed into place (``curate.atomic.rename_into_place``), so a crashed task leaves nothing a re-run would mistake for finished work.

The output folder may be an fsspec URL (``s3://bucket/job``), for nodes that share no disk.
This module is the one place a path becomes a URL: code keeps working on local ``Path``s under
``WorkDir.out`` (for a URL, a private scratch folder of this process, or of one task while it
runs: ``task_scratch``), and ``WorkDir``'s sync methods move files between that folder and the
store. An object store has no rename, so the marker rules become:

* a single object (a shard, a rejects file, ``manifest.json``, a write marker) is uploaded under
  a temporary key ``.<name>.<random>.tmp`` and copied to its final key (``publish_file``);
  readers never look at temporary keys;
* a folder (a map task's, a plan's) is uploaded file by file and counts only once its marker
  — ``stats.json`` for a task, ``_SUCCESS`` for a plan — is uploaded, last (``publish_folder``);
  ``task_done``/``task_files``/``plan_done`` look only at marked folders, so what a killed
  worker left under an unmarked prefix is never read, and the re-run overwrites it.

For a local folder every sync method is a no-op or a plain file-system call.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from winnow.curate.atomic import atomic_leftover, write_text_atomic
from winnow.curate.crashpoints import crash_point
from winnow.curate.errors import ConfigError, OutputError
from winnow.curate.names import path_name

_DONE = "_SUCCESS"
TASK_MARKER = "stats.json"  # a task folder's marker on an object store (written last); locally the folder's rename
RELEASED = "released"  # in a task folder whose spill was deleted once the next phase had read it (``release``)
SPILL = ("rows.parquet", "keys.parquet", "ids.parquet")  # what a later phase reads of a non-final task folder
PREFIX = "prefix"  # in a phase's or plan's folder: the key of the job prefix its outputs depend on (curate.reuse)
REUSED = "reused.json"  # in a task's or plan's folder adopted from another job's work (curate.reuse)
WORK = "_work"


def task_name(task: int) -> str:
    return f"task-{task:05d}"


def reject_name(phase: int, task: int) -> str:
    """A map task's rejects file in ``<output>/rejects/``."""
    return f"p{phase}-t{task:05d}.parquet"


def is_url(path: str | Path) -> bool:
    """Whether an output path is an fsspec URL (``s3://...``) rather than a local folder (``file://`` is local)."""
    text = str(path)
    return "://" in text and not text.startswith("file://")


def local_path(text: str | Path) -> Path:
    """A local path as given, ``~`` expanded, or the one a ``file:`` URL names (``file:///a``, ``file://localhost/a``,
    ``file:/a``): read as a path, ``file:///a`` would be the relative ``file:/a``, and ``~/a`` a folder ``~`` here,
    where fsspec, reading, expands it."""
    text = str(text)
    for prefix, keep in (("file://localhost/", "/"), ("file://", ""), ("file:/", "/")):
        if text.startswith(prefix):
            return Path(keep + text[len(prefix) :])
    return Path(text).expanduser()


def local_output(text: str, key: str) -> Path:
    """``local_path`` of an output that must be a local folder; ``ConfigError`` naming ``key`` for another URL (read
    as a path, ``s3://b/run`` was a folder ``s3:`` here, and nothing reached the store)."""
    if is_url(text):
        raise ConfigError(
            f"{key} = {text!r} is a URL; it is written to a local folder: give a local path, and copy the folder to "
            "the store once it is written"
        )
    return local_path(text)


def check_url(url: str, key: str, storage_options: dict[str, Any] | None = None) -> None:
    """Fail early, naming ``key``, when no fsspec driver for ``url``'s scheme is installed."""
    import fsspec

    scheme = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as err:
        hint = _DRIVERS.get(scheme, f"the fsspec driver for {scheme}:// (see fsspec's list of implementations)")
        raise ConfigError(
            f"{key} = {url!r}: no fsspec driver for {scheme}:// is installed ({err}); install {hint}, "
            f"or give a local folder"
        ) from err


_DRIVERS = {
    "s3": "it with: pip install 'winnow[s3]' (s3fs)",
    "s3a": "it with: pip install 'winnow[s3]' (s3fs)",
    "gs": "gcsfs (pip install gcsfs)",
    "gcs": "gcsfs (pip install gcsfs)",
    "az": "adlfs (pip install adlfs)",
    "abfs": "adlfs (pip install adlfs)",
    "abfss": "adlfs (pip install adlfs)",
}

# For a URL output, the local folder this process (or the task running now) works in.
_ROOTS: dict[str, Path] = {}


def local_root(output: str | Path) -> Path:
    """The local folder holding a job's files in this process: ``output`` itself, or for a URL a scratch mirror."""
    if not is_url(output):
        return local_path(output)
    url = str(output)
    root = _ROOTS.get(url)
    if root is None:
        root = _scratch(f"winnow-{hashlib.sha256(url.encode()).hexdigest()[:8]}")
        _ROOTS[url] = root
        atexit.register(shutil.rmtree, root, True)
    return root


_SCRATCH_NAME = re.compile(r"winnow-(?:task|[0-9a-f]{8})-pid(\d+)-[A-Za-z0-9_]{8}")


def _scratch(kind: str) -> Path:
    """A new private scratch folder ``<kind>-pid<PID>-<random>``, after removing those of dead processes.

    A process killed with SIGKILL never runs its cleanup, so its folder would stay in the
    scratch base (``WINNOW_SCRATCH`` or the system's temporary folder) for ever. Each folder
    carries its owner's pid; one whose owner no longer runs on this machine is removed here.
    Only names of this form are touched, and never a live process's.
    """
    base = Path(os.environ.get("WINNOW_SCRATCH") or tempfile.gettempdir())
    for stale in base.glob("winnow-*-pid*-*"):
        match = _SCRATCH_NAME.fullmatch(stale.name)
        if match and stale.is_dir() and int(match[1]) != os.getpid() and not _alive(int(match[1])):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{kind}-pid{os.getpid()}-", dir=base))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def drop_root(output: str | Path) -> None:
    """Remove this process's scratch mirror of a URL output (the store keeps everything)."""
    root = _ROOTS.pop(str(output), None) if is_url(output) else None
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def task_scratch(output: str | Path) -> Iterator[None]:
    """Run one task in a fresh, private local folder for a URL output; removed afterwards (no-op locally).

    A task then reads only what it fetched from the store and writes only what it publishes
    there, so it needs nothing from the driver's or another task's folders: any node can run it.
    """
    if not is_url(output):
        yield
        return
    url = str(output)
    saved = _ROOTS.get(url)
    root = _scratch("winnow-task")
    _ROOTS[url] = root
    try:
        yield
    finally:
        if saved is None:
            _ROOTS.pop(url, None)
        else:
            _ROOTS[url] = saved
        shutil.rmtree(root, ignore_errors=True)


_FS: dict[tuple[str, str], Any] = {}


def _filesystem(url: str, storage_options: dict[str, Any]) -> Any:
    import fsspec

    key = (url.split("://", 1)[0], json.dumps(storage_options, sort_keys=True, default=str))
    fs = _FS.get(key)
    if fs is None:
        fs, _ = fsspec.core.url_to_fs(url, **storage_options)
        _FS[key] = fs
    return fs


@dataclass(frozen=True, slots=True)
class WorkDir:
    """Paths in one job's output and work folders, their markers, and their sync with a store (picklable).

    ``output`` is the job's output: a local folder or an fsspec URL. Paths are local, under
    ``out`` (``local_root``): computed in the process that uses them, so a task on another node
    gets its own.
    """

    output: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        """The job's output folder as this process sees it (for a URL: its local mirror)."""
        return local_root(self.output)

    @property
    def root(self) -> Path:
        return self.out / WORK

    @property
    def remote(self) -> bool:
        return is_url(self.output)

    # -- paths ----------------------------------------------------------------------------
    @property
    def fingerprint(self) -> Path:
        return self.root / "fingerprint"

    def phase(self, phase: int) -> Path:
        return self.root / f"phase-{phase}"

    def phase_prefix(self, phase: int) -> Path:
        return self.phase(phase) / PREFIX

    def task(self, phase: int, task: int) -> Path:
        """A finished map task's folder; it exists only once the task is complete."""
        return self.phase(phase) / task_name(task)

    def task_files(self, phase: int, name: str, *, fetch: bool = True) -> list[str]:
        """Every finished task's ``name`` file of a phase, in task order (for ``pl.scan_parquet``).

        On a store: only the files of marked task folders, fetched into the local folder (unless
        ``fetch`` is false: the caller reads them in place, e.g. through ``arrow_files``).
        """
        if not self.remote:
            return sorted(str(p) for p in self.phase(phase).glob(f"task-*/{name}"))
        listed = self._find(self.phase(phase))
        done = {rel.split("/")[0] for rel in listed if rel.endswith(f"/{TASK_MARKER}") and rel.count("/") == 1}
        files = [
            self.phase(phase) / rel
            for rel in listed
            if rel.count("/") == 1
            and rel.split("/")[0] in done
            and rel.split("/")[1] == name
            and rel.startswith("task-")
        ]
        for path in files if fetch else ():
            self.fetch(path)
        return sorted(str(p) for p in files)

    def release(self, phase: int) -> int:
        """Delete phase ``phase``'s spill (``SPILL``) once every task of the next phase has read it; bytes freed.

        Each task folder gets its ``released`` marker first, then loses its spill: a resume after a
        crash in between finds the marker, and ``curate.fingerprint.invalidate`` redoes such a task
        from its input should its inputs change. Its ``stats.json`` stays (the manifest reads it).
        """
        freed = 0
        for name in self.listdir(self.phase(phase)):
            if not name.startswith("task-"):
                continue
            folder = self.phase(phase) / name
            marker = folder / RELEASED
            if not self.exists(marker):
                folder.mkdir(parents=True, exist_ok=True)
                write_text_atomic(marker, "its spill was deleted once the next phase had read it\n")
                self.publish_file(marker)
            for spill in SPILL:
                path = folder / spill
                if not self.remote and path.exists():
                    freed += path.stat().st_size
                self.remove(path)
        return freed

    def released(self, phase: int, task: int) -> bool:
        """Whether a finished task's spill was deleted (``release``)."""
        return self.exists(self.task(phase, task) / RELEASED)

    def task_done(self, phase: int, task: int) -> bool:
        """Whether a map task is complete (its folder renamed into place; on a store: its marker there)."""
        folder = self.task(phase, task)
        return self.exists(folder / TASK_MARKER) if self.remote else folder.exists()

    def plan(self, stage_id: str) -> Path:
        return self.root / "plans" / path_name(stage_id)

    def plan_prefix(self, stage_id: str) -> Path:
        return self.plan(stage_id) / PREFIX

    def decision(self, stage_id: str, task: int) -> Path:
        return self.plan(stage_id) / "decision" / f"{task_name(task)}.parquet"

    def plan_done(self, stage_id: str) -> bool:
        return self.exists(self.plan(stage_id) / _DONE)

    def mark_plan_done(self, stage_id: str) -> None:
        """Mark a plan complete; on a store, its folder is uploaded first and the marker last."""
        (self.plan(stage_id) / _DONE).touch()
        if self.remote:
            self.publish_folder(self.plan(stage_id), marker=_DONE)

    def write_marker(self, task: int) -> Path:
        """An ordered-write task's result file, written atomically as its completion marker."""
        return self.root / "write" / f"{task_name(task)}.json"

    def val_write_marker(self, first_task: int) -> Path:
        """A validation write group's result file (named by its first task), its completion marker."""
        return self.root / "write-val" / f"{task_name(first_task)}.json"

    # -- sync with a store (no-ops for a local folder) -------------------------------------------
    def url(self, path: Path) -> str:
        """The store URL of a local path under ``out``."""
        rel = Path(path).relative_to(self.out).as_posix()
        return self.output.rstrip("/") if rel == "." else f"{self.output.rstrip('/')}/{rel}"

    @property
    def fs(self) -> Any:
        return _filesystem(self.output, self.storage_options)

    def exists(self, path: Path) -> bool:
        """Whether ``path`` exists (on a store: as an object or a prefix there, whatever this process holds)."""
        if not self.remote:
            return Path(path).exists()
        self.fs.invalidate_cache()  # another node may have written it since this process last listed
        return self._call(self.fs.exists, self.url(path))

    def fetch(self, path: Path, *, missing_ok: bool = False) -> bool:
        """Bring a file (or a whole folder) from the store to ``path``; returns whether it exists.

        Locally: whether it exists. A file already fetched is not fetched again.
        """
        path = Path(path)
        if not self.remote:
            return path.exists()
        if path.is_file():
            return True
        url = self.url(path)
        fs = self.fs
        try:
            if self._call(fs.isdir, url):
                for rel in self._find(path):
                    self._get(f"{url}/{rel}", path / rel)
                return True
            self._get(url, path)
            return True
        except FileNotFoundError:
            if missing_ok:
                return False
            raise

    def read_text(self, path: Path) -> str:
        self.fetch(path)
        return Path(path).read_text()

    def publish_file(self, path: Path) -> None:
        """Upload a finished local file under its final key: via a temporary key, copied into place."""
        if not self.remote:
            return
        path = Path(path)
        url = self.url(path)
        tmp = f"{url.rsplit('/', 1)[0]}/.{path.name}.{secrets.token_hex(6)}.tmp"
        fs = self.fs
        self._put(str(path), tmp)
        try:
            crash_point(f"store:{path.name}", "before")
            self._call(fs.copy, tmp, url)
        finally:
            self._call(fs.rm, tmp)
        crash_point(f"store:{path.name}", "after")

    def publish_folder(self, folder: Path, *, marker: str) -> None:
        """Upload a finished local folder: every file under its key, then ``marker`` last (it makes the folder count)."""
        if not self.remote:
            return
        folder = Path(folder)
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            if path.relative_to(folder).as_posix() != marker:
                self._put(str(path), self.url(path))
        self.publish_file(folder / marker)

    def publish_outputs(self, folders: tuple[str, ...] = ("shards", "rejects", "artifacts")) -> None:
        """Upload every finished file this process wrote under ``out/<folder>`` (a task's private scratch holds only its own)."""
        if not self.remote:
            return
        for name in folders:
            base = self.out / name
            for path in sorted(base.rglob("*")) if base.is_dir() else []:
                if path.is_file() and not path.name.startswith("."):
                    self.publish_file(path)

    def fetch_plan(self, stage_id: str, *, task: int | None = None) -> None:
        """Bring a finished plan's files here: its artifacts, and of its decision only ``task``'s part."""
        if not self.remote:
            return
        plan = self.plan(stage_id)
        for rel in self._find(plan):
            if not rel.startswith("decision/"):
                self._get(f"{self.url(plan)}/{rel}", plan / rel)
        if task is not None:
            self.fetch(self.decision(stage_id, task), missing_ok=True)

    def arrow_files(self, paths: list[Path]) -> tuple[Any, list[str]]:
        """A pyarrow filesystem and the paths to open ``paths`` through it in place (reads ranges, not whole files)."""
        if not self.remote:
            return None, [str(p) for p in paths]
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        fs = self.fs
        return PyFileSystem(FSSpecHandler(fs)), [fs._strip_protocol(self.url(p)) for p in paths]

    def remove(self, path: Path) -> None:
        """Delete a file or folder here and, on a store, under its key (a missing one is fine)."""
        path = Path(path)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        if self.remote:
            url = self.url(path)
            fs = self.fs
            with contextlib.suppress(FileNotFoundError):
                if self._call(fs.exists, url):
                    self._call(fs.rm, url, recursive=True)

    def sweep_tmp(self, finals: tuple[str, ...] = ()) -> int:
        """Delete the temporary keys killed uploads left under the output prefix (after a job ends); returns how many.

        Locally, the temporary files killed atomic writes (``curate.atomic``) of the output folder's own ``finals``
        (``manifest.json``...) left there: its own folders are cleared or resumed by the runner."""
        if not self.remote:
            stale = [p for p in self.out.iterdir() if atomic_leftover(p.name, finals) and p.is_file()]
            for path in stale:
                path.unlink(missing_ok=True)
            return len(stale)
        stale = [
            f"{self.output}/{rel}"
            for rel in self._find(self.out)
            if rel.rsplit("/", 1)[-1].startswith(".") and rel.endswith(".tmp")
        ]
        for url in stale:
            with contextlib.suppress(FileNotFoundError):
                self._call(self.fs.rm, url)
        return len(stale)

    def files(self, folder: Path) -> list[Path]:
        """Every file under ``folder`` (on a store: every object under its prefix), as local paths."""
        folder = Path(folder)
        if not self.remote:
            return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
        return [folder / rel for rel in self._find(folder)]

    def listdir(self, folder: Path) -> list[str]:
        """Names of the entries of ``folder`` (on a store: of its prefix); [] when it does not exist."""
        if not self.remote:
            return sorted(p.name for p in Path(folder).iterdir()) if Path(folder).is_dir() else []
        url = self.url(folder)
        self.fs.invalidate_cache()
        try:
            entries = self._call(self.fs.ls, url, detail=False)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries} - {""})

    def _find(self, folder: Path) -> list[str]:
        """Every file under a folder's prefix on the store, relative to it (posix)."""
        url = self.url(folder)
        base = self.fs._strip_protocol(url).rstrip("/")
        self.fs.invalidate_cache()
        try:
            found = self._call(self.fs.find, url)
        except FileNotFoundError:
            return []
        return sorted(f[len(base) + 1 :] for f in found if f.startswith(base + "/"))

    def _put(self, local: str, url: str) -> None:
        try:
            self._call(self.fs.put_file, local, url)
        except FileNotFoundError as err:  # the bucket (or container) is not there
            raise OutputError(
                f"job.output = {self.output!r}: cannot write {url} ({err}); create the bucket first, "
                f"or give one that exists"
            ) from err

    def _get(self, url: str, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            self._call(self.fs.get_file, url, str(tmp))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FileNotFoundError:
            raise
        except PermissionError as err:
            raise OutputError(
                f"job.output = {self.output!r}: the store refused access ({err}); check the "
                f"credentials or [job] storage_options"
            ) from err
        except (OSError, ValueError, RuntimeError) as err:
            raise OutputError(
                f"job.output = {self.output!r}: {err}; check the URL, the network and the "
                f"credentials ([job] storage_options)"
            ) from err
        except Exception as err:  # a driver's own errors (botocore's NoCredentialsError, ...) are not OSErrors
            if type(err).__module__.startswith(("winnow.", "builtins")):  # winnow's own errors pass through
                raise
            raise OutputError(
                f"job.output = {self.output!r}: {type(err).__name__}: {err}; check the credentials "
                f"and the endpoint ([job] storage_options, or the driver's environment variables)"
            ) from err


def fresh_tmp(final: Path) -> Path:
    """An empty temporary folder beside ``final`` (``.<name>.tmp``), left-overs of a crash removed."""
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp
