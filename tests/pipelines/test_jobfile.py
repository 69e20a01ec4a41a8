"""Job files: every mistake is an error naming the file, the table and the key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest

from winnow.curate.errors import ConfigError
from winnow.pipelines.cli import main
from winnow.pipelines.jobfile import build_config, load_job

BASE = '[job]\nname = "t"\n[[inputs]]\nsource = "a"\npath = "x.jsonl"\n'


@pytest.mark.parametrize(
    "body,message",
    [
        (
            '[[stages]]\nkind = "filter.length"\nmin_wrods = 3\n',
            r"t\.toml \[\[stages\]\] #1 \(filter\.length\): unknown key 'min_wrods' \(did you mean 'min_words'\?\)",
        ),
        (
            '[[stages]]\nkind = "filter.lenght"\n',
            r"unknown stage kind 'filter\.lenght' \(did you mean 'filter\.length'\?\)",
        ),
        ("[[stages]]\nmin_words = 3\n", r"\[\[stages\]\] #1: missing required key 'kind'"),
        ('[[stages]]\nkind = "filter.length"\nmin_words = "3"\n', r"key 'min_words': .*'3'"),
        (
            '[[stages]]\nkind = "filter.length"\nmin_chars = 9\nmax_chars = 2\n',
            r"min_chars \(9\) is greater than max_chars \(2\)",
        ),
        (
            '[output]\nformats = ["csv"]\n',
            r"\[output\]: output.formats = \['csv'\] is invalid; allowed: a non-empty list",
        ),
        ("[outptu]\n", r"unknown table \[outptu\]"),
        (
            "[report]\ndiagnose = true\n",
            r"unknown table \[report\]; allowed: job, inputs, stages, output, train, ablate",
        ),
        (
            '[[stages]]\nkind = "filter.gopher_repetition"\nmax_top_ngram_char_frac = {"02" = 0.2}\n',
            r"max_top_ngram_char_frac key '02' is not an n-gram size; allowed: 2, 3, 4",
        ),
        (
            '[output]\nformats = ["parquet"]\n[output.tokens]\ntokenizer = "byte"\n',
            r"\[output\.tokens\] is set, but \[output\] formats = \['parquet'\] writes no token shards",
        ),
    ],
)
def test_bad_job_files_name_file_table_and_key(tmp_path, body, message):
    path = tmp_path / "t.toml"
    path.write_text(BASE + body)
    with pytest.raises(ConfigError, match=message):
        load_job(path)


def test_bad_types_in_job_and_inputs(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('[job]\nname = "t"\nworkers = "2"\n[[inputs]]\nsource = "a"\npath = "x"\n')
    with pytest.raises(ConfigError, match=r"\[job\] key 'workers': expected an integer"):
        load_job(path)
    path.write_text('[job]\nname = "t"\n[[inputs]]\nsource = "a"\nsource_field = "s"\npath = "x"\n')
    with pytest.raises(
        ConfigError, match=r"\[\[inputs\]\] #1: inputs.source / inputs.source_field: give exactly one of source"
    ):
        load_job(path)


def test_a_file_url_output_is_the_local_folder_it_names(tmp_path):
    """Read as a path, file:///a was a folder "file:" in the current one."""
    path = tmp_path / "t.toml"
    path.write_text(BASE.replace('name = "t"\n', f'name = "t"\noutput = "file://{tmp_path}/out"\n'))
    assert load_job(path).job.output == str(tmp_path / "out")


def test_invalid_toml_names_the_file(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("[job\n")
    with pytest.raises(ConfigError, match="t.toml: not valid TOML"):
        load_job(path)


@dataclass(kw_only=True, slots=True)
class Inner:
    depth: int = 2


@dataclass(kw_only=True, slots=True)
class Outer:
    mode: Literal["a", "b"] = "a"
    rate: float = 0.1
    weights: dict[str, float] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)
    limit: int | None = None


def test_build_config_handles_nested_tables_and_containers():
    cfg = build_config(
        Outer, {"mode": "b", "rate": 1, "weights": {"x": 2}, "names": ["p"], "inner": {"depth": 5}}, "j [train]"
    )
    assert cfg == Outer(mode="b", rate=1.0, weights={"x": 2.0}, names=["p"], inner=Inner(depth=5))
    with pytest.raises(ConfigError, match=r"j \[train\] key 'inner': unknown key 'dpeth'"):
        build_config(Outer, {"inner": {"dpeth": 1}}, "j [train]")
    with pytest.raises(ConfigError, match=r"key 'weights'\.x: expected a number"):
        build_config(Outer, {"weights": {"x": "heavy"}}, "j")
    with pytest.raises(ConfigError, match=r"'c' is not one of \['a', 'b'\]"):
        build_config(Outer, {"mode": "c"}, "j")


def test_cli_reports_config_errors_with_exit_code_2(tmp_path, capsys):
    path = tmp_path / "t.toml"
    path.write_text(BASE + '[[stages]]\nkind = "nope"\n')
    assert main(["curate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "winnow curate: error:" in err and "unknown stage kind 'nope'" in err and "t.toml" in err


@pytest.mark.parametrize(
    "job,stage,message",
    [
        ("workers = 0\n", "", r"t\.toml \[job\]: job\.workers = 0 is invalid; allowed: an integer >= 1"),
        (
            "",
            '[[stages]]\nkind = "order"\nwindow = 0\n',
            r"\[\[stages\]\] #1 \(order\): order\.window = 0 is invalid; allowed: >= 1",
        ),
        (
            "",
            '[[stages]]\nkind = "clean"\nboilerplate_min_fraction = 2.0\n',
            r"clean\.boilerplate_min_fraction = 2\.0 is invalid; allowed: in \[0, 1\]",
        ),
    ],
)
def test_curation_config_errors_carry_the_dotted_key(tmp_path, job, stage, message):
    path = tmp_path / "t.toml"
    path.write_text(f'[job]\nname = "t"\n{job}[[inputs]]\nsource = "a"\npath = "x.jsonl"\n{stage}')
    with pytest.raises(ConfigError, match=message):
        load_job(path)


def _stages(*kinds: str) -> str:
    return "".join(f'[[stages]]\nkind = "{k}"\n' for k in kinds)


@pytest.mark.parametrize(
    "kinds,message",
    [
        (("mix", "split"), r"#2 \(split\) comes after .*#1 \(mix\): move the split before it"),
        (("order", "split"), r"#2 \(split\) comes after .*#1 \(order\): move the split before it"),
        (("order", "mix"), r"#2 \(mix\) comes after .*#1 \(order\): order must be the last stage"),
        (("order", "score.heuristic"), r"#2 \(score\.heuristic\) comes after .*order must be the last stage"),
        (("mix", "dedup.exact"), r"#2 \(dedup\.exact\) comes after .*#1 \(mix\): move it before the mix"),
        (("mix", "filter.length"), r"#2 \(filter\.length\) comes after .*#1 \(mix\): move it before the mix"),
        (("mix", "mix"), r"#2 \(mix\): a job has one mix stage"),
        (("order", "order"), r"#2 \(order\): a job has one order stage"),
        (("split", "split"), r"#2 \(split\): a job has one split stage"),
    ],
)
def test_stages_that_arrange_the_whole_job_come_in_their_order(tmp_path, kinds, message):
    """split, mix and order run in that order, once each, and nothing after mix drops rows: each of these ran
    every phase and then failed (order's ranks), or finished with held-out copies and wrong shares (mix, split)."""
    path = tmp_path / "t.toml"
    path.write_text(BASE + _stages(*kinds))
    with pytest.raises(ConfigError, match=message):
        load_job(path)
    path.write_text(BASE + _stages("clean", "dedup.exact", "split", "mix", "score.difficulty", "order"))
    load_job(path)  # the usual order, a score between mix and order included (the one order's default reads)
    path.write_text(BASE + _stages("mix", "score.heuristic") + "min_quality = 0.5\n")  # it rejects rows: the mix's
    with pytest.raises(ConfigError, match=r"#2 \(score\.heuristic\) comes after .*#1 \(mix\): move it before the mix"):
        load_job(path)  # shares would be of other rows than the shards hold


def test_false_turns_off_an_optional_setting_toml_cannot_write_as_null():
    """`boilerplate_min_docs` ("None: off") and each Gopher or FineWeb rule could not be turned off from a job file."""
    from winnow.curate.stages.clean import CleanConfig
    from winnow.curate.stages.filters.gopher import GopherQualityConfig

    assert build_config(CleanConfig, {"boilerplate_min_docs": False}, "t").boilerplate_min_docs is None
    rules = build_config(GopherQualityConfig, {"min_stop_words": False, "max_words": False}, "t")
    assert rules.min_stop_words is None and rules.max_words is None and rules.min_words == 50
    with pytest.raises(ConfigError, match="expected an integer, got True"):
        build_config(CleanConfig, {"boilerplate_min_docs": True}, "t")

    @dataclass
    class Flags:
        strict: bool | None = True  # a bool setting: false is its value, not "off"
        batches: int | None = None  # None is the default (all): false is not a value of it

    assert build_config(Flags, {"strict": False}, "t").strict is False
    with pytest.raises(ConfigError, match="key 'batches': expected an integer, got False"):
        build_config(Flags, {"batches": False}, "t")


def test_a_value_of_one_alternatives_shape_gets_that_alternatives_reason_alone(tmp_path):
    """`shards` (a folder, or a list of tables) given a list whose weights are all 0 led with "expected str, got
    [...]", the whole list repeated, before the reason."""
    from winnow.curate.errors import ConfigError
    from winnow.pipelines.train import load_train_config

    path = tmp_path / "t.toml"
    path.write_text('[train]\nsteps = 2\n[[train.shards]]\npath = "x"\nsources = { a = 0.0, b = 0.0 }\n')
    with pytest.raises(ConfigError) as err:
        load_train_config(path)
    assert "one of them > 0" in str(err.value) and "expected str" not in str(err.value)


def test_two_stages_writing_one_column_on_the_same_rows_are_refused(tmp_path):
    """score.heuristic and score.classifier both write `quality` by default: the second replaced the first's
    scores without a word. Scoped to different sources, each writes its own rows."""
    path = tmp_path / "t.toml"
    two = BASE + '[[inputs]]\nsource = "b"\npath = "y.jsonl"\n' + _stages("score.heuristic", "score.heuristic")
    path.write_text(two + 'column = "quality"\n')
    with pytest.raises(ConfigError, match=r"#2 \(score\.heuristic\) writes column = 'quality', as \[\[stages\]\] #1"):
        load_job(path)
    path.write_text(two.replace('kind = "score.heuristic"\n', 'kind = "score.heuristic"\nsources = ["a"]\n', 1)
                    + 'sources = ["b"]\n')  # fmt: skip
    load_job(path)


def test_sources_empty_is_refused_as_a_stage_that_would_do_nothing(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text(BASE + _stages("filter.length") + "sources = []\n")
    with pytest.raises(ConfigError, match=r"#1 \(filter\.length\) key 'sources' = \[\] scopes the stage to no source"):
        load_job(path)


def test_a_mix_budget_in_other_tokens_than_the_token_shards_is_warned(tmp_path, caplog):
    """total_tokens counted as bytes / 4 while [output.tokens] wrote byte tokens: the shards held ~4x the budget."""
    path = tmp_path / "t.toml"
    tokens = '[output]\nformats = ["parquet", "tokens"]\n'
    for mix, warned in (("total_tokens = 1000\n", True), ("total_tokens = 1000\nbytes_per_token = 1\n", False)):
        path.write_text(BASE + _stages("mix") + mix + tokens)
        caplog.clear()
        with caplog.at_level("WARNING", logger="winnow.pipelines.jobfile"):
            load_job(path)
        assert ("set bytes_per_token = 1 in the mix to budget in the shards' tokens" in caplog.text) is warned
