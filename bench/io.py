"""Read + write throughput: winnow's JSONL reader and Parquet writer vs Hugging Face datasets.

    python bench/io.py               # the sample data, then a generated 1 GB JSONL file
    python bench/io.py --mb 200      # a smaller generated file

Both sides read the same JSONL file and write Parquet: winnow as a curation job with no
stages (read → shards, Parquet only, one worker), datasets as ``load_dataset("json")``
followed by ``to_parquet``. Runs alternate A B A B and the best of each is compared.
"""

from __future__ import annotations

import argparse
import gzip
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from winnow.curate.config import InputConfig, Job, JobSection, OutputConfig  # noqa: E402
from winnow.curate.pipeline import run_job  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[1] / "data_samples"


def make_jsonl(path: Path, target_mb: int) -> int:
    """A JSONL file of ``target_mb`` MB built from the sample documents with varied meta; returns rows."""
    texts = []
    for f in sorted((SAMPLES / "docs").glob("*.jsonl.gz")):
        texts += [orjson.loads(line)["text"] for line in gzip.decompress(f.read_bytes()).splitlines() if line.strip()]
    rng = random.Random(0)
    rows, size = 0, 0
    with path.open("wb") as fh:
        while size < target_mb << 20:
            line = (
                orjson.dumps(
                    {
                        "id": f"doc-{rows}",
                        "text": rng.choice(texts),
                        "url": f"https://example.org/{rows}",
                        "score": rng.random(),
                        "tags": ["a", "b"][: rows % 3],
                    }
                )
                + b"\n"
            )
            fh.write(line)
            size += len(line)
            rows += 1
    return rows


def run_winnow(path: Path, out: Path) -> float:
    job = Job(
        job=JobSection(name="io", output=str(out), workers=1, batch_rows=16384),
        inputs=[InputConfig(source="bench", path=str(path))],
        output=OutputConfig(formats=["parquet"], shard_rows=200_000),
    )
    t0 = time.perf_counter()
    run_job(job, progress=False)
    return time.perf_counter() - t0


def run_datasets(path: Path, out: Path) -> float:
    import datasets

    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    ds = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(out / "cache"))
    ds.to_parquet(str(out / "data.parquet"))
    return time.perf_counter() - t0


def compare(label: str, path: Path, rows: int, repeats: int) -> None:
    mb = path.stat().st_size / 2**20
    best = {"winnow": float("inf"), "datasets": float("inf")}
    for _ in range(repeats):
        for name, fn in (("winnow", run_winnow), ("datasets", run_datasets)):
            tmp = Path(tempfile.mkdtemp(prefix=f"bench-io-{name}-"))
            try:
                best[name] = min(best[name], fn(path, tmp))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{label}: {mb:.1f} MB, {rows} rows (best of {repeats}, A B A B)")
    for name, secs in best.items():
        print(f"  {name:<9} {secs:7.2f} s  {mb / secs:8.1f} MB/s  {rows / secs:10.0f} rows/s")
    print(f"  ratio winnow/datasets throughput: {best['datasets'] / best['winnow']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=1024, help="size of the generated JSONL file")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-io-") as tmp:
        sample = Path(tmp) / "sample.jsonl"
        with sample.open("wb") as fh:
            n = 0
            for f in sorted((SAMPLES / "docs").glob("*.jsonl.gz")):
                data = gzip.decompress(f.read_bytes())
                fh.write(data)
                n += data.count(b"\n")
        compare("sample data (docs source, decompressed)", sample, n, args.repeats)
        big = Path(tmp) / "big.jsonl"
        rows = make_jsonl(big, args.mb)
        compare(f"generated JSONL ({args.mb} MB)", big, rows, args.repeats)


if __name__ == "__main__":
    main()
