"""How curation cost grows with the corpus: the demo's stages on 1M, 3M and 10M documents.

    python bench/scale.py                                  # 1M, 3M and 10M documents
    python bench/scale.py --sizes 100000,300000 --peer-docs 20000
    python bench/scale.py --sizes 1000000 --peer-docs 1000000     # the peer in full on 1M (hours)

Corpus: built from the four sample sources in ``data_samples/`` (read through winnow's own
readers): every document is 6-24 real lines of one source, drawn at random from all of that
source's lines (so two documents share hardly a 5-gram by chance), and 8% of the documents are
near-duplicates of an earlier one — a line deleted, inserted or replaced, words swapped, a number
changed, a sign-off appended — and 2% exact copies, as crawls have them. Each source is a few
large JSONL files, so ``[job] task_bytes`` splits them into byte ranges. The corpus is cached
under ``bench/_data/scale/<n>/``.

Job: ``pipelines/demo.toml``'s stages as shipped (clean, four filters, exact and MinHash
dedup, scores, split, mix, order) on that corpus, run as ``winnow curate`` in a subprocess
with the demo's 2 workers, writing Parquet and token shards (``--formats``; the demo's WebDataset
copy adds 2.4 KB per document, which at 10M documents would not fit this machine's disk). Printed
per size: docs/s over the wall time, peak RSS of the whole process tree (the sum over the driver
and its workers, sampled from ``/proc`` every 0.2 s), the peak bytes per document of the ``_work``
folder while the job ran (the spill; sampled every second), the output's bytes per document, the
exact and MinHash dedup removals against the planted copies, the MinHash plan's seconds and partitions
(from the job's ``-v`` log); then the ratio of the largest to the smallest size
in time (near-linear: ≤ 1.1x the ratio of sizes) and in peak RSS (flat: within the budget).

Peer (``--peer``, default datatrove if it imports): its MinHash pipeline (signatures, buckets,
clusters, filter; ``bench/dedup.py --child datatrove``) against winnow's ``dedup.minhash`` alone
on the first ``--peer-docs`` documents of the smallest corpus, both in subprocesses, in the same
run. datatrove runs ~100x slower than winnow here (``bench/dedup.py``), so the default
``--peer-docs`` is 50,000, and the line printed says how many documents both ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "bench" / "_data" / "scale"
PER_FILE = 1_000_000  # documents per JSONL file and source (large files: task_bytes splits them)
NEAR, EXACT = 0.08, 0.02


# -- corpus -------------------------------------------------------------------------------------------
def sample_lines() -> dict[str, list[str]]:
    """Every non-blank line of each sample source, read as the demo job reads them."""
    from winnow.curate.readers import plan_read_tasks, read_task
    from winnow.pipelines.jobfile import load_job

    job = load_job(ROOT / "pipelines" / "demo.toml")
    pools: dict[str, list[str]] = {}
    for task in plan_read_tasks(job.inputs):
        cfg = job.inputs[task.input_index]
        for batch in read_task(cfg, task, 4096):
            for text in batch.rows["text"].to_list():
                pools.setdefault(cfg.source, []).extend(line for line in text.splitlines() if len(line.split()) >= 3)
    return {s: sorted(set(lines)) for s, lines in pools.items()}


_NUMBER = re.compile(r"\d+")


def mutate(text: str, rng: np.random.Generator, pool: list[str]) -> str:
    """An edit of a document as crawls repeat them: one or two small changes, most of the text kept."""
    lines = text.split("\n")
    for _ in range(int(rng.integers(1, 3))):
        op = int(rng.integers(0, 6))
        at = int(rng.integers(0, len(lines)))
        if op == 0 and len(lines) > 6:
            del lines[at]
        elif op == 1:
            lines.insert(at, pool[int(rng.integers(0, len(pool)))])
        elif op == 2:
            words = lines[at].split(" ")
            if len(words) > 3:
                i = int(rng.integers(0, len(words) - 1))
                words[i], words[i + 1] = words[i + 1], words[i]
                lines[at] = " ".join(words)
        elif op == 3:
            lines[at] = _NUMBER.sub(lambda m: str(int(m.group()) + 1), lines[at], count=1) + (
                "" if _NUMBER.search(lines[at]) else " (2)"
            )
        elif op == 4:
            lines.append(f"-- updated {int(rng.integers(2000, 2026))}-{int(rng.integers(1, 13)):02d}")
        else:
            lines[at] = lines[at].upper() if len(lines[at]) < 40 else lines[at][: len(lines[at]) // 2]
    return "\n".join(lines)


def build(n_docs: int, folder: Path, seed: int = 0) -> dict:
    """Write the corpus (cached): per source, JSONL files of up to PER_FILE documents; returns its summary."""
    summary_file = folder / "corpus.json"
    if summary_file.exists():
        return json.loads(summary_file.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    pools = sample_lines()
    sources = sorted(pools)
    rng = np.random.default_rng(seed)
    per_source = [n_docs // len(sources) + (i < n_docs % len(sources)) for i in range(len(sources))]
    planted = 0
    t0 = time.perf_counter()
    for source, count in zip(sources, per_source):
        pool = pools[source]
        recent: list[str] = []  # documents a later one may copy (a window, as crawls repeat recent pages)
        for part, start in enumerate(range(0, count, PER_FILE)):
            n = min(PER_FILE, count - start)
            lengths = rng.integers(6, 25, size=n)
            picks = rng.integers(0, len(pool), size=int(lengths.sum()))
            kinds = rng.random(n)
            ends = np.cumsum(lengths)
            with open(folder / f"{source}-{part:03d}.jsonl", "wb") as fh:
                for i in range(n):
                    if kinds[i] < NEAR + EXACT and recent:
                        original = recent[int(rng.integers(0, len(recent)))]
                        text = original if kinds[i] < EXACT else mutate(original, rng, pool)
                        planted += 1
                    else:
                        text = "\n".join(pool[j] for j in picks[ends[i] - lengths[i] : ends[i]])
                        if len(recent) < 5000:
                            recent.append(text)
                        else:
                            recent[int(rng.integers(0, 5000))] = text
                    fh.write(orjson.dumps({"id": f"{source}-{start + i:09d}", "text": text}) + b"\n")
    summary = {
        "docs": n_docs,
        "planted_copies": planted,
        "bytes": sum(p.stat().st_size for p in folder.glob("*.jsonl")),
        "files": len(list(folder.glob("*.jsonl"))),
        "build_seconds": round(time.perf_counter() - t0, 1),
    }
    summary_file.write_text(json.dumps(summary))
    return summary


# -- measuring a process tree -------------------------------------------------------------------------
def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def run_measured(cmd: list[str], *, env: dict | None = None, watch: Path | None = None) -> dict:
    """Run ``cmd``; wall seconds, the peak of its process tree's summed RSS and (``watch``) of a folder's bytes."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak, peak_disk = [0], [0]

    def sample() -> None:
        tick = 0
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            if watch is not None and tick % 5 == 0:  # a folder walk each second
                peak_disk[0] = max(peak_disk[0], folder_bytes(watch))
            tick += 1
            time.sleep(0.2)

    t0 = time.perf_counter()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    seconds = time.perf_counter() - t0
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-4000:]}")
    return {"seconds": seconds, "peak_rss": peak[0], "peak_disk": peak_disk[0], "stdout": out, "stderr": err}


def folder_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when missing; files removed while it walks are skipped)."""
    total = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


# -- the runs -----------------------------------------------------------------------------------------
def demo_job(
    corpus: Path,
    out: Path,
    *,
    stages_only: str | None = None,
    memory_gb: float | None = None,
    formats: list[str] | None = None,
) -> Path:
    """``pipelines/demo.toml`` with its inputs replaced by the corpus (or only ``stages_only``'s stage), and
    its shard ``formats`` replaced when given."""
    text = (ROOT / "pipelines" / "demo.toml").read_text()
    head, _, rest = text.partition("[[inputs]]")
    stages = "[[stages]]" + rest.split("[[stages]]", 1)[1]
    stages = stages.split("\n[train", 1)[0]
    if stages_only:
        stages = f'[[stages]]\nkind = "{stages_only}"\n\n[output]\nformats = ["parquet"]\n'
    head = re.sub(r'output = ".*"', f'output = "{out}"', head)
    if memory_gb:
        head = head.replace("[job]\n", f"[job]\nmemory_gb = {memory_gb}\n", 1)
    if formats:
        stages = re.sub(r"\nformats = \[[^\]]*\]", "\nformats = " + json.dumps(formats), stages, count=1)
    sources = sorted({p.name.rsplit("-", 1)[0] for p in corpus.glob("*.jsonl")})
    inputs = "".join(f'[[inputs]]\nsource = "{s}"\npath = "{corpus}/{s}-*.jsonl"\n\n' for s in sources)
    job = out.parent / f"{out.name}.toml"
    job.write_text(head + inputs + stages)
    return job


def curate(job: Path, out: Path) -> dict:
    """Run the job; its time, peak RSS, peak bytes of its work folder (the spill), and the output's bytes.
    The output (this bench's own folder) is deleted afterwards: at 10M documents it would fill the disk."""
    shutil.rmtree(out, ignore_errors=True)
    measured = run_measured(
        [sys.executable, "-m", "winnow.pipelines.cli", "-v", "curate", str(job)], watch=out / "_work"
    )
    manifest = json.loads((out / "manifest.json").read_text())
    measured.update(minhash_plan(measured["stderr"]))
    measured["spill"] = measured["peak_disk"]
    measured["output_bytes"] = folder_bytes(out)
    measured["dedup_removed"] = sum(s["rows_rejected"] for s in manifest["stages"] if s["kind"].startswith("dedup."))
    measured["rows_out"] = manifest["totals"].get("rows_written")
    shutil.rmtree(out, ignore_errors=True)
    return measured


def minhash_plan(log: str) -> dict:
    """The MinHash plan's seconds and partitions, from the job's log (``winnow -v``: ``planned <stage> in <s> s``)."""
    seconds = re.search(r"planned \S*dedup\.minhash in ([\d.]+) s", log)
    parts = re.search(r"dedup\.minhash: \d+ candidate pairs, \d+ edges, partitions (\{.*\})", log)
    return {
        "minhash_plan_s": float(seconds.group(1)) if seconds else None,
        "minhash_partitions": parts.group(1).replace("'", "") if parts else "?",
    }


def subset(corpus: Path, n_docs: int) -> Path:
    """The first ``n_docs`` documents of the corpus, spread over its sources, as one folder."""
    target = DATA / f"subset-{n_docs}"
    if (target / "done").exists():
        return target
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    files = sorted(corpus.glob("*-000.jsonl"))
    for f in files:
        with open(f, "rb") as src, open(target / f.name, "wb") as dst:
            for _, line in zip(range(n_docs // len(files)), src):
                dst.write(line)
    (target / "done").write_text("")
    return target


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000000,3000000,10000000")
    ap.add_argument("--peer", default="datatrove", choices=["datatrove", "none"])
    ap.add_argument("--peer-docs", type=int, default=50_000)
    ap.add_argument("--memory-gb", type=float, default=None, help="[job] memory_gb for the global phases")
    ap.add_argument(
        "--formats",
        default="parquet,tokens",
        help="[output] formats (the demo's also has webdataset: 2.4 KB of tar headers and text per "
        "document, which at 10M documents does not fit this machine's disk)",
    )
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    formats = args.formats.split(",")
    print(
        f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; shards: {', '.join(formats)}",
        flush=True,
    )
    rows = []
    for n in sizes:
        corpus = DATA / f"{n}"
        summary = build(n, corpus)
        print(
            f"corpus {n:,} docs: {summary['bytes'] / 2**30:.2f} GiB in {summary['files']} files, "
            f"{summary['planted_copies']:,} planted copies (built in {summary['build_seconds']} s)",
            flush=True,
        )
        out = DATA / "work" / f"demo-{n}"
        out.parent.mkdir(parents=True, exist_ok=True)
        r = curate(demo_job(corpus, out, memory_gb=args.memory_gb, formats=formats), out)
        r.update(docs=n, planted=summary["planted_copies"])
        rows.append(r)
        print(
            f"  {n:>11,} docs  {n / r['seconds']:8,.0f} docs/s  {r['seconds']:8.1f} s  peak RSS (tree) "
            f"{r['peak_rss'] / 2**20:7,.0f} MiB  spill (peak) {r['spill'] / n:6,.0f} B/doc  output {r['output_bytes'] / n:6,.0f} B/doc  "
            f"dedup removed {r['dedup_removed']:,} (planted {r['planted']:,}; some copies fall to a filter first)  "
            f"MinHash plan {r['minhash_plan_s']} s, partitions {r['minhash_partitions']}  "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(
            f"{b['docs']:,} vs {a['docs']:,} docs ({b['docs'] / a['docs']:.0f}x): time {b['seconds'] / a['seconds']:.2f}x "
            f"(near-linear target <= {1.1 * b['docs'] / a['docs']:.1f}x), peak RSS {b['peak_rss'] / a['peak_rss']:.2f}x"
        )
    if args.peer != "none":
        peer_vs_winnow(DATA / f"{sizes[0]}", min(args.peer_docs, sizes[0]))


def peer_vs_winnow(corpus: Path, n_docs: int) -> None:
    try:
        import datatrove  # noqa: F401
    except ImportError:
        print("peer: datatrove is not installed (pip install 'datatrove[processing]' spacy); skipped")
        return
    data = subset(corpus, n_docs) if n_docs < json.loads((corpus / "corpus.json").read_text())["docs"] else corpus
    work = DATA / "work" / "peer"
    results = {}
    for system in ("winnow", "datatrove"):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if system == "winnow":
            out = work / "out"
            r = run_measured(
                [
                    sys.executable,
                    "-m",
                    "winnow.pipelines.cli",
                    "-q",
                    "curate",
                    str(demo_job(data, out, stages_only="dedup.minhash")),
                ]
            )
        else:
            r = run_measured(
                [
                    sys.executable,
                    str(ROOT / "bench" / "dedup.py"),
                    "--child",
                    "datatrove",
                    "--data",
                    str(data),
                    "--work",
                    str(work),
                ]
            )
        results[system] = r
        print(
            f"  MinHash only, {system:>9}: {n_docs:,} docs in {r['seconds']:.1f} s ({n_docs / r['seconds']:,.0f} docs/s), "
            f"peak RSS (tree) {r['peak_rss'] / 2**20:,.0f} MiB",
            flush=True,
        )
    print(
        f"MinHash on {n_docs:,} documents of this corpus: winnow {results['datatrove']['seconds'] / results['winnow']['seconds']:.1f}x "
        f"datatrove (same machine, same run)"
    )


if __name__ == "__main__":
    main()
