"""A tiny two-source curated job and a study job file on it, for the ``winnow ablate`` tests."""

from pathlib import Path

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
[train.model]
dim = 16
n_layers = 1
n_heads = 2
ffn_hidden = 16
n_experts = 2
top_k = 1
[train.data]
batch_size = 2
seq_len = 32
num_workers = 0
[ablate]
output = "{study}"
{keys}
""")
    return path
