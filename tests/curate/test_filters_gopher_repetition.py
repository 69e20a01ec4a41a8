"""filter.gopher_repetition: each rule on a document built to repeat in exactly that way."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext
from winnow.curate.stages.filters.gopher_repetition import GopherRepetitionConfig, GopherRepetitionFilter

UNIQUE = [
    "Rivers carve valleys over millions of years.",
    "Bakers knead dough before dawn each morning.",
    "Comets trail dust when they near the sun.",
    "Old maps show coastlines that have since moved.",
    "Violinists tune their strings before every concert.",
    "Glaciers store most of the planet's fresh water.",
    "Farmers rotate crops to keep their soil healthy.",
    "Owls hunt silently thanks to soft wing feathers.",
    "Printers once set every letter by hand in metal.",
    "Tides follow the pull of the moon and sun.",
]
LONG = "This long paragraph is repeated verbatim and carries most of the characters of the whole document here."
NO_LINES = {"max_dup_line_frac": None, "max_dup_line_char_frac": None}
NO_NGRAMS = {"max_top_ngram_char_frac": {}, "max_dup_ngram_char_frac": {}}


def run(text: str, **cfg) -> str | None:
    ctx = StageContext(stage_id="t", job_name="t", output_dir=Path("."), plan_dir=Path("."), sources=("s",))
    stage = GopherRepetitionFilter(GopherRepetitionConfig(**cfg), ctx)
    batch = pl.DataFrame(
        {"id": ["d"], "source": ["s"], "text": [text], "meta": [None]}, schema_overrides={"meta": pl.String}
    )
    out = stage.apply(batch)
    return out.rejected["reason"][0] if out.rejected.height else None


def filler(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


CASES = {  # rule -> (document, config that leaves only what the document should trip)
    "dup_para_frac": ("\n\n".join(UNIQUE + ["Ok."] * 7), {**NO_LINES, **NO_NGRAMS}),
    "dup_para_char_frac": ("\n\n".join(UNIQUE[:3] + [LONG, LONG]), {**NO_LINES, **NO_NGRAMS}),
    "dup_line_frac": ("\n".join(UNIQUE + ["Ok."] * 7), NO_NGRAMS),
    "dup_line_char_frac": ("\n".join(UNIQUE[:3] + [LONG, LONG]), NO_NGRAMS),
    "top_2gram_frac": (" ".join(f"alpha beta x{i}" for i in range(30)), {}),
    "top_3gram_frac": (" ".join(f"alpha beta gamma x{i}" for i in range(30)), {"max_top_ngram_char_frac": {"3": 0.18}}),
    "top_4gram_frac": (
        " ".join(f"alpha beta gamma delta x{i}" for i in range(30)),
        {"max_top_ngram_char_frac": {"4": 0.16}},
    ),
    **{
        f"dup_{n}gram_frac": (
            filler(30) + " " + " ".join(["r1 r2 r3 r4 r5 r6 r7 r8 r9 r10"] * 4),
            {"max_top_ngram_char_frac": {}, "max_dup_ngram_char_frac": {str(n): t}},
        )
        for n, t in ((5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10))
    },
}
THRESHOLD_KEY = {
    "dup_para_frac": "max_dup_para_frac",
    "dup_para_char_frac": "max_dup_para_char_frac",
    "dup_line_frac": "max_dup_line_frac",
    "dup_line_char_frac": "max_dup_line_char_frac",
}


def test_varied_prose_passes_defaults():
    assert run("\n\n".join(UNIQUE)) is None


@pytest.mark.parametrize("rule", sorted(CASES))
def test_rule_trips(rule):
    text, cfg = CASES[rule]
    assert run(text, **cfg) == f"filter:gopher_{rule}"
    if rule in THRESHOLD_KEY:
        assert run(text, **{**cfg, THRESHOLD_KEY[rule]: None}) is None
    else:  # n-gram rules: the same document passes once that n-gram size is left out
        assert run(text, **NO_NGRAMS) is None


def test_empty_text_rejected_by_name():
    assert run("") == "filter:gopher_repetition_empty"
    assert run("", reject_empty=False) is None


def test_bad_ngram_key_names_it():
    with pytest.raises(ConfigError, match="max_top_ngram_char_frac key '7'"):
        GopherRepetitionConfig(max_top_ngram_char_frac={"7": 0.1})
