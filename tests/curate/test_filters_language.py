"""filter.language: languages and scores from a model shipped in the py3langid wheel."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.stages.base import StageContext

pytest.importorskip("py3langid", reason="filter.language needs py3langid: pip install py3langid")

from winnow.curate.stages.filters.language import LanguageConfig, LanguageFilter  # noqa: E402

TEXTS = {
    "en": "The committee will publish its findings after the summer, once every witness has been heard.",
    "de": "Der Ausschuss wird seine Ergebnisse nach dem Sommer veröffentlichen, wenn alle Zeugen gehört wurden.",
    "empty": "",
}


def run(**cfg):
    ctx = StageContext(stage_id="t", job_name="t", output_dir=Path("."), plan_dir=Path("."), sources=("s",))
    batch = pl.DataFrame(
        {"id": list(TEXTS), "source": "s", "text": list(TEXTS.values()), "meta": None},
        schema_overrides={"meta": pl.String},
    )
    return LanguageFilter(LanguageConfig(**cfg), ctx).apply(batch)


def test_english_kept_with_lang_columns():
    out = run()
    assert out.kept["id"].to_list() == ["en"]
    assert out.kept["lang"][0] == "en" and out.kept["lang_score"][0] > 0.9


def test_reasons_name_the_rule():
    reasons = dict(zip(run().rejected["id"], run().rejected["reason"]))
    assert reasons == {"de": "filter:language_not_allowed", "empty": "filter:language_low_score"}


def test_allowed_list_and_disabled_score():
    out = run(languages=["en", "de"], min_score=None)
    assert sorted(out.kept["id"].to_list()) == ["de", "en"]
    assert out.rejected["reason"].to_list() == ["filter:language_not_allowed"]  # the empty text's guess is neither


def test_bad_language_code():
    with pytest.raises(ConfigError, match="languages"):
        LanguageConfig(languages=["english!"])


def test_text_without_a_letter_has_no_language_and_codes_the_model_never_reports_are_refused():
    """The model answered its prior for "", "!!!" or emoji (`sr`, 0.014): kept with languages = ["sr"] and a low
    min_score. "EN" or "eng" never matched: every English document was rejected as not allowed, silently."""
    ctx = StageContext(stage_id="t", job_name="t", output_dir=Path("."), plan_dir=Path("."), sources=("s",))
    texts = ["", "!!! 123", "😀😀", "Одбор ће објавити своје налазе после лета, када сви сведоци буду саслушани."]
    batch = pl.DataFrame(
        {"id": list("abcd"), "source": "s", "text": texts, "meta": None}, schema_overrides={"meta": pl.String}
    )
    out = LanguageFilter(LanguageConfig(languages=["sr"], min_score=0.01), ctx).apply(batch)
    assert out.kept["id"].to_list() == ["d"]
    assert out.rejected.select("lang", "lang_score").rows() == [("", 0.0)] * 3
    for code, hint in (("EN", "'EN' (did you mean 'en'?)"), ("eng", "'eng' (did you mean 'en'?)")):
        with pytest.raises(ConfigError, match=rf"languages names {re.escape(hint)}, which the language model never"):
            LanguageFilter(LanguageConfig(languages=[code, "de"]), ctx)
