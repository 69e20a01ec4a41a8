"""clean: normalization as columns, per-source boilerplate lines, counters and the empty reason."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import polars as pl
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.clean import Clean, CleanConfig


def frame(texts: list[str], sources: list[str] | None = None) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "id": [str(i) for i in range(len(texts))],
            "source": sources or ["s"] * len(texts),
            "text": texts,
            "meta": [None] * len(texts),
        },
        schema_overrides={"meta": pl.String},
    )


def run(tmp_path, batch: pl.DataFrame, **cfg):
    """collect -> plan -> apply, as the runner does it, on one task."""
    ctx = StageContext(stage_id="c", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "plan", sources=("s", "t"))
    stage = Clean(CleanConfig(**cfg), ctx)
    plan = stage.plan(stage.collect(batch).with_columns(pl.lit(0).alias("_task")).lazy())
    return stage.apply(batch, plan.decision), plan


def test_normalization(tmp_path):
    out, _ = run(
        tmp_path, frame(["Cafe\u0301  au\u00a0lait\u200b.\t \r\n\n\n\nNext\x07 para.  "]), boilerplate_min_docs=None
    )
    assert out.kept["text"][0] == "Caf\u00e9 au lait.\n\nNext para."


def test_nfkc_and_indentation(tmp_path):
    out, _ = run(tmp_path, frame(["\ufb01ne\n    indented  line"]), unicode_form="NFKC", boilerplate_min_docs=None)
    assert out.kept["text"][0] == "fine\n    indented line"


@pytest.mark.parametrize("form", ["NFC", "NFKC"])
def test_unicode_form_equals_normalizing_every_row(form):
    """Rows are normalized only where they hold a character the form may change: the result is the whole column's."""
    from winnow.curate.stages.clean import _FIRST_CHANGED_LEAD, _unicode_normalized

    first = {0xCC: 0x300, 0xC2: 0x80}[_FIRST_CHANGED_LEAD[form]]
    below = [chr(c) for c in range(1, first)]
    assert pl.Series(below).str.normalize(form).to_list() == below  # the claim the shortcut rests on
    rng = random.Random(3)
    alphabet = [
        *"abc \n",
        "\u00e9",
        "\u00a0",
        "\u00b2",
        "\u0301",
        "\u1100\u1161",
        "\u11a8",
        "\ufb01",
        "\u212b",
        "\u00c5",
    ]
    alphabet += ["\u0323\u0307", "\u0307\u0323", "\u0345", "\u0958", "\u0301" * 3, "\U0001d15e", "\u2000", "x" * 9]
    texts = ["".join(rng.choices(alphabet, k=rng.randrange(0, 24))) for _ in range(2000)] + [
        None,
        "",
        "e" * 17 + "\u0301",
    ]
    column = pl.Series(texts, dtype=pl.String)
    assert _unicode_normalized(column, form).to_list() == column.str.normalize(form).to_list()
    assert _unicode_normalized(column.slice(7), form).to_list() == column.slice(7).str.normalize(form).to_list()


# Whitespace the regex knows (and some it does not), controls, the invisible characters, letters on both sides.
_LAYOUT_ALPHABET = [
    *" \t\n\r\x0b\x0c\x1c\x1f\x00\x07\x7f\x85\x9f",
    *"\u00a0\u1680\u2003\u2028\u2029\u202f\u205f\u3000\u180e\u200b\u200c\u200d\u2060\ufeff\u00ad",
    *"ab.é中🙂",
    "  ",
    "\n\n\n",
    " \n ",
]


@pytest.mark.parametrize("form", ["NFC", "none"])
def test_compiled_layout_equals_the_expressions(form):
    """The compiled control and whitespace pass gives the expressions' text on adversarial and real text."""
    from pathlib import Path

    from winnow.curate.stages.clean import normalize_text

    rng = random.Random(11)
    texts = ["".join(rng.choices(_LAYOUT_ALPHABET, k=rng.randrange(0, 30))) for _ in range(3000)]
    samples = Path(__file__).resolve().parents[2] / "data_samples"
    for path in sorted(samples.rglob("*.jsonl"))[:4]:
        texts += pl.read_ndjson(path)["text"].cast(pl.String).head(200).to_list()
    column = pl.DataFrame({"text": [*texts, None, "", " ", "\u200b"]}, schema={"text": pl.String})
    for frame in (column, column.slice(5)):
        compiled = frame.select(normalize_text(pl.col("text"), unicode_form=form))["text"]
        expressions = frame.select(normalize_text(pl.col("text"), unicode_form=form, compiled=False))["text"]
        assert compiled.to_list() == expressions.to_list()


def _line_texts(column: pl.Series) -> pl.DataFrame:
    """The lines of ``column`` as polars splits them: ``row``, ``line`` and ``key`` (stripped; null when blank)."""
    lines = pl.DataFrame({"text": column}).select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("row"), pl.col("text").str.split("\n").alias("line")
    )
    lines = lines.explode("line")
    return lines.with_columns(pl.col("line").str.strip_chars().alias("key")).with_columns(
        pl.when(pl.col("key") != "").then(pl.col("key")).alias("key")
    )


def _layout_texts(seed: int, n: int) -> list[str]:
    """Adversarial texts (the layout alphabet, with repeated short lines) and lines of the sample data."""
    from pathlib import Path

    rng = random.Random(seed)
    alphabet = [*_LAYOUT_ALPHABET, "same line", "\n", "\n", "\n\n\n"]
    texts = ["".join(rng.choices(alphabet, k=rng.randrange(0, 30))) for _ in range(n)]
    samples = Path(__file__).resolve().parents[2] / "data_samples"
    for path in sorted(samples.rglob("*.jsonl"))[:4]:
        texts += pl.read_ndjson(path)["text"].cast(pl.String).head(100).to_list()
    return texts


def test_lines_split_and_key_as_polars_does():
    """``_lines`` gives polars' lines (``str.split``) in order, keyed by their stripped text: equal keys, equal hashes."""
    from winnow.curate.dedup.text import string_buffers
    from winnow.curate.stages.clean import _lines
    from winnow.curate.text.codepoints import TABLE

    column = pl.Series(_layout_texts(13, 3000), dtype=pl.String)
    for part in (column, column.slice(9)):
        offsets, data = string_buffers(part)
        row, start, end, h, keyed = _lines(offsets, data, TABLE.cover(offsets, data)[0])
        want = _line_texts(part)
        assert row.tolist() == want["row"].to_list()
        raw = bytes(data)
        assert [raw[a:b].decode() for a, b in zip(start, end)] == want["line"].to_list()
        assert keyed.tolist() == want["key"].is_not_null().to_list()
        keys = want.with_columns(pl.Series("h", h)).filter(pl.col("key").is_not_null())
        assert keys.group_by("key").agg(pl.col("h").n_unique())["h"].max() == 1  # one hash per text
        assert keys.group_by("h").agg(pl.col("key").n_unique())["key"].max() == 1  # and no two texts share one


def test_lines_removed_as_the_expressions_rebuild_them():
    """``_without_lines`` equals joining the kept lines, ``\\n{3,}`` -> two, ``strip_chars``, for any lines dropped."""
    from winnow.curate.dedup.text import string_buffers
    from winnow.curate.stages.clean import _lines, _without_lines
    from winnow.curate.text.codepoints import TABLE

    column = pl.Series(_layout_texts(17, 3000), dtype=pl.String)
    rng = np.random.default_rng(2)
    for part, rate in ((column, 0.3), (column.slice(5), 0.0), (column, 1.0)):
        offsets, data = string_buffers(part)
        props = TABLE.cover(offsets, data)[0]
        row, start, end, _, _ = _lines(offsets, data, props)
        drop = rng.random(len(row)) < rate
        new_offsets, new_data, removed = _without_lines(offsets, data, row, start, end, drop, props)
        want = (
            _line_texts(part)
            .with_columns(pl.Series("drop", drop))
            .group_by("row", maintain_order=True)
            .agg(pl.col("line").filter(~pl.col("drop")).str.join("\n"), pl.col("drop").sum())
            .select(pl.col("line").str.replace_all(r"\n{3,}", "\n\n").str.strip_chars(), "drop")
        )
        got = bytes(new_data)
        assert [got[a:b].decode() for a, b in zip(new_offsets[:-1], new_offsets[1:])] == want["line"].to_list()
        assert removed.tolist() == want["drop"].to_list()


def test_first_line_of_each_hash_per_document():
    from winnow.curate.stages.clean import _first_in_row

    rng = np.random.default_rng(5)
    row = np.sort(rng.integers(0, 60, 5000)).astype(np.uint32)
    h = rng.integers(0, 40, 5000).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # few distinct, colliding slots
    frame = pl.DataFrame({"row": row, "h": h}).with_row_index("i")
    want = frame.unique(["row", "h"], keep="first", maintain_order=True)["i"].to_numpy()
    assert np.flatnonzero(_first_in_row(row, h)).tolist() == want.tolist()


def test_boilerplate_lines_removed_per_source(tmp_path):
    banner = "We use cookies to improve your experience."
    texts = [f"{banner}\nStory number {i} is unique." for i in range(4)] + [
        f"{banner}\nOther source {i}." for i in range(2)
    ]
    out, plan = run(tmp_path, frame(texts, ["s"] * 4 + ["t"] * 2), boilerplate_min_docs=3, boilerplate_min_fraction=0.5)
    kept = dict(zip(out.kept["id"], out.kept["text"]))
    assert kept["0"] == "Story number 0 is unique."
    assert kept["4"].startswith(banner)  # only 2 documents of source t carry it: below min_docs
    assert plan.report["boilerplate_lines"] == {"s": 1, "t": 0}
    assert out.counters[("lines_removed", "s")] == 4 and out.counters[("lines_removed", "t")] == 0
    assert out.counters[("chars_removed", "s")] == 4 * (len(banner) + 1)


def test_empty_after_cleaning_is_rejected_with_reason(tmp_path):
    out, _ = run(tmp_path, frame([" \t\n\u200b ", "kept"]), boilerplate_min_docs=None)
    assert out.rejected["reason"].to_list() == ["clean:empty"]
    assert out.rejected["text"][0] == " \t\n\u200b "  # the reject keeps what was there
    out, _ = run(tmp_path, frame([" \t\n\u200b "]), boilerplate_min_docs=None, drop_empty=False)
    assert out.kept["text"].to_list() == [""]


def test_text_of_format_characters_alone_is_empty(tmp_path):
    bidi = "\u200e\u202e\u2066 \u2069\u200f"  # direction marks and isolates: nothing a reader sees
    out, _ = run(tmp_path, frame([bidi, "\u200fשלום\u200f", "kept"]), boilerplate_min_docs=None)
    assert out.rejected["reason"].to_list() == ["clean:empty"] and out.rejected["text"][0] == bidi
    assert out.kept["text"].to_list() == ["\u200fשלום\u200f", "kept"]  # marks beside text stay: RTL needs them


def test_a_document_of_boilerplate_alone_has_its_own_reason(tmp_path):
    banner = "We use cookies to improve your experience."
    texts = [banner] * 3 + [f"{banner}\nStory {i}." for i in range(3)] + [" \u200b "]
    out, _ = run(tmp_path, frame(texts), boilerplate_min_docs=3, boilerplate_min_fraction=0.5)
    reasons = dict(zip(out.rejected["id"], out.rejected["reason"]))
    assert reasons == {"0": "clean:boilerplate", "1": "clean:boilerplate", "2": "clean:boilerplate", "6": "clean:empty"}
    assert out.kept["text"].to_list() == [f"Story {i}." for i in range(3)]


@pytest.mark.skipif(importlib.util.find_spec("ftfy") is None, reason="ftfy not installed (pip install ftfy)")
def test_fix_mojibake(tmp_path):
    out, _ = run(
        tmp_path, frame(["The Mona Lisa doesnâ€™t have eyebrows."]), fix_mojibake=True, boilerplate_min_docs=None
    )
    assert out.kept["text"][0] == "The Mona Lisa doesn't have eyebrows."


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="unicode_form"):
        CleanConfig(unicode_form="NFD")
    with pytest.raises(ConfigError, match="boilerplate_min_docs"):
        CleanConfig(boilerplate_min_docs=1)


def test_barrier_only_with_boilerplate_removal():
    assert Clean.is_barrier(CleanConfig())
    assert not Clean.is_barrier(CleanConfig(boilerplate_min_docs=None))


def test_mojibake_repair_runs_once_per_row_after_boilerplate_is_gone(tmp_path):
    calls = []

    class FakeFtfy:
        @staticmethod
        def fix_text(text: str) -> str:
            calls.append(text)
            return text.replace("doesnâ€™t", "doesn't")

    banner = "Subscribe to our newsletter"
    texts = [f"{banner}\nDoc {i} doesnâ€™t repeat." for i in range(4)]
    ctx = StageContext(stage_id="c", job_name="t", output_dir=tmp_path, plan_dir=tmp_path / "plan", sources=("s",))
    stage = Clean(CleanConfig(boilerplate_min_docs=3), ctx)
    stage._ftfy = FakeFtfy()
    batch = frame(texts)
    plan = stage.plan(stage.collect(batch).with_columns(pl.lit(0).alias("_task")).lazy())
    out = stage.apply(batch, plan.decision)
    assert out.kept["text"].to_list() == [f"Doc {i} doesn't repeat." for i in range(4)]
    assert calls == [f"Doc {i} doesnâ€™t repeat." for i in range(4)]  # once per row, on the kept lines only


def test_copies_of_one_document_count_once_so_dedup_keeps_one_of_them(tmp_path):
    """Twenty copies of a README were twenty documents: each of its lines was boilerplate, and every copy a
    clean:boilerplate reject, leaving dedup nothing to keep. A line shared by distinct documents still goes."""
    readme = "Reporting bugs\nPlease report bugs to the upstream tracker.\nInclude the version you run."
    banner = "We use cookies to improve your experience."
    texts = [readme] * 20 + [f"{banner}\nStory {i} is unique." for i in range(4)] + [f"{banner}\n{readme}"]
    out, plan = run(tmp_path, frame(texts), boilerplate_min_docs=3, boilerplate_min_fraction=0.0)
    assert out.rejected.is_empty() and out.kept["text"].to_list()[:20] == [readme] * 20
    assert out.kept["text"].to_list()[20:] == [f"Story {i} is unique." for i in range(4)] + [readme]
    assert plan.report["boilerplate_lines"] == {"s": 1} and plan.report["distinct_docs"] == {"s": 6}
    assert plan.report["docs"] == {"s": 25}


def test_the_curation_summary_says_how_many_boilerplate_lines_each_source_lost():
    """The kept rows' removed lines were in manifest.json alone: a source gutted by them looked untouched."""
    from winnow.pipelines.curate import summary_table

    stage = {"id": "01.clean", "rows_in": 3, "rows_out": 3, "rows_rejected": 0, "seconds": 0.1, "rejected": {}}
    manifest = {
        "stages": [{**stage, "counters": {"lines_removed": {"code": 0.0, "web": 42.0}, "chars_removed": {"web": 9.0}}}],
        "totals": {"rows_read": 3, "rows_written": 3, "repeats": 0, "rows_rejected": 0, "seconds": 0.1},
    }
    assert "    boilerplate lines removed: web 42" in summary_table(manifest).splitlines()
