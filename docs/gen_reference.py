"""Write docs/reference/job-file.md: every table and stage kind of a job file, from the config dataclasses.

The page is built from the same source as ``winnow config show`` and ``winnow config schema``
(``pipelines.config``): each key's type, default and the comment the dataclass gives it. Run it
after changing a config class:

    python docs/gen_reference.py            # rewrite docs/reference/job-file.md
    python docs/gen_reference.py --check    # exit 1 when the committed page differs

``tests/pipelines/test_docs.py`` fails when the committed page is not what this script writes.
"""

from __future__ import annotations

import argparse
import sys
import typing
from pathlib import Path

from winnow.curate.stages import _KINDS, stage_class
from winnow.pipelines.config import _default, _type_name, class_doc, field_docs, job_fields, tables, toml_key

PAGE = Path(__file__).resolve().parent / "reference" / "job-file.md"

HEADER = """\
# Job-file reference

Every key a job file may hold, table by table, with its type, its default and what it does.
This page is generated from the config dataclasses by `docs/gen_reference.py`; `winnow config
show TABLE` prints the same for one table or stage kind, and `winnow config schema` writes the
JSON Schema editors use. How the tables fit together is in [the job file](../job-file.md).

A key that is not listed for its table is an error naming the file, the table and the key, with a
did-you-mean or the table it belongs in. A key typed *(optional)* that is on by default (a
threshold, a rule) takes `false` to turn it off: TOML has no null.
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def table(cls: type) -> list[str]:
    """One Markdown table of ``cls``'s keys."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    lines = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    for f in job_fields(cls):
        lines.append(
            f"| `{toml_key(f)}` | {_cell(_type_name(hints[f.name]))} | `{_cell(_default(f))}` "
            f"| {_cell(docs.get(f.name, ''))} |"
        )
    return lines


def section(heading: str, cls: type, doc: str = "") -> list[str]:
    doc = doc or class_doc(cls)
    return [f"### {heading}", "", *([doc, ""] if doc else []), *table(cls), ""]


def render() -> str:
    """The whole page (built-in stage kinds only: installed plugins do not change it)."""
    known = tables()
    out = [HEADER]
    out += ["## Curation", ""]
    for name in ("job", "inputs", "output", "output.tokens"):
        out += section("`[[inputs]]`" if name == "inputs" else f"`[{name}]`", known[name])
    out += [
        "## Stages",
        "",
        "Each `[[stages]]` table names its `kind`; the other keys are that kind's. "
        "Every kind also takes `sources` (run it on those sources only).",
        "",
    ]
    for kind in sorted(_KINDS):
        cls = stage_class(kind)
        out += section(f'`kind = "{kind}"`', cls.Config, class_doc(cls))
    out += ["## Training", ""]
    for name in known:
        if name.startswith("train"):
            out += section(f"`[{name}]`", known[name])
    if "ablate" in known:
        out += ["## Studies", ""]
        out += section("`[ablate]`", known["ablate"])
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed page instead of writing it")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print(f"{PAGE} is out of date: run python docs/gen_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
