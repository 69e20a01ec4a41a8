"""Curation against the hardware floor: each stage's time as a multiple of reading the input and writing the shards.

    pip install datatrove spacy rensa     # the peers, for this benchmark only (datasketch is a winnow dependency)
    python bench/floor.py                 # everything: ~85 MB of long documents, 1 and 2 workers, 2 rounds
    python bench/floor.py --sections jobs --workers 2 --rounds 3
    python bench/floor.py --sections filters,minhash --mb 20

The input is ``bench/floor_corpus.py``'s: long real documents of this machine (man pages,
Python docstrings and sources, licence and copyright files, Debian changelogs) as the demo's
four sources, with near-copies for MinHash to find. The *floor* is a job with no stages on
the same input and the demo's outputs (JSONL read; Parquet, WebDataset and token shards
written): what any curation of this input costs at least. Every other figure is a ratio to
it, or to a peer, measured in the same run as pairs that alternate (A B A B); the machine may
be shared, so read ratios within a pair, not absolute times.

Sections:

* ``jobs``: the demo's whole stage set (``pipelines/demo.toml``) and each stage family alone,
  end to end, as multiples of the floor; for the whole job, where the time beyond the floor
  goes: each stage's own seconds (summed over tasks, per worker) and each phase's wall time;
* ``filters``: the four heuristic filter families (Gopher quality, Gopher repetition, C4,
  FineWeb) end to end on one worker against datatrove's (``JsonlReader`` -> the filters ->
  ``ParquetWriter``), then each family's own time against datatrove's on the same documents,
  and ``filter.gopher_repetition`` in MB per CPU second on the whole corpus (CPU time, which
  other work on a shared machine does not inflate as it does wall time);
* ``minhash``: ``bench/minhash_floor.py`` (signature + LSH against rensa and datasketch on the
  same shingles; the dedup job against a rensa pipeline, with precision and recall).

Each job runs in a fresh process (``--child``), so its wall time includes starting Python and
importing what the command imports, as a user's run does.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

floor_corpus = None  # imported by main(): a job's child process imports only what `winnow curate` does

DATA = ROOT / "bench" / "_data" / "floor"
FILTER_STAGES = [
    {"kind": "filter.gopher_quality"},
    {"kind": "filter.gopher_repetition"},
    {"kind": "filter.c4"},
    {"kind": "filter.fineweb"},
]


# -- the machine ----------------------------------------------------------------------------
def machine() -> str:
    """Date, CPU model and flags (lscpu), cores, Python, and the load average now."""
    model, flags = platform.processor(), ""
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "Flags":
                flags = value.strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    simd = " ".join(f for f in flags.split() if f.startswith(("avx", "sse4", "amx", "fma", "bmi")))
    return (f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}\n"
            f"machine: {model}, {os.cpu_count()} CPUs; SIMD flags: {simd or 'unknown'}\n"
            f"python {platform.python_version()}; command: {' '.join([Path(sys.executable).name, *sys.argv])}\n"
            f"{load()}")  # fmt: skip


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average (1/5/15 min): {one:.2f} {five:.2f} {fifteen:.2f}"


# -- jobs -----------------------------------------------------------------------------------
def demo_job(corpus: Path, output: Path, workers: int, stages: list[dict] | None) -> dict:
    """The demo job file's curation part as a dict, on ``corpus``; ``stages`` replaces its stage list (None: the demo's)."""
    raw = tomllib.loads((ROOT / "pipelines" / "demo.toml").read_text())
    job = {"job": {**raw["job"], "name": "floor", "output": str(output), "workers": workers},
           "inputs": [{"source": s, "path": str(corpus / s / "*.jsonl")} for s in floor_corpus.SHARES],
           "stages": copy.deepcopy(raw["stages"] if stages is None else stages), "output": raw["output"]}  # fmt: skip
    return job


def demo_stage(kind: str) -> dict:
    """The demo's table for stage ``kind`` (its parameters and source scope)."""
    raw = tomllib.loads((ROOT / "pipelines" / "demo.toml").read_text())
    return next(s for s in raw["stages"] if s["kind"] == kind)


def families() -> dict[str, list[dict]]:
    """Each stage family of the demo alone (with what it needs before it)."""
    one = {
        k: [demo_stage(k)]
        for k in (
            "clean",
            "filter.length",
            "filter.gopher_quality",
            "filter.fineweb",
            "filter.gopher_repetition",
            "dedup.exact",
            "dedup.minhash",
            "score.heuristic",
        )
    }
    return {
        **one,
        "score.difficulty": [demo_stage("score.difficulty")],
        "split + mix": [demo_stage("split"), demo_stage("mix")],
        "split + mix + order": [
            demo_stage("score.difficulty"),
            demo_stage("split"),
            demo_stage("mix"),
            demo_stage("order"),
        ],
    }


class _Phases(logging.Handler):
    """Wall-clock times of the runner's log lines (phase starts, plans), to split a job's time by phase."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.events: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith(("phase ", "planning ", "planned ")):
            self.events.append((time.perf_counter(), msg))


def child(spec: Path) -> None:
    """Run the job in ``spec`` (JSON) and print wall time, phases and manifest as JSON."""
    t0 = time.perf_counter()
    from winnow.curate.pipeline import run_job
    from winnow.pipelines.jobfile import job_from_dict

    raw = json.loads(spec.read_text())
    handler = _Phases()
    logging.getLogger("winnow.curate").addHandler(handler)
    logging.getLogger("winnow.curate").setLevel(logging.INFO)
    t_imports = time.perf_counter() - t0
    manifest = run_job(job_from_dict(raw, source_file=str(spec)), progress=False)
    end = time.perf_counter()
    print(json.dumps({"seconds": end - t0, "imports": t_imports, "manifest": manifest,
                      "events": [(t - t0, m) for t, m in handler.events], "end": end - t0}))  # fmt: skip


def run_job(job: dict, label: str) -> dict:
    """Run ``job`` in a fresh process; its output folder is removed afterwards. Returns the child's JSON."""
    out = Path(job["job"]["output"])
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = out.parent / f"{out.name}.json"
    spec.write_text(json.dumps(job))
    from dedup import installed_bytecode

    installed_bytecode()
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", str(spec)], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{label} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["wall"] = wall
    shutil.rmtree(out, ignore_errors=True)
    spec.unlink()
    return result


def phase_times(result: dict) -> list[tuple[str, float]]:
    """(what, seconds) for imports and each logged phase/plan, from the child's events."""
    marks = (
        [(0.0, "start"), (result["imports"], "imports")]
        + [(t, m) for t, m in result["events"]]
        + [(result["end"], "end")]
    )
    out = [("import curate and pipelines", result["imports"])]
    for (t, msg), (t_next, _) in zip(marks[1:-1], marks[2:]):
        out.append((_phase_label(msg), t_next - t))
    return out


def _phase_label(msg: str) -> str:
    """What the time from the log line ``msg`` to the next one was spent on."""
    if msg == "imports":
        return "job file, inputs listed, tasks made"
    if msg.startswith("phase"):
        return msg.split(":")[0]
    if msg.startswith("planning"):
        return "plan " + msg.split()[1].rstrip(":")
    return "after plan " + msg.split()[1]  # "planned X in ..": until the next phase starts


def jobs_section(corpus: Path, workers: list[int], rounds: int, only: list[str] | None) -> None:
    """The whole demo job and each family alone against the floor job, A B A B."""
    for w in workers:
        print(
            f"\n== jobs, {w} worker(s): wall time as a multiple of the floor (read JSONL, write Parquet + WebDataset + tokens) =="
        )
        cases = {"demo stage set": None, **families()}
        if only:
            cases = {k: v for k, v in cases.items() if k in only or (k == "demo stage set" and "demo" in only)}
        floor_job = demo_job(corpus, DATA / "out" / "floor", w, [])
        run_job(floor_job, "warm-up")  # numba's cache and the page cache
        demo_result = None
        for name, stages in cases.items():
            job = demo_job(corpus, DATA / "out" / "job", w, stages)
            pairs = []
            for r in range(rounds):
                order = [("floor", floor_job), (name, job)] if r % 2 == 0 else [(name, job), ("floor", floor_job)]
                res = {k: run_job(j, k) for k, j in order}
                pairs.append((res["floor"]["wall"], res[name]["wall"]))
                if name == "demo stage set":
                    demo_result = res[name]
            ratios = [b / a for a, b in pairs]
            floors = ", ".join(f"{a:.1f}" for a, _ in pairs)
            walls = ", ".join(f"{b:.1f}" for _, b in pairs)
            print(f"{name:<26} {statistics.median(ratios):5.2f}x floor  (pairs: {', '.join(f'{x:.2f}' for x in ratios)}; "
                  f"floor s {floors}; job s {walls})", flush=True)  # fmt: skip
        if demo_result is not None:
            breakdown(demo_result, w)
        print(load())


def breakdown(result: dict, workers: int) -> None:
    """Where the demo job's time goes: phases (wall) and stages (their own seconds, per worker)."""
    print(f"\n  the demo stage set, last run: {result['wall']:.1f} s wall; phases (wall s):")
    for what, secs in phase_times(result):
        print(f"    {what:<40} {secs:7.2f}")
    print("  stages: own seconds summed over tasks / workers (the rest of a phase is reading and writing rows):")
    total = 0.0
    for st in result["manifest"]["stages"]:
        secs = st.get("seconds", 0.0) / workers
        total += secs
        print(f"    {st['id']:<40} {secs:7.2f}")
    print(f"    {'all stages':<40} {total:7.2f}")


# -- filters against datatrove --------------------------------------------------------------
def filters_section(corpus: Path, rounds: int, max_docs: int | None) -> None:
    frame = floor_corpus.texts(corpus)
    if max_docs:
        frame = frame.head(max_docs)
    mb = frame["text"].str.len_bytes().sum() / 1e6
    folder = DATA / "filters-input"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    frame.select("id", "text").write_ndjson(folder / "docs.jsonl")
    print(f"\n== filters: the four families end to end on 1 worker, {frame.height} documents, {mb:.1f} MB ==")
    job = {"job": {"name": "filters", "output": str(DATA / "out" / "filters"), "workers": 1},
           "inputs": [{"source": "bench", "path": str(folder / "docs.jsonl")}],
           "stages": FILTER_STAGES, "output": {"formats": ["parquet"]}}  # fmt: skip
    run_job(job, "warm-up")
    pairs = []
    for r in range(rounds):
        first, second = ("winnow", "datatrove") if r % 2 == 0 else ("datatrove", "winnow")
        res = {}
        for name in (first, second):
            res[name] = run_job(job, "winnow")["wall"] if name == "winnow" else datatrove_end_to_end(folder)
        pairs.append((res["winnow"], res["datatrove"]))
        print(
            f"  round {r + 1}: winnow {res['winnow']:.1f} s, datatrove {res['datatrove']:.1f} s: {res['datatrove'] / res['winnow']:.1f}x",
            flush=True,
        )
    print(
        f"  four filter families end to end: winnow {statistics.median(d / w for w, d in pairs):.1f}x datatrove (median of {rounds})"
    )
    repetition_per_core(floor_corpus.texts(corpus), rounds)
    per_family(frame, rounds)
    print(load())


def repetition_per_core(frame, rounds: int) -> None:
    """``filter.gopher_repetition``'s metrics on the whole corpus in MB per CPU second (best of ``rounds``)."""
    from winnow.curate.dedup.text import string_buffers
    from winnow.curate.stages.filters.gopher_repetition import gopher_repetition_metrics
    from winnow.curate.text.codepoints import TABLE
    from winnow.curate.text.repetition import repetition_counts

    text = frame["text"]
    mb = text.str.len_bytes().sum() / 1e6
    gopher_repetition_metrics(text.head(20))  # compiled kernels loaded
    offsets, data = string_buffers(text)
    tables = TABLE.cover(offsets, data)
    metrics, kernel = [], []
    for _ in range(rounds):
        c0 = time.process_time()
        gopher_repetition_metrics(text)
        c1 = time.process_time()
        repetition_counts(offsets, data, *tables)
        metrics.append(c1 - c0)
        kernel.append(time.process_time() - c1)
    print(
        f"\n  filter.gopher_repetition on all {frame.height} documents ({mb:.1f} MB), per CPU second of this process "
        f"(other work on the machine does not inflate it): metrics {mb / min(metrics):.1f} MB/s, "
        f"the compiled pass alone {mb / min(kernel):.1f} MB/s"
    )


def datatrove_end_to_end(folder: Path) -> float:
    """datatrove's reader, four filters and Parquet writer on one worker, in a fresh process; wall seconds."""
    code = f"""
import time, logging
t0 = time.perf_counter()
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import ParquetWriter
from datatrove.pipeline.filters import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
steps = [JsonlReader({str(folder)!r}, glob_pattern="*.jsonl"), GopherQualityFilter(), GopherRepetitionFilter(), C4QualityFilter(),
         FineWebQualityFilter(), ParquetWriter({str(DATA / "out" / "datatrove")!r})]
LocalPipelineExecutor(steps, tasks=1, workers=1, logging_dir={str(DATA / "out" / "datatrove-logs")!r}).run()
print(time.perf_counter() - t0)
"""
    shutil.rmtree(DATA / "out" / "datatrove", ignore_errors=True)
    shutil.rmtree(DATA / "out" / "datatrove-logs", ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"datatrove failed:\n{proc.stderr[-4000:]}")
    return time.perf_counter() - t0


def per_family(frame, rounds: int) -> None:
    """Each family's own time (winnow's stage on the batch, datatrove's filter per document), one thread, A B A B."""
    # children and this process's later imports; the jobs above use what they use
    os.environ["POLARS_MAX_THREADS"] = "1"
    import polars as pl
    from filters import families as filter_families
    from filters import run_datatrove, run_winnow

    texts = frame["text"].to_list()
    batch = pl.DataFrame({"id": [str(i) for i in range(len(texts))], "source": "bench", "text": texts, "meta": None},
                         schema_overrides={"meta": pl.String})  # fmt: skip
    mb = frame["text"].str.len_bytes().sum() / 1e6
    print(f"\n  each family's own time on the same {len(texts)} documents (one thread; best of {rounds}, A B A B);")
    print(
        "  MB/CPU-s: megabytes per second of this process's CPU time, which other work on the machine does not inflate"
    )
    print(f"  {'family':<20} {'winnow s':>9} {'datatrove s':>12} {'ratio':>7} {'winnow MB/s':>12} {'MB/CPU-s':>9}")
    for name, ours, peer in filter_families():
        run_winnow(ours, batch.head(50))
        run_datatrove(peer, texts[:50])
        tw, td, cpu = [], [], []
        for _ in range(rounds):
            c0 = time.process_time()
            tw.append(run_winnow(ours, batch)[0])
            cpu.append(time.process_time() - c0)
            td.append(run_datatrove(peer, texts)[0])
        w, d = min(tw), min(td)
        print(f"  {name:<20} {w:>9.2f} {d:>12.1f} {d / w:>6.1f}x {mb / w:>12.1f} {mb / min(cpu):>9.1f}", flush=True)


# -- main -----------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default="jobs,filters,minhash", help="comma-separated: jobs, filters, minhash")
    ap.add_argument("--workers", default="1,2", help="worker counts for the jobs and the dedup job")
    ap.add_argument("--rounds", type=int, default=2, help="A B pairs per comparison")
    ap.add_argument("--mb", type=float, default=85.0, help="corpus size (built once under bench/_data/floor)")
    ap.add_argument("--only", help="jobs section: only these cases (comma-separated names as printed, or 'demo')")
    ap.add_argument("--filter-docs", type=int, help="filters section: the first this many documents only")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child)
    global floor_corpus
    import floor_corpus

    print(machine())
    corpus = floor_corpus.ensure(DATA, args.mb)
    import polars as pl

    frame = floor_corpus.texts(corpus)
    print(floor_corpus.describe(frame, f"corpus {corpus.relative_to(ROOT)}"))
    samples = pl.concat(
        [pl.read_parquet(p, columns=["text"]) for p in sorted((ROOT / "data_samples" / "code").glob("*.parquet"))]
    )
    print(floor_corpus.describe(samples, "for scale, data_samples/code"))
    sections = args.sections.split(",")
    workers = [int(w) for w in args.workers.split(",")]
    if "jobs" in sections:
        jobs_section(corpus, workers, args.rounds, args.only.split(",") if args.only else None)
    if "filters" in sections:
        filters_section(corpus, args.rounds, args.filter_docs)
    if "minhash" in sections:
        import minhash_floor

        minhash_floor.section(corpus, workers, args.rounds)
    print(f"\nend: {load()}")


if __name__ == "__main__":
    main()
