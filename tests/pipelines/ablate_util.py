"""A tiny two-source curated job and a study job file on it, for the ``winnow ablate`` tests."""

from pathlib import Path

from tests.pipelines.tiny import TINY_MODEL
from tests.train.shards_util import write_job

SOURCES = ["code", "prose"]


def docs(n: int, offset: int = 0, sources: list[str] = SOURCES) -> list[dict]:
    return [{"id": f"{s}/{i}", "source": s, "text": (f"def f{i}(x): return x + {i}\n" if s == "code" else
                                                     f"The {i}th sentence of plain prose, and some more words. ") * 4,
             "meta": None} for i in range(offset, offset + n) for s in sources]


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
