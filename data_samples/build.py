"""Rebuild winnow's sample data deterministically from text a Debian 12 + CPython 3.11 machine already has.

    python data_samples/build.py            # rewrites data_samples/{docs,code,legal,changelog}/ and planted.json
    python data_samples/build.py --out DIR  # writes the same files under DIR instead

Same machine, same output, byte for byte: fixed seeds, sorted inputs, gzip/zstd/Parquet written
without timestamps. The content follows what the machine has installed (stdlib version, Debian
packages); ``planted.json`` records both, and what dirt was planted where.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import logging
import platform
import random
import shutil
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

if __name__ == "__main__":
    sys.dont_write_bytecode = True  # keep data_samples/ free of __pycache__ (tests importing this module keep theirs)
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sample_dirt import DirtPlan, Planter, cross_copy  # noqa: E402
from sample_sources import (  # noqa: E402
    Doc, MissingSourceError, changelog_documents, code_documents, docs_documents, legal_documents, make_id,
    stdlib_dir, stdlib_modules,
)

log = logging.getLogger("data_samples.build")

SEED = "winnow-samples-v1"
LICENSES_DIR = Path("/usr/share/common-licenses")
DOC_DIR = Path("/usr/share/doc")
MIN_CLEAN_DOCS = 200
#: Clean documents kept per source (a seeded sample when the machine offers more).
TARGETS = {"docs": 1500, "code": 1800, "legal": 1000, "changelog": 1800}
#: (from, to, count): the same document reaching two sources, as happens when crawls overlap.
CROSS = (("code", "docs", 8), ("legal", "docs", 6), ("docs", "code", 6), ("changelog", "legal", 4))
LEGAL_SUFFIXES = ("doc", "common", "data", "dev", "bin", "utils", "tools", "base", "runtime", "extra")

PLANS = {
    "docs": DirtPlan(boilerplate=(
        "Skip to main content",
        "Home | Tutorial | Library Reference | Language Reference | Downloads | Community | Search",
        "This site uses cookies to improve your experience. By continuing to browse you agree to our use of cookies. "
        "[Accept] [Manage settings]",
        "© Copyright 2001-2023, Python Software Foundation. All rights reserved.",
    ), short_pool=("Contents", "Navigation", "Next topic", "Previous topic", "Table of Contents", "Quick search",
                   "See also", "Index"), units="sentences", boilerplate_share=0.3),
    "code": DirtPlan(boilerplate=(
        "# Copyright (c) 2001-2023 Python Software Foundation. All rights reserved.",
        "# -*- coding: utf-8 -*-",
        "# This file is generated automatically. Do not edit by hand.",
    ), short_pool=("pass", "import os", "x = 1", "# TODO", "def main(): pass", "return None", "...",
                   "if __name__ == '__main__': main()"), units="lines", boilerplate_share=0.2),
    "legal": DirtPlan(boilerplate=(
        "Debian -- Package details | Search packages | Mirrors | Contact",
        "The information on this page is provided as is. All rights reserved by their respective owners.",
        "Printer-friendly version | Back to top",
    ), short_pool=("See LICENSE.", "All rights reserved.", "Public domain.", "License: MIT", "Copyright (C) the authors.",
                   "GPL-2+", "BSD-3-clause", "License: see COPYING"), units="sentences"),
    "changelog": DirtPlan(boilerplate=(
        "Subscribe to this changelog via RSS | View all package news",
        "Posted by the package tracker bot. Reply to this entry on the mailing list.",
        "Privacy policy | Terms of service | Cookie settings",
    ), short_pool=("  * Initial release.", "  * No-change rebuild.", "  * Bump Standards-Version.", "UNRELEASED",
                   "  * New upstream release.", "  * Fix typo.", "  * Rebuild against new libc.", "  * Update watch file."),
        units="lines", boilerplate_share=0.15),
}


@dataclass(frozen=True, slots=True)
class Layout:
    """How a source is written, so that every reader format gets exercised."""

    format: str
    files: tuple[str, ...]


LAYOUTS = {
    "docs": Layout("jsonl.gz", ("docs/part-00000.jsonl.gz", "docs/part-00001.jsonl.gz")),
    "code": Layout("parquet", ("code/part-00000.parquet", "code/part-00001.parquet")),
    "legal": Layout("text", ("legal/*.txt",)),
    "changelog": Layout("jsonl + jsonl.zst", ("changelog/part-00000.jsonl", "changelog/part-00001.jsonl.zst")),
}


def hashed_id(source: str):
    def new_id(orig: Doc | None, salt: str, taken: set[str]) -> str:
        return make_id(source, f"{orig.id if orig else ''}#{salt}")
    return new_id


def legal_id(orig: Doc | None, salt: str, taken: set[str]) -> str:
    """Name a planted legal file like a sibling package's copy (libfoo-doc), as Debian's archive does."""
    digest = hashlib.sha1(salt.encode()).hexdigest()
    stem = orig.id.removesuffix(".txt") if orig and orig.id.endswith(".txt") else f"notice-{digest[:8]}"
    start = int(digest, 16) % len(LEGAL_SUFFIXES)
    for k in range(len(LEGAL_SUFFIXES)):
        name = f"{stem}-{LEGAL_SUFFIXES[(start + k) % len(LEGAL_SUFFIXES)]}.txt"
        if name not in taken:
            return name
    return f"{stem}-{digest[:6]}.txt"


def extract() -> dict[str, list[Doc]]:
    root = stdlib_dir()
    modules = stdlib_modules(root)
    found = {
        "docs": docs_documents(root, modules),
        "code": code_documents(modules),
        "legal": legal_documents(LICENSES_DIR, DOC_DIR),
        "changelog": changelog_documents(DOC_DIR),
    }
    for source, docs in found.items():
        log.info("%s: %d clean documents found", source, len(docs))
        if len(docs) < MIN_CLEAN_DOCS:
            raise MissingSourceError(f"source {source!r} has only {len(docs)} clean documents on this machine "
                                     f"(at least {MIN_CLEAN_DOCS} needed); see data_samples/README.md for its inputs")
        if len(docs) > TARGETS[source]:
            found[source] = random.Random(f"{SEED}:sample:{source}").sample(docs, TARGETS[source])
    return found


def plant(found: dict[str, list[Doc]]) -> tuple[dict[str, Planter], dict[str, int]]:
    clean = {s: len(d) for s, d in found.items()}
    planters = {
        s: Planter(s, d, PLANS[s], legal_id if s == "legal" else hashed_id(s), SEED,
                   editable=lambda doc: not doc.id.startswith("license-"))
        for s, d in found.items()
    }
    for p in planters.values():
        p.boilerplate()
        p.exact()
        p.near()
        p.short()
        p.junk()
    for src, dst, count in CROSS:
        cross_copy(planters[src], planters[dst], count)
    for s, p in planters.items():
        random.Random(f"{SEED}:order:{s}").shuffle(p.docs)
        assert len({d.id for d in p.docs}) == len(p.docs), f"{s}: duplicate ids"
    return planters, clean


def _jsonl(docs: list[Doc]) -> bytes:
    return b"".join(json.dumps({"id": d.id, "text": d.text, **d.meta}, ensure_ascii=False).encode() + b"\n" for d in docs)


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write(data)
    return buf.getvalue()


def _parquet(docs: list[Doc]) -> bytes:
    keys = list(dict.fromkeys(k for d in docs for k in d.meta))
    table = pa.table({"id": [d.id for d in docs], "text": [d.text for d in docs],
                      **{k: [d.meta.get(k) for d in docs] for k in keys}})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", row_group_size=256)  # several row groups: batched reads get tested
    return buf.getvalue()


def write(planters: dict[str, Planter], out: Path) -> dict[str, list[str]]:
    """Write every source under ``out``; returns the files written per source."""
    files: dict[str, list[str]] = {}
    for source, p in planters.items():
        (out / source).mkdir(parents=True)
        half = (len(p.docs) + 1) // 2
        parts = (p.docs[:half], p.docs[half:])
        if source == "legal":
            blobs = {f"legal/{d.id}": d.text.encode() for d in p.docs}
        elif source == "code":
            blobs = {name: _parquet(part) for name, part in zip(LAYOUTS[source].files, parts)}
        elif source == "docs":
            blobs = {name: _gzip(_jsonl(part)) for name, part in zip(LAYOUTS[source].files, parts)}
        else:
            plain, zst = LAYOUTS[source].files
            blobs = {plain: _jsonl(parts[0]), zst: zstandard.ZstdCompressor(level=19).compress(_jsonl(parts[1]))}
        for name, blob in blobs.items():
            (out / name).write_bytes(blob)
        files[source] = sorted(blobs)
    return files


def summary(planters: dict[str, Planter], clean: dict[str, int], files: dict[str, list[str]]) -> dict:
    """What ``planted.json`` holds: per-source counts of every kind of dirt, each planted item, and the inputs."""
    sources = {}
    for s, p in planters.items():
        recs = p.records
        by_kind = Counter(r["kind"] for r in recs)
        lines = Counter(line for d in p.docs for line in (*d.head, *d.foot))
        sources[s] = {
            "format": LAYOUTS[s].format,
            "files": len(files[s]) if s == "legal" else files[s],
            "documents": len(p.docs),
            "clean_documents": clean[s],
            "exact_duplicate": by_kind["exact_duplicate"],
            "cross_source_duplicate": dict(sorted(Counter(r["detail"] for r in recs if r["kind"] == "cross_source_duplicate").items())),
            "near_duplicate": dict(sorted(Counter(r["detail"] for r in recs if r["kind"] == "near_duplicate").items())),
            "boilerplate_documents": sum(1 for d in p.docs if d.head or d.foot),
            "boilerplate_lines": {line: lines[line] for line in PLANS[s].boilerplate},
            "short": by_kind["short"],
            "junk": dict(sorted(Counter(r["detail"] for r in recs if r["kind"] == "junk").items())),
        }
    debian = Path("/etc/debian_version")
    return {
        "seed": SEED,
        "built_from": {
            "python": platform.python_version(),
            "debian": debian.read_text().strip() if debian.is_file() else None,
            "stdlib": "pydoc_data/topics.py and *.py of the running interpreter's standard library",
            "licenses": str(LICENSES_DIR),
            "debian_docs": f"{DOC_DIR}/*/copyright, {DOC_DIR}/*/changelog.Debian.gz, {DOC_DIR}/*/changelog.gz",
        },
        "sources": sources,
        "records": [r for p in planters.values() for r in sorted(p.records, key=lambda r: r["id"])],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="folder to write (default: data_samples/)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        found = extract()
    except MissingSourceError as err:
        print(f"data_samples/build.py: cannot build the sample data: {err}", file=sys.stderr)
        return 2
    planters, clean = plant(found)
    out: Path = args.out
    tmp = out / ".build-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    files = write(planters, tmp)
    (tmp / "planted.json").write_text(json.dumps(summary(planters, clean, files), ensure_ascii=False, indent=1) + "\n")
    # Swap in the finished tree only now, so a crash leaves the previous sample data intact.
    for name in (*planters, "planted.json"):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        (tmp / name).replace(target)
    tmp.rmdir()
    for s, p in planters.items():
        log.info("%-9s %5d documents (%d clean, %d planted)", s, len(p.docs), clean[s], len(p.records))
    log.info("wrote %s", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
