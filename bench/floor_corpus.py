"""Long real documents from this machine, as the demo's four sources, for ``bench/floor.py``.

* ``docs``: man pages (their roff source, decompressed; English and translated) and, per
  standard-library module, its docstrings joined;
* ``code``: standard-library Python sources;
* ``legal``: ``/usr/share/common-licenses`` and the packages' ``/usr/share/doc/*/copyright``;
* ``changelog``: the packages' ``/usr/share/doc/*/changelog.Debian.gz``.

Files are taken in an order fixed by a hash of their path until each source has its share of
``target_mb``; then ``copies`` of each source's documents get a near-copy (edits, a block
inserted from another document, a block deleted, version bumps: ``bench/dedup.py``'s
``_mutate``), so MinHash has duplicates to find on either side of its threshold. Documents
are much longer than ``data_samples/``'s (``describe`` prints both).
"""

from __future__ import annotations

import inspect
import os
import sys
import sysconfig
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import polars as pl
import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dedup import _jsonl_line, _mutate, _read_text_file  # noqa: E402

SHARES = {"docs": 0.4, "code": 0.3, "legal": 0.1, "changelog": 0.2}  # the demo's mix weights
FILES_PER_SOURCE = 4


def _files(roots: list[Path], keep) -> list[Path]:
    """Regular files under ``roots`` that ``keep(path)`` accepts (hard links once), in hash order."""
    seen, out = set(), []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = Path(dirpath) / name
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if path.is_symlink() or st.st_size < 200 or (st.st_dev, st.st_ino) in seen or not keep(path):
                    continue
                seen.add((st.st_dev, st.st_ino))
                out.append(path)
    return sorted(out, key=lambda p: xxhash.xxh64_intdigest(str(p).encode()))


def _docstrings() -> Iterator[tuple[str, str]]:
    """One document per standard-library module: its docstring and those of its classes and functions."""
    import importlib

    warnings.simplefilter("ignore")
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in skip:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # modules that cannot import on this platform
            continue
        parts = [inspect.getdoc(mod) or ""]
        for obj in vars(mod).values():
            if inspect.isclass(obj) or inspect.isfunction(obj):
                parts.append(inspect.getdoc(obj) or "")
                if inspect.isclass(obj):
                    parts += [inspect.getdoc(m) or "" for m in vars(obj).values() if inspect.isfunction(m)]
        text = "\n\n".join(p for p in parts if p)
        if len(text) >= 200:
            yield f"pydoc:{name}", text


def _candidates(source: str) -> Iterator[tuple[str, str]]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    if source == "docs":
        yield from _docstrings()
        for path in _files([Path("/usr/share/man")], lambda p: p.suffix == ".gz"):
            if (text := _read_text_file(path)) is not None:
                yield f"man:{path}", text
    elif source == "code":
        for path in _files(
            [stdlib], lambda p: p.suffix == ".py" and "site-packages" not in p.parts and "test" not in p.parts
        ):
            if (text := _read_text_file(path)) is not None:
                yield f"py:{path.relative_to(stdlib)}", text
    elif source == "legal":
        for path in _files([Path("/usr/share/common-licenses"), Path("/usr/share/doc")],
                           lambda p: "common-licenses" in p.parts or p.name == "copyright"):  # fmt: skip
            if (text := _read_text_file(path)) is not None:
                yield f"legal:{path}", text
    else:
        for path in _files([Path("/usr/share/doc")], lambda p: p.name.startswith("changelog")):
            if (text := _read_text_file(path)) is not None:
                yield f"changelog:{path}", text


def build(folder: Path, *, target_mb: float = 85.0, copies: float = 0.15, seed: int = 0) -> dict[str, int]:
    """Write ``folder/<source>/part-NNNNN.jsonl``; returns the documents per source."""
    rng = np.random.default_rng(seed)
    counts = {}
    for source, share in SHARES.items():
        ids, texts, total = [], [], 0
        for doc_id, text in _candidates(source):
            size = len(text.encode())
            if size > 1_000_000:
                continue
            ids.append(doc_id)
            texts.append(text)
            total += size
            if total >= share * target_mb * 1e6 / (1 + copies):
                break
        originals = len(texts)
        for k in range(int(originals * copies)):
            src = int(rng.integers(0, len(texts)))
            texts.append(_mutate(texts[src], texts[int(rng.integers(0, originals))], rng))
            ids.append(f"copy:{source}:{k:05d}")
        order = rng.permutation(len(texts))
        out = folder / source
        out.mkdir(parents=True, exist_ok=True)
        per = -(-len(texts) // FILES_PER_SOURCE)
        for f in range(FILES_PER_SOURCE):
            rows = order[f * per : (f + 1) * per]
            lines = (_jsonl_line({"id": ids[i], "text": texts[i]}) for i in rows)
            (out / f"part-{f:05d}.jsonl").write_bytes(b"\n".join(lines) + b"\n")
        counts[source] = len(texts)
    return counts


def ensure(folder: Path, target_mb: float) -> Path:
    """The corpus of ``target_mb`` MB under ``folder`` (built once, then reused)."""
    done = folder / f"{target_mb:g}MB" / "DONE"
    if not done.exists():
        print(f"building the corpus in {done.parent} (once) ...", flush=True)
        build(done.parent, target_mb=target_mb)
        done.write_text("built\n")
    return done.parent


def texts(corpus: Path) -> pl.DataFrame:
    """``id``, ``source``, ``text`` of every document of the corpus."""
    frames = [pl.read_ndjson(p).select("id", "text").with_columns(pl.lit(p.parent.name).alias("source"))
              for p in sorted(corpus.glob("*/*.jsonl"))]  # fmt: skip
    return pl.concat(frames).select("id", "source", "text")


def describe(frame: pl.DataFrame, label: str) -> str:
    """Documents, MB, and character-length quantiles of ``frame``'s text."""
    n = frame["text"].str.len_chars()
    q = [int(n.quantile(x)) for x in (0.1, 0.5, 0.9, 0.99)]
    mb = frame["text"].str.len_bytes().sum() / 1e6
    return f"{label}: {frame.height} documents, {mb:.1f} MB, characters p10/p50/p90/p99 {q[0]}/{q[1]}/{q[2]}/{q[3]}, mean {n.mean():.0f}"


def jsonl_bytes(rows: list[dict]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)
