"""filter.c4 and filter.fineweb: page rules reject by name, line rules remove lines."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from winnow.curate.stages.base import StageContext
from winnow.curate.stages.filters.c4 import C4Config, C4Filter
from winnow.curate.stages.filters.fineweb import FineWebConfig, FineWebFilter

PROSE = "\n".join(
    [
        "Rivers carve deep valleys over millions of years.",
        "Bakers knead their dough well before dawn.",
        "Comets trail bright dust when they near the sun.",
        "Old maps show coastlines that have since moved.",
        "Violinists tune every string before the concert.",
        "Glaciers store most of the planet's fresh water.",
    ]
)


def run(cls, cfg, text: str):
    ctx = StageContext(stage_id="t", job_name="t", output_dir=Path("."), plan_dir=Path("."), sources=("s",))
    batch = pl.DataFrame(
        {"id": ["d"], "source": ["s"], "text": [text], "meta": [None]}, schema_overrides={"meta": pl.String}
    )
    return cls(cfg, ctx).apply(batch)


def reason(out) -> str | None:
    return out.rejected["reason"][0] if out.rejected.height else None


def test_c4_prose_passes_unchanged():
    out = run(C4Filter, C4Config(), PROSE)
    assert reason(out) is None and out.kept["text"][0] == PROSE


@pytest.mark.parametrize(
    "rule, text, off",
    [
        ("lorem_ipsum", PROSE + "\nLorem ipsum dolor sit amet, consectetur.", {"reject_lorem_ipsum": False}),
        ("curly_bracket", PROSE + "\nThe set {a, b} has two members.", {"reject_curly_bracket": False}),
        ("min_sentences", "\n".join(PROSE.splitlines()[:4]), {"min_sentences": None}),
    ],
)
def test_c4_page_rules(rule, text, off):
    assert reason(run(C4Filter, C4Config(), text)) == f"filter:c4_{rule}"
    assert reason(run(C4Filter, C4Config(**off), text)) is None


@pytest.mark.parametrize(
    "rule, line",
    [
        ("no_terminal_punct", "Home | About us | Contact"),
        ("few_words", "Thanks!"),
        ("long_word", "A " + "x" * 1001 + " word."),
        ("javascript", "Please enable JavaScript to view this site."),
        ("policy", "By using this site you accept our privacy policy."),
    ],
)
def test_c4_line_rules_remove_lines(rule, line):
    out = run(C4Filter, C4Config(), PROSE + "\n" + line)
    assert reason(out) is None
    assert out.kept["text"][0] == PROSE
    assert out.counters == {("c4_lines_removed", rule): 1.0}


def test_c4_citations_removed_and_rejects_keep_original_text():
    out = run(C4Filter, C4Config(), PROSE.replace("years.", "years[1].", 1))
    assert out.kept["text"][0] == PROSE
    rejected = run(C4Filter, C4Config(), "Too short.\nHome")
    assert rejected.rejected["text"][0] == "Too short.\nHome"


@pytest.mark.parametrize("text", ["Home | About us | Contact\nMenu", "\U0001f600 \U0001f603", "\u2211 \u222b \u221a"])
def test_c4_a_page_whose_every_line_is_removed_is_rejected_not_written_empty(text):
    """With min_sentences unset nothing else stops such a page: it was written with empty text."""
    out = run(C4Filter, C4Config(min_sentences=None), text)
    assert reason(out) == "filter:c4_empty" and out.rejected["text"][0] == text
    assert reason(run(C4Filter, C4Config(min_sentences=None, remove_lines=False), text)) is None  # kept as it is


def test_fineweb_prose_passes():
    assert reason(run(FineWebFilter, FineWebConfig(), PROSE)) is None


@pytest.mark.parametrize(
    "rule, text, off",
    [
        ("empty", " \n\t\n", {"reject_empty": False}),
        ("line_punct_ratio", PROSE.replace(".", ""), {"min_line_punct_ratio": None}),
        (
            "short_line_ratio",
            PROSE + "\n" + "\n".join(f"Item {i} is short." for i in range(13)),
            {"max_short_line_ratio": None},
        ),
        ("char_dup_ratio", PROSE + "\n" + PROSE.splitlines()[0], {"max_char_dup_ratio": None}),
        (
            "list_ratio",
            "\n\n\n\n\n".join(f"Entry {w} is a much longer line that ends right here." for w in "abcdefghij"),
            {"max_list_ratio": None},
        ),
    ],
)
def test_fineweb_rules(rule, text, off):
    assert reason(run(FineWebFilter, FineWebConfig(), text)) == f"filter:fineweb_{rule}"
    assert reason(run(FineWebFilter, FineWebConfig(**off), text)) is None
