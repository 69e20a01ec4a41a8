"""Benchmark: winnow's heuristic filters against datatrove's on the same documents.

    pip install datatrove spacy      # the peer, for this benchmark only (not a winnow dependency)
    python bench/filters.py --docs 2000 --rounds 2

Runs the four rule families (Gopher quality, Gopher repetition, C4, FineWeb) of both
projects on one core (polars and numba pinned to one thread), interleaved A B A B, and
prints docs/s for each, the speed ratio, and the share of documents whose keep/drop
decision agrees. Documents come from ``data_samples/`` when it holds JSONL/Parquet files,
else from the docstrings of Python's standard library. The machine may be shared:
read the ratio as a paired comparison within one run, not as an absolute figure.

Where the definitions differ (the reason agreement can fall short of 100%):

* words: datatrove tokenizes with spaCy's English tokenizer; winnow uses one regex
  (``curate/text/words.py``) that splits punctuation and contractions the same way in
  common prose but not spaCy's exception lists ("Mr.", "C(x" kept whole, ...). Word
  counts, alphabetic-word ratios and n-gram fractions move by a token or two, which
  flips documents that sit on a threshold (Gopher quality, Gopher repetition n-gram
  rules, FineWeb list ratio);
* C4 sentences: datatrove runs spaCy's sentencizer on each kept line; winnow counts
  sentence ends with a regex (abbreviations such as "e.g." or "Mr." count as ends);
* Gopher symbol words: datatrove's hand-made punctuation list vs. winnow's "no letter,
  digit or mark" (differs on symbols such as currency signs);
* FineWeb terminal punctuation: Unicode ``Sentence_Terminal`` vs. datatrove's older list;
* Gopher repetition n-grams compare token sequences, where datatrove compares
  ``"".join(words)`` strings (so "ab c" and "a bc" collide there, not here).
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")  # one core, as the comparison asks
os.environ.setdefault("NUMBA_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import polars as pl  # noqa: E402

from winnow.curate.stages.base import StageContext  # noqa: E402
from winnow.curate.stages.filters.c4 import C4Config, C4Filter  # noqa: E402
from winnow.curate.stages.filters.fineweb import FineWebConfig, FineWebFilter  # noqa: E402
from winnow.curate.stages.filters.gopher import GopherQualityConfig, GopherQualityFilter  # noqa: E402
from winnow.curate.stages.filters.gopher_repetition import GopherRepetitionConfig, GopherRepetitionFilter  # noqa: E402


def sample_texts(limit: int) -> list[str]:
    """Texts from data_samples/ if present, else stdlib docstrings (per object and per module)."""
    root = Path(__file__).resolve().parents[1] / "data_samples"
    texts: list[str] = []
    for path in sorted(root.rglob("*.jsonl*")) + sorted(root.rglob("*.parquet")):
        if ".build-tmp" in path.parts:
            continue
        try:
            df = pl.read_parquet(path) if path.suffix == ".parquet" else pl.read_ndjson(io.BytesIO(_decompressed(path)))
        except Exception:  # malformed sample rows are planted on purpose; the bench only needs text
            continue
        if "text" in df.columns:
            texts.extend(t for t in df["text"].to_list() if isinstance(t, str))
    if len(texts) < limit:
        texts.extend(stdlib_docstrings())
    random.Random(0).shuffle(texts)  # a mix of every source whatever the size of the run
    return texts[:limit]


def _decompressed(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".gz":
        return gzip.decompress(data)
    if path.suffix == ".zst":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read()
    return data


def stdlib_docstrings() -> list[str]:
    import importlib
    import inspect
    import warnings

    warnings.simplefilter("ignore")
    out: list[str] = []
    for name in sorted(sys.stdlib_module_names):
        if name.startswith("_") or name in {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"}:
            continue
        try:
            mod = importlib.import_module(name)
        except Exception:  # modules that cannot import on this platform
            continue
        docs = [inspect.getdoc(o) for o in vars(mod).values() if inspect.isclass(o) or inspect.isfunction(o)]
        docs = [d for d in docs if d]
        out.extend(docs)
        if docs:
            out.append("\n\n".join([inspect.getdoc(mod) or "", *docs]))
    return list(dict.fromkeys(out))


def families():
    from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter
    from datatrove.pipeline.filters import GopherQualityFilter as DtGQ
    from datatrove.pipeline.filters import GopherRepetitionFilter as DtGR

    return [
        ("gopher_quality", GopherQualityFilter(GopherQualityConfig(), _ctx()), DtGQ()),
        ("gopher_repetition", GopherRepetitionFilter(GopherRepetitionConfig(), _ctx()), DtGR()),
        ("c4", C4Filter(C4Config(), _ctx()), C4QualityFilter()),
        ("fineweb", FineWebFilter(FineWebConfig(), _ctx()), FineWebQualityFilter()),
    ]


def _ctx() -> StageContext:
    return StageContext(
        stage_id="bench", job_name="bench", output_dir=Path("."), plan_dir=Path("."), sources=("bench",)
    )


def run_winnow(stage, batch: pl.DataFrame) -> tuple[float, set[str]]:
    t0 = time.perf_counter()
    out = stage.apply(batch)
    return time.perf_counter() - t0, set(out.kept["id"].to_list())


def run_datatrove(flt, texts: list[str]) -> tuple[float, set[str]]:
    from datatrove.data import Document

    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    t0 = time.perf_counter()
    kept = set()
    for d in docs:
        res = flt.filter(d)
        if res is True or (isinstance(res, tuple) and res[0]):
            kept.add(d.id)
    return time.perf_counter() - t0, kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=2000, help="number of documents (size of the run)")
    ap.add_argument("--rounds", type=int, default=2, help="A B rounds per family; best time of each side is used")
    args = ap.parse_args()
    texts = sample_texts(args.docs)
    batch = pl.DataFrame(
        {"id": [str(i) for i in range(len(texts))], "source": "bench", "text": texts, "meta": None},
        schema_overrides={"meta": pl.String},
    )
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"{len(texts)} documents, {mb:.1f} MB; one thread each side; A B interleaved x{args.rounds}")
    print(f"{'family':<18} {'winnow docs/s':>14} {'datatrove docs/s':>17} {'ratio':>7} {'agree':>8}")
    all_w, all_d = 0.0, 0.0
    for name, ours, peer in families():
        run_winnow(ours, batch.head(50))  # warm numba and regex caches outside the timing
        run_datatrove(peer, texts[:50])
        tw, td = [], []
        for _ in range(args.rounds):
            t, kept_w = run_winnow(ours, batch)
            tw.append(t)
            t, kept_d = run_datatrove(peer, texts)
            td.append(t)
        agree = sum((str(i) in kept_w) == (str(i) in kept_d) for i in range(len(texts))) / len(texts)
        w, d = min(tw), min(td)
        all_w, all_d = all_w + w, all_d + d
        print(f"{name:<18} {len(texts) / w:>14,.0f} {len(texts) / d:>17,.0f} {d / w:>6.1f}x {agree:>8.2%}")
    print(f"{'all four':<18} {len(texts) / all_w:>14,.0f} {len(texts) / all_d:>17,.0f} {all_d / all_w:>6.1f}x")


if __name__ == "__main__":
    main()
