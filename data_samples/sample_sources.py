"""Extract the clean documents of the four sample sources from text a Debian + CPython machine already has.

docs      prose: the language-reference topics in ``pydoc_data/topics.py`` and long stdlib docstrings
code      Python: top-level functions, classes and methods of the stdlib
legal     license texts: ``/usr/share/common-licenses/*`` and ``/usr/share/doc/*/copyright``
changelog Debian changelog entries: ``/usr/share/doc/*/changelog.Debian.gz`` (and Debian-format ``changelog.gz``)

Every function returns documents sorted by a stable key, with exact duplicates already removed, so the
dirt planted later is the only duplication the tests need to account for.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import re
import sysconfig
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

#: Test suites, vendored packages and generated tables are not the prose/code we want.
SKIP_PARTS = frozenset({"test", "tests", "idle_test", "site-packages", "__pycache__", "encodings", "pydoc_data"})
#: A clean document has at least this many words and characters; planted short documents have far fewer.
MIN_WORDS = 20
MIN_CHARS = 150
WORD_RE = re.compile(r"\w+")
HEADING_RULE_RE = re.compile(r"^([*=\-^~])\1{2,}$")
CHANGELOG_HEAD_RE = re.compile(r"^([a-z0-9][a-z0-9+.\-]*) \(([^)\s]+)\) ([^;]+); (.*)$")
CHANGELOG_TAIL_RE = re.compile(r"^ -- (.+?)  (\w{3}, .+)$")


class MissingSourceError(RuntimeError):
    """A required input of the sample data is absent on this machine."""


@dataclass(slots=True)
class Doc:
    """One sample document: ``body`` plus planted boilerplate ``head``/``foot`` lines, and readable provenance."""

    id: str
    body: str
    meta: dict = field(default_factory=dict)
    head: tuple[str, ...] = ()
    foot: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "\n".join((*self.head, self.body, *self.foot))


def make_id(source: str, key: str) -> str:
    """A stable, neutral id: the same provenance key gives the same id on every rebuild."""
    return f"{source}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


def is_substantial(text: str, max_chars: int) -> bool:
    return MIN_CHARS <= len(text) <= max_chars and len(WORD_RE.findall(text)) >= MIN_WORDS


def unique(docs: list[Doc]) -> list[Doc]:
    """Drop documents whose text repeats an earlier one (packages share copyright files and changelogs)."""
    seen: set[str] = set()
    out = []
    for d in docs:
        if d.body not in seen:
            seen.add(d.body)
            out.append(d)
    return out


def stdlib_dir() -> Path:
    root = Path(sysconfig.get_paths()["stdlib"])
    if not (root / "pydoc_data" / "topics.py").is_file():
        raise MissingSourceError(f"the Python standard library at {root} lacks pydoc_data/topics.py; "
                                 "install the full CPython 3.11 standard library (Debian: python3.11)")
    return root


def stdlib_modules(root: Path) -> list[tuple[str, str, ast.Module]]:
    """(relative path, source, parsed tree) of every stdlib module we use, in path order."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_PARTS.intersection(rel.parts):
            continue
        try:
            source = path.read_text("utf-8")
            out.append((rel.as_posix(), source, ast.parse(source)))
        except (UnicodeDecodeError, SyntaxError, ValueError):
            continue  # lib2to3 fixtures and the like: deliberately broken, not library code
    if len(out) < 100:
        raise MissingSourceError(f"found only {len(out)} stdlib modules under {root}; is the standard library installed?")
    return out


def _module_name(rel: str) -> str:
    name = rel.removesuffix(".py").replace("/", ".")
    return name.removesuffix(".__init__")


def _topic_chunks(text: str, max_chars: int) -> list[tuple[str, str]]:
    """Split one reference topic into (section title, text) chunks at headings and at ``max_chars``."""
    lines = text.splitlines()
    sections: list[tuple[str, list[str]]] = [(lines[0].strip(), [])]
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if HEADING_RULE_RE.match(nxt.strip()) and line.strip() and len(nxt.strip()) >= len(line.strip()) - 1:
            sections.append((line.strip(), []))
        sections[-1][1].append(line)
    chunks = []
    for title, sec_lines in sections:
        buf = ""
        for para in "\n".join(sec_lines).strip().split("\n\n"):
            if buf and len(buf) + len(para) > max_chars:
                chunks.append((title, buf))
                buf = ""
            buf = f"{buf}\n\n{para}" if buf else para
        if buf:
            chunks.append((title, buf))
    return chunks


def _literal_topics(path: Path) -> dict[str, str]:
    """The ``topics`` dict of pydoc_data, read as a literal (never executed)."""
    for node in ast.parse(path.read_text("utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            return ast.literal_eval(node.value)
    raise MissingSourceError(f"{path} has no literal `topics = {{...}}` assignment")


def docs_documents(root: Path, modules: list[tuple[str, str, ast.Module]]) -> list[Doc]:
    """Prose: reference-manual topics split at sections, then module and long class/function docstrings."""
    topics = _literal_topics(root / "pydoc_data" / "topics.py")
    docs = []
    for key in sorted(topics):
        for n, (title, text) in enumerate(_topic_chunks(topics[key], max_chars=3000)):
            origin = f"pydoc_data/topics.py:{key}#{n}"
            docs.append(Doc(make_id("docs", origin), text, {"title": title, "kind": "reference", "origin": origin}))
    for rel, _, tree in modules:
        module = _module_name(rel)
        nodes = [(module, tree)] + [
            (f"{module}.{qual}", node) for qual, node in _definitions(tree) if len(qual.split(".")) <= 2
        ]
        for title, node in nodes:
            text = ast.get_docstring(node, clean=True)
            if text and len(text) >= (300 if node is tree else 500):
                origin = f"{rel}:{title.removeprefix(module).lstrip('.') or '<module>'}"
                docs.append(Doc(make_id("docs", origin), text, {"title": title, "kind": "docstring", "origin": origin}))
    return unique([d for d in docs if is_substantial(d.body, 6000)])


def _definitions(tree: ast.Module):
    """(qualified name, node) of top-level functions and classes and of methods of top-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield f"{node.name}.{sub.name}", sub


def code_documents(modules: list[tuple[str, str, ast.Module]]) -> list[Doc]:
    """Code: each function, method or class of 5 to 120 lines, dedented, with its decorators."""
    docs = []
    for rel, source, tree in modules:
        lines = source.splitlines()
        for qual, node in _definitions(tree):
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if not 5 <= node.end_lineno - first + 1 <= 120:
                continue
            text = textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))
            kind = "class" if isinstance(node, ast.ClassDef) else ("method" if "." in qual else "function")
            meta = {"path": rel, "qualname": qual, "kind": kind, "lineno": first}
            docs.append(Doc(make_id("code", f"{rel}:{qual}"), text, meta))
    return unique([d for d in docs if is_substantial(d.body, 6000)])


def legal_documents(licenses_dir: Path, doc_dir: Path) -> list[Doc]:
    """Legal: every common license text, then every package's copyright file up to 16 kB (ids are file names)."""
    if not licenses_dir.is_dir():
        raise MissingSourceError(f"{licenses_dir} is missing; it ships with Debian's base-files package")
    docs = []
    for path in sorted(p for p in licenses_dir.iterdir() if p.is_file()):
        docs.append(Doc(f"license-{path.name}.txt", path.read_text("utf-8"), {"origin": str(path)}))
    for path in sorted(doc_dir.glob("*/copyright")):
        try:
            text = path.read_text("utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) <= 16_000:
            docs.append(Doc(f"copyright-{path.parent.name}.txt", text, {"origin": str(path)}))
    return unique([d for d in docs if is_substantial(d.body, 40_000)])


def _urgency(fields: str) -> str:
    found = re.search(r"urgency=(\w+)", fields)
    return found[1].lower() if found else ""


def _changelog_entries(text: str) -> list[tuple[dict, str]]:
    entries, start, meta = [], None, {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        head = CHANGELOG_HEAD_RE.match(line)
        if head:
            start = i
            meta = {"package": head[1], "version": head[2], "distribution": head[3].strip(), "urgency": _urgency(head[4])}
        elif start is not None and (tail := CHANGELOG_TAIL_RE.match(line)):
            entries.append(({**meta, "date": tail[2].strip()}, "\n".join(lines[start : i + 1])))
            start = None
    return entries


def changelog_documents(doc_dir: Path) -> list[Doc]:
    """Changelog: one document per Debian changelog entry, header line to maintainer trailer."""
    paths = sorted(doc_dir.glob("*/changelog.Debian.gz")) + sorted(doc_dir.glob("*/changelog.gz"))
    docs = []
    for path in paths:
        try:
            text = gzip.decompress(path.read_bytes()).decode("utf-8")
        except (OSError, EOFError, UnicodeDecodeError):
            continue
        entries = _changelog_entries(text)
        for i, (meta, entry) in enumerate(entries):
            # Counting from the oldest entry keeps a key stable when the package adds newer entries.
            key = f"{path.parent.name}/{meta['version']}/{len(entries) - i}"
            docs.append(Doc(make_id("changelog", key), entry, meta))
    docs = unique([d for d in docs if is_substantial(d.body, 4000)])
    if len(docs) < 200:
        raise MissingSourceError(f"found only {len(docs)} Debian changelog entries under {doc_dir}/*/changelog*.gz; "
                                 "the sample data needs a Debian system whose /usr/share/doc was not pruned")
    return docs
