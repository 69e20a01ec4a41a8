"""Benchmark: the counterfactual against real ablations, on studies of text other than the sample data.

    python bench/counterfactual.py                          # build the corpus, curate, run the study, print the check
    python bench/counterfactual.py --corpus distinct        # the same with the second corpus (below)
    python bench/counterfactual.py --study out/demo/ablate  # print the check of a finished study (the shipped one)

Both corpora are built from text this machine has, none of it in ``data_samples/``. ``--corpus gnu``
(the default), four sources of one kind of text, documentation:

- ``man``: 700 man pages (sections 1 and 8), rendered with ``man -l`` and ``col -bx``;
- ``info``: the GNU info manuals of ``/usr/share/info``, cut at their nodes;
- ``news``: the NEWS and README files of ``/usr/share/doc`` (2.5 MB);
- ``noise``: planted, 600 documents of random lowercase letter strings, the known answer: a source
  that should hurt every real one, and whose removal should help them.

``--corpus distinct``, five sources of different kinds, with both known answers planted:

- ``python``: the standard library's Python sources;
- ``man``: 700 man pages, as above;
- ``licence``: ``/usr/share/common-licenses`` and the packages' copyright files;
- ``licence_twin``: the same documents as ``licence``, with the same ids (``[job] duplicate_ids =
  "allow"``, so the split holds out the same documents), in another order: one source under two names,
  whose two copies should get equal values;
- ``noise``: random letter strings, as above.

Its documents are shuffled once when the corpus is built, so that a run reading the first part of a
source reads a sample of it, the same for every seed; its study trains for 200 steps, as the shipped
study does (49 runs, about an hour on 2 cores). docs/attribution.md holds what it measured.

Documents are cut at paragraphs into pieces of at most 6,000 characters. The job cleans (for
``--corpus distinct`` without the boilerplate-line removal, which decides by id and so needs ids that no
two sources share), drops documents under 20 words, splits 5% of each source off as held-out, and writes Parquet and byte-level
token shards. The study (``STUDY`` below: the shipped study's model and batch, 150 steps) trains
the baseline with four seeds (the counterfactual of two), each source left out and each source's
share times 0.5 and 1.5 with three seeds each: 40 runs, two at a time. It prints what
``ablation/correlation.json`` holds: on the cells whose measured change exceeds the seed noise, the
signs the counterfactual gets right and the sizes it gets within a factor 2; the Spearman rank
correlation over all cells; and whether the noise is well below the effects. Then the same check of the
counterfactual calibrated on the study (``ablation/calibrated.json``), each variant predicted by a fit
without its own runs, and its two halves apart: each source predicted from the other sources' variants
alone, and the study's runs with no prior.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LIMIT = 6000  # characters per document piece

JOB = """[job]
name = "counterfactual-bench"
output = "{out}/job"
workers = 2
seed = 0
{inputs}
[[stages]]
kind = "clean"
[[stages]]
kind = "filter.length"
min_words = 20
[[stages]]
kind = "split"
val_fraction = 0.05

[output]
formats = ["parquet", "tokens"]
shard_rows = 2000
[output.tokens]
tokenizer = "byte"
"""

STUDY = """[job]
output = "{out}/job"
[train]
output = "{out}/study"
steps = 150
seed = 0
[train.model]
dim = 128
n_layers = 4
n_experts = 8
top_k = 2
[train.data]
batch_size = 8
seq_len = 128
num_workers = 1
[train.metrics]
log_every = 25
[train.attribution]
start = 30
[ablate]
kind = ["leave_one_out", "weights"]
factors = [0.5, 1.5]
output = "{out}/study"
noise_seeds = 4
variant_seeds = 3
attribution_every = 10
attribution_seeds = 2
parallel = 2
"""


def _pieces(text: str) -> list[str]:
    paragraphs, out, current, size = re.split(r"\n\s*\n", text), [], [], 0
    for p in paragraphs:
        if size + len(p) > LIMIT and current:
            out.append("\n\n".join(current))
            current, size = [], 0
        current.append(p)
        size += len(p) + 2
    if current:
        out.append("\n\n".join(current))
    return out


def _man(path: Path) -> str:
    done = subprocess.run(
        ["man", "-l", str(path)], capture_output=True, env={"MANWIDTH": "80", "PATH": "/usr/bin:/bin"}, timeout=30
    )
    cleaned = subprocess.run(["col", "-bx"], input=done.stdout, capture_output=True, timeout=30)
    return cleaned.stdout.decode("utf-8", "replace")


def build(out: Path, seed: int = 0) -> dict[str, int]:
    """Write the four sources as JSONL under ``out``; returns the documents per source."""
    import gzip

    rng = random.Random(seed)
    pages = sorted(Path("/usr/share/man/man1").glob("*.1.gz")) + sorted(Path("/usr/share/man/man8").glob("*.8.gz"))
    rng.shuffle(pages)
    with ThreadPoolExecutor(4) as pool:
        rendered = list(pool.map(_man, pages[:700]))
    docs = {"man": [p for t in rendered if len(t) > 500 for p in _pieces(t)]}
    docs["info"] = [
        p
        for f in sorted(Path("/usr/share/info").glob("*.gz"))
        for node in gzip.open(f).read().decode("utf-8", "replace").split("\x1f")
        if len(node) > 400
        for p in _pieces(node)
    ]
    news = []
    for f in sorted(Path("/usr/share/doc").glob("*/*")):
        if f.is_dir() or not f.name.lower().startswith(("news", "readme")):
            continue
        try:
            text = (gzip.open(f).read() if f.suffix == ".gz" else f.read_bytes()).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError):
            continue
        if len(text) > 300:
            news += _pieces(text)[:20]
    rng.shuffle(news)
    kept, size = [], 0
    for doc in news:
        if size > 2.5e6:
            break
        kept.append(doc)
        size += len(doc)
    docs["news"] = kept
    letters = "abcdefghijklmnopqrstuvwxyz"
    docs["noise"] = [
        " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(rng.randint(300, 700)))
        for _ in range(600)
    ]
    for name, items in docs.items():
        folder = out / "corpus" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "part-0.jsonl").write_text(
            "".join(json.dumps({"id": f"{name}-{i}", "text": t}) + "\n" for i, t in enumerate(items))
        )
    return {k: len(v) for k, v in docs.items()}


def build_distinct(out: Path, seed: int = 0) -> dict[str, int]:
    """Write the five sources of ``--corpus distinct`` as JSONL under ``out``; returns the documents per source."""
    import gzip
    import sysconfig

    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(f for f in stdlib.rglob("*.py") if "site-packages" not in f.parts)
    rng.shuffle(files)
    python, size = [], 0
    for f in files:
        if size > 6e6:
            break
        text = f.read_text("utf-8", "replace")
        python += _pieces(text)
        size += len(text)
    pages = sorted(Path("/usr/share/man/man1").glob("*.1.gz")) + sorted(Path("/usr/share/man/man8").glob("*.8.gz"))
    rng.shuffle(pages)
    with ThreadPoolExecutor(4) as pool:
        rendered = list(pool.map(_man, pages[:700]))
    licences, seen = [], set()
    for f in sorted(Path("/usr/share/common-licenses").iterdir()) + sorted(Path("/usr/share/doc").glob("*/copyright")):
        try:
            text = (gzip.open(f).read() if f.suffix == ".gz" else f.read_bytes()).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError):
            continue
        for piece in _pieces(text):
            if len(piece) > 300 and piece not in seen:  # copyright files repeat the same licence texts verbatim
                seen.add(piece)
                licences.append(piece)
    letters = "abcdefghijklmnopqrstuvwxyz"
    docs = {
        "python": python,
        "man": [p for t in rendered if len(t) > 500 for p in _pieces(t)],
        "licence": licences,
        "noise": [
            " ".join(
                "".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(rng.randint(300, 700))
            )
            for _ in range(600)
        ],
    }
    rows = {}
    for name, items in docs.items():
        rng.shuffle(items)
        rows[name] = [(f"{name}-{i}", t) for i, t in enumerate(items)]
    # the twin's rows are the licence rows, ids and all, in another order: with the same order the two copies
    # would read each document at the same step, twice in a row, as long as their shares are equal
    rows["licence_twin"] = rng.sample(rows["licence"], len(rows["licence"]))
    for name, items in rows.items():
        folder = out / "corpus" / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "part-0.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in items))
    return {k: len(v) for k, v in rows.items()}


CORPORA = {  # --corpus: (builder, sources, steps, [job] settings, clean's settings)
    "gnu": (build, ("man", "info", "news", "noise"), 150, "", ""),
    "distinct": (
        build_distinct,
        ("python", "man", "licence", "licence_twin", "noise"),
        200,
        'duplicate_ids = "allow"\n',
        # boilerplate removal decides by id, which two sources sharing ids cannot have
        "boilerplate_min_docs = false\n",
    ),
}


def report(study: Path) -> None:
    path = study / "ablation" / "correlation.json"
    if not path.is_file():
        raise SystemExit(f"no {path}: the study has not finished")
    from winnow.pipelines.ablate.correlation import figures_text, measurement_text, rho_text

    c = json.loads(path.read_text())
    above = c["above_noise"]
    print(
        f"study {study}: {c['n_cells']} cells, {above} above the seed noise; the counterfactual of "
        f"{c.get('counterfactual_runs')} baseline seed(s)"
    )
    print(f"  signs right:     {c['sign_agree']}/{above} ({100 * c['sign_agree'] / max(above, 1):.0f}%; target 90%)")
    print(f"  within 2x:       {c['within_2x']}/{above} ({100 * c['within_2x'] / max(above, 1):.0f}%; target 80%)")
    print(f"  Spearman:        {rho_text(c['spearman'])} over all cells (target 0.9)")
    for kind, part in (c.get("by_kind") or {}).items():
        print(
            f"    {kind}: signs {part['sign_agree']}/{part['above_noise']}, within 2x {part['within_2x']}/"
            f"{part['above_noise']}, Spearman {rho_text(part['spearman'])}"
        )
    if c.get("measurement"):
        print(f"  {measurement_text(c['measurement'])}")
    print(f"  {c.get('note', '')}")
    calibrated = study / "ablation" / "calibrated.json"
    if calibrated.is_file():  # the same check of the counterfactual calibrated on the study, variant by variant
        from winnow.pipelines.ablate.calibrate import check_text

        print(check_text(json.loads(calibrated.read_text())))
        for name, found in what_the_run_adds(study).items():
            print(f"  {figures_text(name, found)}")


def what_the_run_adds(study: Path) -> dict[str, dict]:
    """The calibrated check's two halves apart, on the study's one-source variants: "without the source's own
    runs" predicts each source's variants from the laws fitted to the other sources' variants alone (what the
    run's slopes and the other variants say about a source never ablated); "the study alone" is the calibrated
    fit with the run's slopes as no prior, each variant held back."""
    import numpy as np
    import polars as pl

    from winnow.pipelines.ablate import calibrate
    from winnow.pipelines.ablate.correlation import agreement, compare_with_counterfactual, slope_of
    from winnow.pipelines.ablate.layout import StudyLayout
    from winnow.pipelines.ablate.table import baseline_attributions

    results = [json.loads((study / "result.json").read_text())]
    results += [json.loads(p.read_text()) for p in sorted(study.glob("variants/*/result.json"))]
    _, counterfactuals = baseline_attributions(StudyLayout(study), results)
    frame = compare_with_counterfactual(results, counterfactuals, results[0]["weights"])["cells"]
    slope, se, sources, held, q = slope_of(counterfactuals)
    held = [h for h in held if h != "mean"]
    slope, se = slope[:, : len(held)], se[:, : len(held)]
    base = calibrate.base_shares(results[0]["weights"], sources)
    cells = calibrate.cells_of(frame, sources, held, base)
    unseen = np.full(len(cells.measured), np.nan)
    for a in range(len(sources)):
        own = cells.source == a
        fit = calibrate.fit(cells.take(~own), slope, se, base, q)
        c = cells.take(own)
        unseen[own] = fit.predict(c.shares, c.held)[0] + fit.offset[c.held]
    alone = calibrate.cross_validated(cells, slope, se, base, q, prior=False)
    out = {}
    for name, predicted in (("without the source's own runs", unseen), ("the study alone", alone)):
        by_cell = {(v, held[j]): x for v, j, x in zip(cells.variant, cells.held, predicted)}
        compared = frame.filter(pl.col("kind").is_in(calibrate.SCALED))
        column = [by_cell.get((v, s)) for v, s in zip(compared["variant"], compared["source"])]
        compared = compared.with_columns(predicted=pl.Series(column, dtype=pl.Float64)).drop_nulls("predicted")
        out[name] = agreement(compared)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", choices=sorted(CORPORA), default="gnu", help="which sources (see above)")
    parser.add_argument("--out", type=Path, help="default: bench/_data/counterfactual[-distinct]")
    parser.add_argument("--study", type=Path, help="print the check of this finished study and stop")
    args = parser.parse_args(argv)
    if args.study is not None:
        report(args.study)
        return 0
    from winnow.pipelines.cli import main as winnow

    builder, sources, steps, job_settings, clean_settings = CORPORA[args.corpus]
    default = "counterfactual" + ("" if args.corpus == "gnu" else f"-{args.corpus}")
    out = (args.out or ROOT / "bench" / "_data" / default).resolve()
    if not (out / "corpus").is_dir():
        print("documents per source:", builder(out))
    inputs = "".join(f'\n[[inputs]]\nsource = "{s}"\npath = "{out}/corpus/{s}/*.jsonl"\n' for s in sources)
    (out / "job.toml").write_text(
        JOB.format(out=out, inputs=inputs)
        .replace("seed = 0\n", "seed = 0\n" + job_settings, 1)
        .replace('kind = "clean"\n', 'kind = "clean"\n' + clean_settings, 1)
    )
    (out / "study.toml").write_text(STUDY.format(out=out).replace("steps = 150", f"steps = {steps}", 1))
    if not (out / "job" / "manifest.json").is_file() and winnow(["-q", "curate", str(out / "job.toml")]):
        return 1
    if winnow(["ablate", str(out / "study.toml")]):
        return 1
    report(out / "study")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
