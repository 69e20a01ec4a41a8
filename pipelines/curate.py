"""``winnow curate JOB.toml``: run a curation job and print what happened to the rows."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("curate", help="run a job's curation stages and write shards")
    p.add_argument("job", type=Path, help="the job file (TOML)")
    p.add_argument("--output", help="output folder or fsspec URL, e.g. s3://bucket/job (overrides [job] output)")
    p.add_argument("--workers", type=int, help="local worker processes (overrides [job] workers)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the outputs of another job, or of a finished run "
        "made with another configuration, in the output folder (refused otherwise)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from winnow.curate.pipeline import run_job  # here, not at import: `winnow curate --help` stays instant
    from winnow.pipelines.jobfile import load_job

    job = load_job(args.job, output=args.output, workers=args.workers)
    manifest = run_job(job, progress=not args.quiet, overwrite=args.overwrite)
    print_summary(manifest, job.job.output)
    return 0


def print_summary(manifest: dict[str, Any], output: str) -> None:
    """What ``winnow curate`` (and ``winnow run``) prints after curating: rows per stage, tokens, where things are."""
    print(summary_table(manifest))
    if "tokens" in manifest:
        t = manifest["tokens"]
        rate = f", {t['tokens_per_second'] / 1e6:.1f}M tokens/s per worker" if t["tokens_per_second"] else ""
        print(f"\ntokens:   {t['total']} ({t['tokenizer']['kind']}, {t['dtype']}){rate}")
    out = output.rstrip("/")  # a folder or a URL (s3://...)
    if not (manifest.get("totals") or {}).get("rows_written"):
        emptied = next((st for st in manifest.get("stages", []) if st.get("rows_in") and not st.get("rows_out")), None)
        where = f" after {emptied['id']} rejected the last of them" if emptied else ""
        print(f"\nwarning: no row reached the shards{where}: check its settings, and the reasons in {out}/rejects")
    written = bool((manifest.get("totals") or {}).get("rows_written"))
    print(f"\nshards:   {out}/shards" if written else "\nshards:   none written")
    print(f"rejects:  {out}/rejects")
    print(f"manifest: {out}/manifest.json")
    if "://" in out or (Path(out) / "README.md").is_file():
        from winnow.curate.card import is_card  # the summary's one question about the card

        ours = "://" in out or is_card(Path(out) / "README.md")
        print(
            f"card:     {out}/README.md (dataset card: sources, stages, features)"
            if ours
            else f"card:     not written: {out}/README.md is not winnow's, and is left as it is"
        )


def summary_table(manifest: dict[str, Any]) -> str:
    """Rows per stage and rejects by reason, as a plain-text table."""
    lines = [f"{'stage':<28}{'in':>10}{'out':>10}{'rejected':>10}{'seconds':>9}"]
    for st in manifest["stages"]:
        lines.append(
            f"{st['id']:<28}{st['rows_in']:>10}{st['rows_out']:>10}{st['rows_rejected']:>10}{st['seconds']:>9.2f}"
        )
        for reason, n in st["rejected"].items():
            lines.append(f"    {reason:<44}{n:>10}")
        removed = (st.get("counters") or {}).get("lines_removed")  # clean's boilerplate: text the kept rows lost
        if isinstance(removed, dict) and any(removed.values()):
            per = ", ".join(f"{s} {int(n)}" for s, n in sorted(removed.items()) if n)
            lines.append(f"    boilerplate lines removed: {per}")
    t = manifest["totals"]
    lines.append(
        f"total: {t['rows_read']} read, {t['rows_written']} written ({t['repeats']} repeats), "
        f"{t['rows_rejected']} rejected, {t['seconds']:.1f} s"
    )
    skipped = manifest.get("skipped_files") or []
    if skipped:  # on_error = "skip": what was not read at all, so no row of it is counted above
        lines.append(f"skipped (on_error = 'skip'): {len(skipped)} input(s) not read; manifest.json skipped_files")
        lines += [f"    {s['task']}: {s['error']}" for s in skipped[:5]]
        if len(skipped) > 5:
            lines.append(f"    ... and {len(skipped) - 5} more")
    return "\n".join(lines)
