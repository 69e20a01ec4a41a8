"""Owning the output folder: winnow cleans only a folder it made, and says so when it cannot write one.

A job's output folder gets a marker file, ``.winnow-output``, before anything else is
written into it. A re-run that starts afresh (another job, a finished one) clears winnow's
own entries (``OWN_ENTRIES``) only in a folder carrying the marker; a folder without it
that holds entries under those names — the user's own ``shards/my.parquet`` — is refused
with a message, never emptied. Other files (a README of the user's) are never touched, so
such a folder is adopted. Folders an older winnow wrote (a ``manifest.json`` with winnow's
keys, or a ``_work/fingerprint``) are recognised and adopted.

The output may be an fsspec URL (``s3://bucket/job``): the same rules hold for the objects
under its prefix (the marker is an object ``<prefix>/.winnow-output``, the entries are the
prefix's children), checked and cleared through ``curate.workdir.WorkDir``. ``[output] mode``
restricts every file the job wrote (folders get the matching search bits) once it ends;
otherwise files follow the umask like any other program's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from winnow.curate.atomic import write_json_atomic
from winnow.curate.errors import OutputError, WinnowError
from winnow.curate.lock import LOCK
from winnow.curate.wholefile import MANIFEST_BYTES, read_whole
from winnow.curate.workdir import WorkDir

MARKER = ".winnow-output"
RUN_MARKER = ".winnow-run"  # a run folder's marker (train.runfolder.MARKER): never curated into
#: Entries a winnow job writes in its output folder; a fresh run removes these and nothing else.
OWN_ENTRIES = ("_work", "shards", "rejects", "artifacts", "manifest.json")


def make_folder(out: Path) -> None:
    """Create the output folder (and its parents); ``OutputError`` when it is a file or cannot be written."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} is a file, not a folder; give a folder path (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(
            f"cannot write the output folder {out}: {err.strerror or err}; choose a folder you can write "
            f"(--output or [job] output) or fix its permissions"
        ) from err


def claim(out: Path, job_name: str, *, work: WorkDir | None = None) -> bool:
    """Make ``out`` winnow's: create it with its marker, or check the marker is there.

    Returns whether the folder already held a previous run's outputs. Raises ``OutputError``
    when ``out`` is a file, cannot be written, or holds data winnow did not write. With a
    ``work`` whose output is a URL, the same checks run on the store's objects.
    """
    if work is not None and work.remote:
        return _claim_remote(work, job_name)
    refuse_inside_a_job(out)
    make_folder(out)
    marker = out / MARKER
    if marker.is_symlink() or (marker.exists() and not marker.is_file()):
        raise OutputError(
            f"output folder {out}: {MARKER} there is a {'link' if marker.is_symlink() else 'folder'} winnow did not "
            "make (winnow marks the folders it writes with a file of that name); move it away, or give this job "
            "another folder with --output"
        )
    existing = sorted(p.name for p in out.iterdir() if p.name != LOCK)
    if existing and all(name.startswith(f".{MARKER}.") and name.endswith(".tmp") for name in existing):
        for name in existing:  # a run killed while writing the marker itself: the folder is still new
            (out / name).unlink()
        existing = []
    if RUN_MARKER in existing:
        raise OutputError(
            f"output folder {out} is a training run's or a study's folder (it holds {RUN_MARKER}: `winnow train` or "
            "`winnow ablate` wrote it); curate into a folder of its own (--output or [job] output)"
        )
    if existing and not marker.exists() and not _written_by_old_winnow(out):
        # Entries under names winnow writes (shards/, rejects/, ...) would be cleared or mixed with
        # this job's: refuse. Anything else (the user's README, notes) is never touched, so it may stay.
        clash = [name for name in existing if name in OWN_ENTRIES]
        if clash:
            raise OutputError(
                f"output folder {out} holds files winnow did not write ({', '.join(clash)}); winnow clears only "
                f"folders it made (they carry {MARKER}). Choose a new or empty folder with --output, or move them away"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            write_json_atomic(marker, {"written_by": "winnow", "job": job_name})
    except OSError as err:
        raise OutputError(
            f"cannot write the output folder {out}: {err.strerror or err}; choose a folder you can write "
            f"(--output or [job] output) or fix its permissions"
        ) from err
    return bool(existing)


def refuse_inside_a_job(out: Path) -> None:
    """``OutputError`` when ``out`` lies inside what another job's folder clears when that job runs again (its
    ``_work/``, ``shards/``, ``rejects/`` or ``artifacts/``): that run would delete this job's outputs."""
    resolved = out.resolve()
    for parent in resolved.parents:
        if (parent / MARKER).is_file():
            entry = resolved.relative_to(parent).parts[0]
            if entry in OWN_ENTRIES:
                raise OutputError(
                    f"output folder {out} lies inside {parent / entry}, which the job of {parent} clears when it "
                    "runs again; give this job a folder of its own (--output or [job] output), outside it"
                )


def _claim_remote(work: WorkDir, job_name: str) -> bool:
    out = work.out
    if work.fs.isfile(work.url(out)):
        raise OutputError(f"output {work.output} is an object, not a prefix; give a folder-like URL (s3://bucket/job)")
    existing = [
        name
        for name in work.listdir(out)
        if name != LOCK and not (name.startswith(f".{MARKER}.") and name.endswith(".tmp"))
    ]
    has_marker = MARKER in existing
    if existing and not has_marker:
        old = work.exists(work.root / "fingerprint") or (
            work.fetch(out / "manifest.json", missing_ok=True) and _written_by_old_winnow(out)
        )
        clash = [name for name in existing if name in OWN_ENTRIES]
        if clash and not old:
            raise OutputError(
                f"output {work.output} holds objects winnow did not write ({', '.join(clash)}); winnow clears only "
                f"prefixes it made (they carry {MARKER}). Choose a new or empty prefix with --output, or move them away"
            )
    if not has_marker:
        write_json_atomic(out / MARKER, {"written_by": "winnow", "job": job_name})
        work.publish_file(out / MARKER)
    return bool(set(existing) - {MARKER})


def owner(out: Path, *, work: WorkDir | None = None) -> dict:
    """What the folder's marker says of the job whose outputs it holds (``job``, ``fingerprint``); {} if nothing."""
    if work is not None and work.remote:
        work.fetch(out / MARKER, missing_ok=True)
    if not (out / MARKER).is_file():
        return {}
    try:
        found = json.loads(read_whole(str(out / MARKER), limit=1 << 20, what="output marker"))
    except (WinnowError, ValueError) as err:
        return {"damaged": str(err)}
    if not isinstance(found, dict) or not isinstance(found.get("job"), str):
        return {"damaged": "not the object winnow writes (its job and configuration)"}
    return found


def check_owner(
    out: Path, job_name: str, fingerprint: str, *, finished: bool, where: str, work: WorkDir | None = None
) -> None:
    """Refuse to start afresh over another job's outputs, or over a finished run of this job made with another config.

    ``where`` is the output as the user gave it. Re-running the same job (same fingerprint), or a
    run that never finished, goes on as before; ``--overwrite`` skips this check.
    """
    found = owner(out, work=work)
    if "damaged" in found:  # whose outputs these are cannot be told: clearing them could lose another job's
        raise OutputError(
            f"output {where} holds a damaged marker {MARKER} ({found['damaged']}): which job's outputs the folder "
            "holds cannot be told, and starting here would clear them. Give this job a folder of its own (--output "
            "or [job] output), or re-run with --overwrite to replace them"
        )
    before = found.get("job")
    if before is not None and before != job_name:
        raise OutputError(
            f"output {where} holds the {'finished ' if finished else ''}outputs of job {before!r}, and this is job "
            f"{job_name!r}: starting here would clear them. Give job {job_name!r} a folder of its own (--output or "
            f"[job] output), or re-run with --overwrite to replace job {before!r}'s outputs"
        )
    if finished and found.get("fingerprint") not in (None, fingerprint):
        raise OutputError(
            f"output {where} holds the finished outputs of job {job_name!r} made with another configuration (the job "
            f"file, or the format of one of its stages' work, changed since; fingerprint {found['fingerprint']} -> "
            f"{fingerprint}): starting here would replace "
            f"them. Give the changed job a new folder (--output or [job] output), or re-run with --overwrite to "
            f"replace them"
        )


def mark_owner(out: Path, job_name: str, fingerprint: str, *, work: WorkDir | None = None) -> None:
    """Record in the marker which job (and configuration) the folder's outputs now belong to."""
    write_json_atomic(out / MARKER, {"written_by": "winnow", "job": job_name, "fingerprint": fingerprint})
    if work is not None and work.remote:
        work.publish_file(out / MARKER)


#: The names winnow gives the files of ``shards/<format>/<split>/`` and ``rejects/`` (and their temporary files),
#: the copy of a Hugging Face tokenizer beside the token shards (``writers.tokens.TOKENIZER_FILE``), and what a
#: stage keeps under ``artifacts/<stage id>/`` (``stages.base.StageContext.artifacts_dir``: ``01.dedup.minhash``).
_OWN_NAMES = {
    "shards": re.compile(
        r"[^/]+/[^/]+/\.?part-[0-9]+(-[0-9]+)*\.(parquet|tar|bin|idx|doc\.npy)(\.[0-9a-f]+)?(\.tmp)?"
        r"|tokens/(tokenizer\.json|\.tokenizer\.json\.[0-9a-f]+\.tmp)"
    ),
    "rejects": re.compile(r"\.?p[0-9]+-t[0-9]+\.parquet(\.[0-9a-f]+)?(\.tmp)?"),
    "artifacts": re.compile(r"[0-9]{2,}\.[^/]+/.+"),
}


def check_no_foreign_files(out: Path, work: WorkDir) -> None:
    """Refuse to clear winnow's own entries (``OWN_ENTRIES``) while they hold what winnow did not write: a fresh
    run, or a resume whose inputs changed, removes them, and winnow never deletes or replaces what it did not write.

    Not winnow's: a symbolic link (an entry itself, or anything inside one), a file where winnow writes a folder,
    a ``manifest.json`` of another program, a file of ``shards/``, ``rejects/`` or ``artifacts/`` winnow would
    not have named so (a user's notes, a hand-made shard), and an entry at the top of ``_work/`` it does not make
    (another job's folder).
    """
    strays = [] if work.remote else _strays(out)  # an object store holds no links, and prefixes are not files
    if strays:
        is_, it = ("is", "it") if len(strays) == 1 else ("are", "them")
        raise OutputError(
            f"output {work.output}: {', '.join(strays[:5])}{', ...' if len(strays) > 5 else ''} {is_} not winnow's, "
            f"and this run would replace {it}; winnow never deletes or replaces what it did not write. Move {it} out "
            "of the output folder (for a link, remove the link: what it points to stays) and run again, or give "
            "this job another folder with --output"
        )
    listed = _listed(out, work)
    foreign = [
        path
        for folder, own in _OWN_NAMES.items()
        for path in work.files(out / folder)
        if not own.fullmatch(rel := path.relative_to(out / folder).as_posix())
        or (listed is not None and folder != "artifacts" and not _is_listed(f"{folder}/{rel}", listed))
    ]
    foreign += [out / name for name in _foreign_work_entries(work)]
    if foreign:
        names = ", ".join(str(p.relative_to(out)) for p in foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise OutputError(
            f"output {work.output}: {len(foreign)} file(s) in its _work/, shards/, rejects/ or artifacts/ were not "
            f"written by winnow ({names}), and this run must clear those folders; move them out of the output folder "
            "and run again"
        )


#: What winnow makes at the top of ``_work/`` (``curate.workdir``), and the temporary names it writes under.
_WORK_ENTRIES = re.compile(r"fingerprint|inputs\.json|ids-exact|phase-[0-9]+|plans|write|write-val|\..+\.tmp")


def _foreign_work_entries(work: WorkDir) -> list[str]:
    """The entries at the top of ``_work/`` winnow would not have made (a user's notes, another job's folder)."""
    return [f"_work/{name}" for name in work.listdir(work.root) if not _WORK_ENTRIES.fullmatch(name)]


#: The endings of a shard's files: a file's stem is the path the manifest lists less its ending.
_SHARD_FILE = re.compile(r"\.(parquet|tar|bin|idx|doc\.npy)$")


def _listed(out: Path, work: WorkDir) -> set[str] | None:
    """The shards' stems and the rejects' paths the finished run's ``manifest.json`` lists (relative to ``out``);
    None when there is no such manifest (a run under way or killed writes its files before the manifest, and only
    their names can tell them). After a finished run, a file of ``shards/`` or ``rejects/`` the manifest does not
    list was put there by someone else, whatever its name."""
    path = out / "manifest.json"
    try:
        if not work.exists(path):
            return None
        manifest = json.loads(work.read_text(path))
    except (OSError, ValueError, WinnowError):
        return None
    if not _manifest_keys(manifest):
        return None
    entries = [*(manifest.get("shards") or []), *(manifest.get("rejects") or [])]
    return {_SHARD_FILE.sub("", e["path"]) for e in entries if isinstance(e, dict) and isinstance(e.get("path"), str)}


def _is_listed(rel: str, listed: set[str]) -> bool:
    """Whether ``rel`` (``shards/...`` or ``rejects/...``) is one of ``listed``'s files, the tokenizer beside them, or
    a temporary file of winnow's (named as one: a write killed before its rename leaves it)."""
    name = rel.rsplit("/", 1)[-1]
    return (
        _SHARD_FILE.sub("", rel) in listed or name == "tokenizer.json" or name.startswith(".") or name.endswith(".tmp")
    )


def _strays(out: Path) -> list[str]:
    """The paths of ``out``'s own entries winnow would not have made: links, a file for a folder, another manifest."""
    found = []
    for name in OWN_ENTRIES:
        path = out / name
        if path.is_symlink():
            found.append(f"{name} (a symbolic link)")
        elif name == "manifest.json":
            if path.exists() and not _is_manifest(path):
                found.append(f"{name} (not a manifest winnow wrote)")
        elif path.exists() and not path.is_dir():
            found.append(f"{name} (a file where winnow writes a folder)")
        else:
            for root, dirs, files in os.walk(path):  # never into a linked folder: it is listed, not entered
                for entry in (*dirs, *files):
                    if os.path.islink(os.path.join(root, entry)):
                        found.append(f"{Path(root, entry).relative_to(out)} (a symbolic link)")
    return found


def clear_own_entries(out: Path, *, only: tuple[str, ...] = OWN_ENTRIES, work: WorkDir | None = None) -> None:
    """Remove a previous run's outputs (``only`` some of them) from a folder winnow owns (``claim`` checked the marker).

    With a ``work`` whose output is a URL, they are removed from the store too. A run clearing a previous one's
    outputs calls ``check_no_foreign_files`` first, before the card goes too.
    """
    import shutil

    # The manifest first: it marks the outputs finished, so a run killed while it clears leaves no manifest
    # listing shards that are gone (winnow report would show them; a later run would take them as done).
    order = sorted(only, key=lambda name: name != "manifest.json")
    if work is not None and work.remote:
        for name in order:
            work.remove(out / name)
        return
    for name in order:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _written_by_old_winnow(out: Path) -> bool:
    return (out / "_work" / "fingerprint").is_file() or _is_manifest(out / "manifest.json")


def _is_manifest(path: Path) -> bool:
    """Whether ``path`` is a job's ``manifest.json`` as winnow writes it (its keys)."""
    try:
        manifest = json.loads(read_whole(str(path), limit=MANIFEST_BYTES, what="manifest"))
    except (WinnowError, ValueError):
        return False
    return _manifest_keys(manifest)


def _manifest_keys(manifest: object) -> bool:
    """Whether ``manifest`` (parsed JSON) has the keys of a job's ``manifest.json`` as winnow writes it."""
    return isinstance(manifest, dict) and {"format_version", "shards", "stages"} <= set(manifest)


def restrict_mode(out: Path, mode: int) -> None:
    """Give every file under ``out`` the permission bits ``mode``, and folders those bits plus search."""
    folder_mode = mode | ((mode & 0o444) >> 2)  # r on a folder needs x to be of any use
    for root, dirs, files in os.walk(out):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, mode)
        for name in dirs:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                os.chmod(path, folder_mode)
    os.chmod(out, folder_mode)
