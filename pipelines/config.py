"""``winnow config show KIND`` and ``winnow config schema``: what a job file may say, from the code itself.

``show`` prints a stage's (``dedup.minhash``, a plugin's kind) or a table's (``job``, ``inputs``,
``output``, ``train``, ``train.model``, ``ablate``...) keys with their types, defaults and the
comment the config dataclass gives them. ``schema`` writes a JSON Schema (draft 2020-12) of the
whole job file for editors (VS Code's Even Better TOML, taplo): unknown keys are errors there
as they are in winnow, and ``[[stages]]`` tables are checked against their kind's keys.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

from winnow.curate.config import InputConfig, JobSection, OutputConfig
from winnow.curate.errors import ConfigError
from winnow.curate.stages import stage_class, stage_kinds
from winnow.pipelines.jobfile import off_by_false

SCHEMA_TITLE = "winnow job file"  # what marks a schema file as winnow's (``config schema`` replaces only those)
_TABLES = {"job": JobSection, "inputs": InputConfig, "output": OutputConfig}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "config", help="show a stage's or table's keys with defaults and docs; the job file's JSON schema"
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="keys of a stage kind or a table, with types, defaults and docs")
    show.add_argument(
        "kind",
        nargs="?",
        help="a stage kind (dedup.minhash) or a table (job, inputs, output, train, "
        "train.model, ...); without one, list them",
    )
    show.set_defaults(func=run_show)
    schema = actions.add_parser("schema", help="the job file's JSON Schema, for editors")
    schema.add_argument("-o", "--output", type=Path, help="write it to this file (default: print it)")
    schema.set_defaults(func=run_schema)


def tables() -> dict[str, type]:
    """Every table a job file may hold, by dotted name (the trainer's only when it is installed)."""
    out: dict[str, type] = {}

    def nested(prefix: str, cls: type) -> None:
        out[prefix] = cls
        for f in dataclasses.fields(cls):
            inner = _dataclass_in(typing.get_type_hints(cls)[f.name])
            if inner is not None:
                nested(f"{prefix}.{f.name}", inner)

    for name, cls in _TABLES.items():
        nested(name, cls)
    try:
        from winnow.pipelines.ablate.config import AblateConfig
        from winnow.train.config import TrainConfig
    except ImportError:  # a curation-only install
        return out
    nested("train", TrainConfig)
    nested("ablate", AblateConfig)
    return out


def homes(key: str, *, near: str = "") -> list[str]:
    """Every table that has ``key``, as a job file writes its header: tables first (those under ``near``'s
    top-level table before others, then shallower before deeper, then in job-file order), then stage kinds."""
    root = near.split(".")[0]
    found = sorted(
        (name.split(".")[0] != root, name.count("."), i, name)
        for i, (name, cls) in enumerate(tables().items())
        if name != near and key in _keys(cls)
    )
    out = [f"[{name}]" for *_, name in found]
    for kind in stage_kinds():
        try:
            config = stage_class(kind).Config
        except (ConfigError, ImportError):  # a stage whose optional package is missing
            continue
        if key in _keys(config):
            out.append(f"[[stages]] kind = {json.dumps(kind)}")
    return out


def _keys(cls: type) -> set[str]:
    return {f.name for f in job_fields(cls)}


def _dataclass_in(tp: Any) -> type | None:
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def field_docs(cls: type) -> dict[str, str]:
    """Each field's comment in the class source (and its base classes'), as one plain sentence or more.

    A field's comment is the one at the end of its line, continued on the comment-only lines
    under it when it ends unfinished (with ``,`` ``;`` ``:`` or ``(``); otherwise comment-only lines
    above a field are its comment (and come before its trailing one). RST's double backquotes
    become single ones. A field without a comment whose value is a table of its own takes the
    first paragraph of that table's docstring.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue
        docs |= _class_comments(source)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        inner = _dataclass_in(hints[f.name])
        if f.name not in docs and inner is not None and class_doc(inner):
            docs[f.name] = class_doc(inner)
    return docs


def _class_comments(source: str) -> dict[str, str]:
    """``{field: comment}`` of the first class in ``source`` (see ``field_docs``)."""
    body = ast.parse(source).body[0].body
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.string.lstrip("#").strip(), not tok.line[: tok.start[1]].strip())
    fields = [
        (node.target.id, node.lineno, node.end_lineno)
        for node in body
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and "ClassVar" not in ast.unparse(node.annotation)
    ]
    trailing = {name: comments[end][0] for name, _, end in fields if end in comments and not comments[end][1]}
    docs: dict[str, list[str]] = {name: [] for name, *_ in fields}  # each field's comments, one text per comment
    for i, (name, start, end) in enumerate(fields):
        before = fields[i - 1] if i else None
        lines = [
            comments[n][0] for n in range((before[2] + 1) if before else 1, start) if comments.get(n, ("", False))[1]
        ]
        if before is not None and trailing.get(before[0], "").endswith((",", ";", ":", "(")):
            docs[before[0]][-1] = " ".join([docs[before[0]][-1], *lines])  # the previous field's comment, continued
        elif lines:
            docs[name].append(" ".join(lines))
        if name in trailing:
            docs[name].append(trailing[name])
    return {name: _plain(texts) for name, texts in docs.items() if texts}


def class_doc(cls: type) -> str:
    """The first paragraph of a class's docstring, on one line, plain."""
    first = (inspect.getdoc(cls) or "").split("\n\n")[0].strip()
    return _plain([" ".join(first.split())]) if first else ""


def _plain(texts: list[str]) -> str:
    """A field's comments as one text (a comment above and the one beside it apart by ';'), RST's ``x`` as `x`."""
    text = texts[0]
    for more in texts[1:]:
        text += (" " if text.endswith((".", "!", "?")) else "; ") + more
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return (
            " | ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None)) + " (optional)"
            if type(None) in typing.get_args(tp)
            else " | ".join(_type_name(a) for a in typing.get_args(tp))
        )
    if origin in (list, tuple):
        return f"list of {_type_name(typing.get_args(tp)[0])}" if typing.get_args(tp) else "list"
    if origin is dict:
        return f"table of {_type_name(typing.get_args(tp)[1])}" if typing.get_args(tp) else "table"
    if dataclasses.is_dataclass(tp):
        return f"table ({tp.__name__})"
    return getattr(tp, "__name__", str(tp))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(its own table)"
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


def toml_key(f: dataclasses.Field) -> str:
    """The key a job file writes for field ``f``: its name, or ``metadata["key"]`` where the name is a Python keyword
    (``[train.replay] from``)."""
    return f.metadata.get("key", f.name)


def job_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of config ``cls`` a job file sets: those ``__init__`` takes, without the ``sources`` of a stage
    that acts on the whole mixture (``StageConfig.SCOPED``: it refuses the key)."""
    unscoped = getattr(cls, "SCOPED", True) is False
    return [f for f in dataclasses.fields(cls) if f.init and not (unscoped and f.name == "sources")]


def describe(cls: type, title: str) -> str:
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    doc = class_doc(cls)
    rows = [(toml_key(f), _type_name(hints[f.name]), _default(f), docs.get(f.name, "")) for f in job_fields(cls)]
    width = [max(len(r[i]) for r in rows + [("key", "type", "default", "")]) for i in range(3)]
    lines = [f"{title}: {doc}".rstrip(": "), ""]
    lines.append(f"{'key':<{width[0]}}  {'type':<{width[1]}}  {'default':<{width[2]}}  doc")
    lines += [f"{n:<{width[0]}}  {t:<{width[1]}}  {d:<{width[2]}}  {c}".rstrip() for n, t, d, c in rows]
    return "\n".join(lines)


def run_show(args: argparse.Namespace) -> int:
    known = tables()
    if args.kind is None:
        print("stage kinds: " + ", ".join(stage_kinds()))
        print("tables:      " + ", ".join(known))
        return 0
    if args.kind in known:
        print(describe(known[args.kind], f"[{args.kind}]"))
        return 0
    try:
        cls = stage_class(args.kind)
    except ConfigError as err:
        close = difflib.get_close_matches(args.kind, list(known), n=1)
        if close:  # a table's name misspelt ("trian", "train.modle") is no stage kind either
            raise ConfigError(
                f"unknown table {args.kind!r} (did you mean {close[0]!r}?); tables: {', '.join(known)}"
            ) from None
        raise ConfigError(f"{err}; tables: {', '.join(known)}") from None
    print(describe(cls.Config, f"[[stages]] kind = {args.kind!r} ({class_doc(cls).split('. ')[0].rstrip('.')})"))
    return 0


# ---- JSON Schema ----------------------------------------------------------------------------
def type_schema(tp: Any) -> dict[str, Any]:
    """The JSON Schema of a config field's type (TOML has no null: optional means "may be left out")."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return {}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (Union, types.UnionType):
        options = [type_schema(a) for a in typing.get_args(tp) if a is not type(None)]
        return options[0] if len(options) == 1 else {"anyOf": options}
    if origin in (list, tuple):
        args = typing.get_args(tp)
        return {"type": "array", **({"items": type_schema(args[0])} if args else {})}
    if origin is dict:
        args = typing.get_args(tp)
        return {"type": "object", **({"additionalProperties": type_schema(args[1])} if args else {})}
    if dataclasses.is_dataclass(tp):
        return object_schema(tp)
    return {
        int: {"type": "integer"},
        float: {"type": "number"},
        str: {"type": "string"},
        bool: {"type": "boolean"},
    }.get(tp, {})


def object_schema(cls: type, *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    props: dict[str, Any] = dict(extra or {})
    required = []
    for f in job_fields(cls):
        prop = type_schema(hints[f.name])
        if off_by_false(f, hints[f.name]):  # a default-on optional setting: false turns it off (jobfile.build_config)
            prop = {"anyOf": [*prop.get("anyOf", [prop]), {"const": False}]}
        if f.name in docs:
            prop["description"] = docs[f.name]
        if f.default is not dataclasses.MISSING and isinstance(f.default, (int, float, str, bool)):
            prop["default"] = f.default
        props[toml_key(f)] = prop
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(toml_key(f))
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if class_doc(cls):
        out["description"] = class_doc(cls)
    if required:
        out["required"] = required
    return out


def job_schema() -> dict[str, Any]:
    """The JSON Schema of a whole job file."""
    stages = []
    for kind in stage_kinds():
        try:
            cls = stage_class(kind)
        except (ConfigError, ImportError):  # a stage whose optional package is missing still has its kind
            stages.append({"type": "object", "properties": {"kind": {"const": kind}}, "required": ["kind"]})
            continue
        schema = object_schema(cls.Config, extra={"kind": {"const": kind}})
        schema["required"] = ["kind", *schema.get("required", [])]
        stages.append({"if": {"properties": {"kind": {"const": kind}}}, "then": schema})
    known = tables()
    props: dict[str, Any] = {
        "job": object_schema(JobSection),
        "inputs": {"type": "array", "items": object_schema(InputConfig)},
        "stages": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["kind"],
                "properties": {"kind": {"enum": stage_kinds()}},
                "allOf": stages,
            },
        },
        "output": object_schema(OutputConfig),
    }
    for name in ("train", "ablate"):
        if name in known:
            props[name] = object_schema(known[name])
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": SCHEMA_TITLE,
        "type": "object",
        "properties": props,
        "additionalProperties": False,
    }


def _our_schema(path: Path) -> bool:
    """Whether ``path`` holds a job-file schema ``winnow config schema`` wrote."""
    try:
        found = json.loads(path.read_bytes()[: 1 << 22])
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and found.get("title") == SCHEMA_TITLE


def run_schema(args: argparse.Namespace) -> int:
    text = json.dumps(job_schema(), indent=1)
    if args.output is None:
        sys.stdout.write(text + "\n")
    else:
        if args.output.is_file() and not _our_schema(args.output):
            raise ConfigError(
                f"--output {args.output}: the file exists and is not a schema winnow wrote; give a new file name "
                "(winnow replaces only a schema of its own)"
            )
        try:
            args.output.write_text(text + "\n")
        except OSError as err:
            raise ConfigError(
                f"--output {args.output}: cannot write it ({err.strerror or err}); give a file path in a folder you "
                "can write"
            ) from err
        print(f"schema: {args.output} (point your editor's TOML schema setting at it)")
    return 0
