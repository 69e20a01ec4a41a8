"""Job files: TOML tables mapped one-to-one onto config dataclasses.

``build_config`` is the one mapper every component uses (curation stages, the trainer's
nested ``[train.*]`` tables): unknown keys, wrong types and values a config's
``__post_init__`` refuses all become ``ConfigError``s naming the file, the table and the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import os
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from winnow.curate.config import InputConfig, Job, JobSection, OutputConfig, StageSpec
from winnow.curate.errors import ConfigError
from winnow.curate.stages import stage_class
from winnow.curate.wholefile import JOB_FILE_BYTES, read_whole

log = logging.getLogger(__name__)
_TOP_LEVEL = ("job", "inputs", "stages", "output", "train", "ablate")


def build_config(cls: type, table: dict[str, Any], where: str) -> Any:
    """Build dataclass ``cls`` from ``table``; ``where`` is e.g. ``"job.toml [[stages]] #2"``."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = [k for k in table if k not in fields]
    removed = getattr(cls, "REMOVED_KEYS", {})  # keys a config no longer has, with what to write instead
    if unknown and unknown[0] in removed:
        raise ConfigError(f"{where}: {removed[unknown[0]]}")
    if unknown:
        key = unknown[0]
        raise ConfigError(
            f"{where}: unknown key {key!r}{_key_hint(key, fields, where)}; allowed keys: "
            + ", ".join(sorted(f.metadata.get("key", n) for n, f in fields.items()))  # as a job file writes them
        )
    missing = [
        n
        for n, f in fields.items()
        if n not in table and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required key {missing[0]!r}")
    values = {
        k: None if v is False and off_by_false(fields[k], hints[k]) else _coerce(v, hints[k], f"{where} key {k!r}")
        for k, v in table.items()
    }
    for key, value in values.items():
        numbers = value if isinstance(value, list) else [value]
        bad = next((x for x in numbers if isinstance(x, float) and not math.isfinite(x)), None)
        if bad is not None and not (math.isinf(bad) and fields[key].metadata.get("infinite")):
            raise ConfigError(f"{where}: {key} = {value!r} is invalid; allowed: finite numbers (no inf or nan)")
    try:
        return cls(**values)
    except _config_errors() as err:
        raise ConfigError(f"{where}: {err}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from err


def off_by_false(f: dataclasses.Field, tp: Any) -> bool:
    """Whether ``false`` turns field ``f`` off: an optional setting (``X | None``, X not bool) whose default is on
    (not None). TOML has no null; where None is the default (all, auto, every source), false is not a value."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (Union, types.UnionType) else ()
    return type(None) in args and bool not in args and f.default not in (None, dataclasses.MISSING)


def _key_hint(key: str, allowed, where: str) -> str:
    """`` (belongs in [train])`` when another table has the key, else `` (did you mean 'x'?)`` for a near spelling."""
    from winnow.pipelines.config import homes  # the registry of every table; only read on this error path

    found = homes(key, near=_table_of(where))
    if found:
        also = f"; also a key of {', '.join(found[1:3])}" if len(found) > 1 else ""
        return f" (it belongs in {found[0]}{also})"
    close = difflib.get_close_matches(key, allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _table_of(where: str) -> str:
    """``"train"`` of ``"job.toml [train] key 'data'"``, ``"stages"`` of ``"job.toml [[stages]] #2 (clean)"``."""
    found = re.search(r"\[\[?([\w.]+)\]", where)
    return found.group(1) if found else ""


def _config_errors() -> tuple[type[Exception], ...]:
    """Both packages' ConfigError: the trainer's configs raise train's own (it never imports curate)."""
    from winnow.train.errors import ConfigError as TrainConfigError  # no dependencies: always importable

    return (ConfigError, TrainConfigError)


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against type ``tp`` (the supported subset), converting where TOML is looser."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors, shaped = [], []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as err:
                errors.append(str(err))
                if _same_shape(value, arg):
                    shaped.append(str(err))
        if len(errors) == 1 or len(shaped) == 1:  # the one alternative of the value's shape: its own reason
            raise ConfigError((shaped or errors)[0])
        raise ConfigError(f"{where}: {value!r} fits none of: " + "; ".join(e.split(": ", 1)[-1] for e in errors))
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1] or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        _, item = typing.get_args(tp) or (str, Any)
        return {str(k): _coerce(v, item, f"{where}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return build_config(tp, value, where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        if not -(2**63) <= value < 2**63:  # TOML's integers are 64-bit; seeds and sizes reach numba and torch as such
            raise ConfigError(f"{where}: {value} does not fit a 64-bit integer (TOML's integers are 64-bit)")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
        return value
    raise ConfigError(f"{where}: type {_type_name(tp)} is not supported in job files")  # a config-author bug


def _same_shape(value: Any, tp: Any) -> bool:
    """Whether ``value`` has the shape of type ``tp`` (a list, a table, a string, a number), whatever is inside."""
    origin = typing.get_origin(tp) or tp
    if origin in (list, tuple):
        return isinstance(value, list)
    if origin is dict or dataclasses.is_dataclass(tp):
        return isinstance(value, dict)
    if tp in (int, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(tp, type) and isinstance(value, tp)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a job file, translating syntax errors into ``ConfigError``."""
    path = Path(path)
    data = read_whole(str(path), limit=JOB_FILE_BYTES, what="job file", error=ConfigError)
    try:
        return tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))  # an editor's byte-order mark: not TOML
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}); a job file is TOML") from err
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from err


def load_job(path: str | Path, *, output: str | None = None, workers: int | None = None) -> Job:
    """Read a job file into a validated ``Job``; ``output`` and ``workers`` override ``[job]``."""
    raw = read_toml(path)
    return job_from_dict(raw, source_file=str(path), output=output, workers=workers)


def job_from_dict(
    raw: dict[str, Any], *, source_file: str = "<job>", output: str | None = None, workers: int | None = None
) -> Job:
    """Validate a parsed job file (see ``load_job``)."""
    name = Path(source_file).name
    check_top_level(raw, name)
    job_table = dict(raw.get("job", {}))
    if output is not None:
        job_table["output"] = output
    if isinstance(job_table.get("output"), str) and job_table["output"].startswith("~"):
        job_table["output"] = os.path.expanduser(job_table["output"])  # as fsspec reads it: never a folder "~" here
    if workers is not None:
        job_table["workers"] = workers
    job = build_config(JobSection, job_table, f"{name} [job]")
    inputs = raw.get("inputs", [])
    if not inputs:
        raise ConfigError(f"{name}: needs at least one [[inputs]] table")
    input_cfgs = [build_config(InputConfig, t, f"{name} [[inputs]] #{i + 1}") for i, t in enumerate(inputs)]
    stages = []
    for i, table in enumerate(raw.get("stages", [])):
        where = f"{name} [[stages]] #{i + 1}"
        if "kind" not in table:
            raise ConfigError(
                f"{where}: missing required key 'kind' (the stage to run, e.g. kind = \"dedup.minhash\"; "
                f"`winnow config show` lists them)"
            )
        if not isinstance(table["kind"], str):
            raise ConfigError(
                f"{where}: kind = {table['kind']!r} is invalid; allowed: a stage's name as a string, e.g. "
                f'kind = "clean" (`winnow config show` lists them)'
            )
        params = {k: v for k, v in table.items() if k != "kind"}
        cls = stage_class(table["kind"], where=f"{where}: ")
        stages.append(
            StageSpec(kind=table["kind"], config=build_config(cls.Config, params, f"{where} ({table['kind']})"))
        )
    check_source_names(input_cfgs, stages, name)
    check_kept_fields(input_cfgs, stages, name)
    check_stage_order(stages, name)
    check_order_columns(input_cfgs, stages, name)
    out = build_config(OutputConfig, raw.get("output", {}), f"{name} [output]")
    if isinstance(raw.get("output"), dict) and "tokens" in raw["output"] and "tokens" not in out.formats:
        raise ConfigError(
            f"{name} [output.tokens] is set, but [output] formats = {out.formats} writes no token shards, so it would "
            'be ignored; add "tokens" to formats, or remove [output.tokens]'
        )
    check_mix_budget(stages, out, name)
    return Job(job=job, inputs=input_cfgs, stages=stages, output=out, source_file=source_file, raw=raw)


def check_mix_budget(stages: list[StageSpec], out: OutputConfig, name: str) -> None:
    """Warn when a ``mix`` budget (``total_tokens``) is counted in other tokens than the token shards hold: the mix
    estimates tokens as text bytes / ``bytes_per_token`` unless given a ``tokenizer``."""
    if "tokens" not in out.formats:
        return
    for i, spec in enumerate(stages):
        cfg = spec.config
        if spec.kind != "mix" or cfg.total_tokens is None or cfg.tokenizer is not None:
            continue
        byte = out.tokens.tokenizer == "byte"
        if byte and cfg.bytes_per_token == 1:
            continue
        fix = "bytes_per_token = 1" if byte else f"tokenizer = {out.tokens.tokenizer!r}"
        log.warning(
            "%s [[stages]] #%d (mix): total_tokens = %d counts tokens as text bytes / %g (bytes_per_token), while the "
            "token shards use the %s tokenizer: the shards will hold another number of tokens; set %s in the mix "
            "to budget in the shards' tokens",
            name, i + 1, cfg.total_tokens, cfg.bytes_per_token, "byte-level" if byte else "given", fix,
        )  # fmt: skip


#: The top level of a job file: which names are one table (``[job]``) and which an array of tables (``[[stages]]``).
_ARRAYS = ("inputs", "stages")


def check_top_level(raw: dict[str, Any], name: str) -> None:
    """Every top-level name is a known table, written with the right brackets; a stray key says where it belongs."""
    for key, value in raw.items():
        if key not in _TOP_LEVEL:
            if not isinstance(value, dict | list):  # a key above the first table header
                raise ConfigError(
                    f"{name}: key {key!r} is outside every table{_key_hint(key, _TOP_LEVEL, '')}; "
                    "a key goes under its table's header"
                )
            close = difflib.get_close_matches(key, _TOP_LEVEL, n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise ConfigError(f"{name}: unknown table [{key}]{hint}; allowed: {', '.join(_TOP_LEVEL)}")
        if key in _ARRAYS and not (isinstance(value, list) and all(isinstance(t, dict) for t in value)):
            raise ConfigError(
                f"{name}: [{key}] must be written [[{key}]] (two brackets): each [[{key}]] header starts "
                f"one more table of the list"
            )
        if key not in _ARRAYS and not isinstance(value, dict):
            shape = f"[[{key}]] (a list of tables)" if isinstance(value, list) else f"a plain key {key!r}"
            raise ConfigError(f"{name}: {key!r} must be one [{key}] table; found {shape}")


def check_source_names(inputs: list[InputConfig], stages: list[StageSpec], name: str) -> None:
    """Each stage key that names sources (``StageConfig.SOURCE_KEYS``) names sources the inputs declare.

    A misspelt name would otherwise scope a stage to nothing, or weigh a source that never comes.
    When an input takes its sources from a column (``source_field``), other names may appear at
    run time: then an unknown name is a warning, not an error.
    """
    for i, spec in enumerate(stages):
        if getattr(spec.config, "sources", None) == []:
            raise ConfigError(
                f"{name} [[stages]] #{i + 1} ({spec.kind}) key 'sources' = [] scopes the stage to no source, so it "
                "would do nothing; leave sources out to run it on every source"
            )
        for key in type(spec.config).SOURCE_KEYS:
            check_sources(
                getattr(spec.config, key, None), inputs, f"{name} [[stages]] #{i + 1} ({spec.kind}) key {key!r}"
            )


def check_kept_fields(inputs: list[InputConfig], stages: list[StageSpec], name: str) -> None:
    """No stage writes its column (a score's ``column``) over a field an input keeps: the user's values would be
    replaced without a word."""
    kept = {f: i for i, cfg in enumerate(inputs) for f in cfg.keep_fields}
    writers: dict[str, int] = {}  # column -> the first stage writing it
    for i, spec in enumerate(stages):
        column = getattr(spec.config, "column", None)
        if not isinstance(column, str):
            continue
        if column in kept:
            raise ConfigError(
                f"{name} [[stages]] #{i + 1} ({spec.kind}) writes column = {column!r}, which [[inputs]] "
                f"#{kept[column] + 1} keeps from its rows (keep_fields): the score would replace those values; "
                "give the stage another column"
            )
        first = writers.setdefault(column, i)
        mine, theirs = getattr(spec.config, "sources", None), getattr(stages[first].config, "sources", None)
        if first != i and not (mine and theirs and not set(mine) & set(theirs)):  # the same rows: one score lost
            raise ConfigError(
                f"{name} [[stages]] #{i + 1} ({spec.kind}) writes column = {column!r}, as [[stages]] #{first + 1} "
                f"({stages[first].kind}) does: its score would replace the other's on the rows both see; give one "
                "of them another column, or scope them to different sources (sources)"
            )


_CARRY_COLUMNS = ("parquet", "hf", "webdataset")  # the formats whose rows may come with winnow's own columns


def check_order_columns(inputs: list[InputConfig], stages: list[StageSpec], name: str) -> None:
    """An ``order`` stage's ``by`` names a column the rows can hold when it runs: a score stage's before it, a kept
    field, or one of winnow's numeric columns an input may carry; a misspelt name would fail only after every
    earlier phase. Where an earlier stage writes columns no job file names (``keep_metrics``, a plugin's
    stage), the stage itself checks at run time."""
    from winnow.curate.schema import OPTIONAL_COLUMNS

    known = {"length", "random"} | {f for cfg in inputs for f in cfg.keep_fields}
    if any(cfg.format in _CARRY_COLUMNS for cfg in inputs):  # rows of a curated job's shards may hold its scores
        known |= {c for c, dtype in OPTIONAL_COLUMNS.items() if dtype.is_numeric()}
    for i, spec in enumerate(stages):
        if spec.kind == "order" and isinstance(spec.config.by, str) and spec.config.by not in known:
            close = difflib.get_close_matches(spec.config.by, sorted(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            if spec.config.by == "difficulty":  # by's default
                hint = " (by's default: put a score.difficulty stage before it, or give by)"
            raise ConfigError(
                f"{name} [[stages]] #{i + 1} (order): by = {spec.config.by!r} names no column the rows hold there"
                f"{hint}; allowed: 'length', 'random', a score stage's column before it, or a numeric kept field"
            )
        if getattr(spec.config, "keep_metrics", False) or not type(spec.config).__module__.startswith("winnow."):
            return  # columns from here on are known only when the stages run
        if isinstance(column := getattr(spec.config, "column", None), str):
            known.add(column)


#: Stages that change which rows there are: after ``mix`` they would undo its shares (and a dedup would take
#: its copies for duplicates).
_ROW_STAGES = ("clean", "filter.", "dedup.")


def _drops_rows(spec: StageSpec) -> bool:
    """Whether a stage may drop rows: cleaning, filters and dedups, and a score with a minimum (``min_quality``,
    ``min_weight``)."""
    if spec.kind.startswith(_ROW_STAGES):
        return True
    minimums = [name for name in getattr(spec.config, "__dataclass_fields__", {}) if name.startswith("min_")]
    return spec.kind.startswith("score.") and any(getattr(spec.config, name) is not None for name in minimums)


def check_stage_order(stages: list[StageSpec], name: str) -> None:
    """``split``, ``mix`` and ``order`` arrange the whole job's rows, so they come in that order: a split after mix
    would hold out copies and make the mix's shares wrong, and nothing after ``order`` may change the rows it
    ranked. Each of ``split``, ``mix`` and ``order`` runs once (a second split would replace the first's held-out
    rows); after ``mix`` no stage drops rows."""
    where = lambda i: f"{name} [[stages]] #{i + 1} ({stages[i].kind})"  # noqa: E731
    kinds = [s.kind for s in stages]
    for kind in ("split", "mix", "order"):
        if kinds.count(kind) > 1:
            second = [i for i, k in enumerate(kinds) if k == kind][1]
            raise ConfigError(f"{where(second)}: a job has one {kind} stage; merge their settings into the first")
    arranged = [i for i, k in enumerate(kinds) if k in ("mix", "order")]
    for i, kind in enumerate(kinds):
        if kind == "split" and arranged and arranged[0] < i:
            raise ConfigError(
                f"{where(i)} comes after {where(arranged[0])}: move the split before it (held-out rows are chosen "
                "before the training mix and order are made of the rest)"
            )
        if "order" in kinds and i > kinds.index("order"):
            raise ConfigError(
                f"{where(i)} comes after {where(kinds.index('order'))}: order must be the last stage (a stage after it "
                "would change the rows it ranked); move this stage before it"
            )
        if "mix" in kinds and i > kinds.index("mix") and _drops_rows(stages[i]):
            raise ConfigError(
                f"{where(i)} comes after {where(kinds.index('mix'))}: move it before the mix, whose token shares are of "
                "the rows that reach it (a stage that drops rows after it would change them, and a dedup would take "
                "its copies for duplicates)"
            )


def check_sources(value: Any, inputs: list[InputConfig], where: str) -> None:
    """``value`` (a source name, a list of them, or a table keyed by them) names only sources ``inputs`` declare.

    An unknown name is a ``ConfigError`` naming ``where`` with a did-you-mean; when an input takes its
    sources from a column (``source_field``), other names may appear at run time, so it is a warning.
    """
    declared = [i.source for i in inputs if i.source is not None]
    dynamic = [i.source_field for i in inputs if i.source_field is not None]
    names = [value] if isinstance(value, str) else list(value or [])  # a list, or a table's keys
    for source in names if declared else []:
        if source in declared:
            continue
        close = difflib.get_close_matches(source, declared, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = f"{where}: no input has source {source!r}{hint}; the inputs' sources: {', '.join(declared)}"
        if not dynamic:
            raise ConfigError(message)
        log.warning("%s (it may still come from the source_field column %r)", message, dynamic[0])
