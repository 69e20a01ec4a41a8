"""A tiny two-source curated job and a study job file on it, for the ``winnow ablate`` tests."""

from pathlib import Path

from tests.pipelines.tiny import TINY_MODEL
from tests.train.shards_util import write_job

SOURCES = ["code", "prose"]


def docs(n: int, offset: int = 0, sources: list[str] = SOURCES) -> list[dict]:
    return [
        {
            "id": f"{s}/{i}",
            "source": s,
            "text": (
                f"def f{i}(x): return x + {i}\n"
                if s == "code"
                else f"The {i}th sentence of plain prose, and some more words. "
            )
            * 4,
            "meta": None,
        }
        for i in range(offset, offset + n)
        for s in sources
    ]


def tiny_job(folder: Path, *, sources: list[str] = SOURCES) -> Path:
    """Two train shards and two val shards of ``code`` and ``prose``; ``sources`` may name more (with no rows)."""
    return write_job(folder, [docs(6), docs(6, 6)], val=[docs(2, 100)[0::2], docs(2, 100)[1::2]], sources=sources)


def study_toml(path: Path, job: Path, study: Path, *, steps: int = 3, train: str = "", **ablate) -> Path:
    """A study job file: the tiny model for ``steps`` steps, ``[ablate]`` keys from ``ablate`` (TOML literals)."""
    keys = "\n".join(f"{k} = {v}" for k, v in ablate.items())
    path.write_text(f"""[job]
output = "{job}"
[train]
steps = {steps}
{train}
{TINY_MODEL.strip()}
[ablate]
output = "{study}"
{keys}
""")
    return path


def _words(rng, n: int, vocabulary: list[str]) -> str:
    return " ".join(vocabulary[k] for k in rng.integers(0, len(vocabulary), size=n)) + "."


def curation_inputs(folder: Path) -> Path:
    """``prose`` and ``code`` JSONL inputs, 48 documents each, with exact and near (three words edited) copies and a
    few short documents; returns the folder."""
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    vocabulary = {"prose": [f"word{i}" for i in range(400)], "code": [f"sym_{i}()" for i in range(400)]}
    for source, words in vocabulary.items():
        docs = [_words(rng, 40 + (i * 7) % 60, words) for i in range(48)]
        docs[40:44] = docs[0:4]  # exact copies
        for i in range(44, 48):  # near copies of documents 4-7
            edited = docs[i - 40].split()
            for k in (5, 15, 25):
                edited[k] = f"edit{k}"
            docs[i] = " ".join(edited)
        for i in range(36, 40):
            docs[i] = _words(rng, 4, words)  # too short for filter.length
        (folder / source).mkdir(parents=True, exist_ok=True)
        for part in range(2):
            lines = [json.dumps({"id": f"{source}/{i}", "text": t}) for i, t in enumerate(docs) if i % 2 == part]
            (folder / source / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def curation_study(folder: Path, *, steps: int = 3, split: str = "val_fraction = 0.25", **ablate) -> Path:
    """A study file holding its own job (two sources; clean, length filter, exact and MinHash dedup, split, a length
    curriculum) and [ablate] keys from ``ablate`` (TOML literals); inputs under ``folder/in``, job in ``folder/job``."""
    inputs = curation_inputs(folder / "in")
    keys = "\n".join(f"{k} = {v}" for k, v in ablate.items())
    path = folder / "study.toml"
    path.write_text(f"""[job]
name = "tiny"
output = "{folder / "job"}"
[[inputs]]
source = "prose"
path = "{inputs}/prose/*.jsonl"
[[inputs]]
source = "code"
path = "{inputs}/code/*.jsonl"
[[stages]]
kind = "clean"
[[stages]]
kind = "filter.length"
min_words = 10
[[stages]]
kind = "dedup.exact"
[[stages]]
kind = "dedup.minhash"
threshold = 0.8
[[stages]]
kind = "split"
{split}
[[stages]]
kind = "order"
by = "length"
window = 8
[output]
formats = ["parquet"]
[train]
steps = {steps}
{TINY_MODEL.strip()}
[ablate]
output = "{folder / "study"}"
threads = 1
attribution_every = 0
{keys}
""")
    return path
