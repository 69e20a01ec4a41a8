"""``curate.names.path_name``: any name becomes one path component that stays where it is put."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from winnow.curate.config import JobSection
from winnow.curate.names import MAX_COMPONENT, name_from_path, path_name

HOSTILE = [
    ".",
    "..",
    "../x",
    "../../etc",
    "/abs",
    "a/b",
    "a\\b",
    "\x00",
    "a\x00b",
    ".hidden",
    "...",
    "%",
    "%2E",
    "%25",
    "a b",
    "é",
    "naïve/..",
    "$\\foo{x}$",
    "<b>x</b>",
    "a|b",
    "x" * 300,
    "é" * 300,
    "%~",
    "\ud800",
]
ORDINARY = ["web", "books", "wiki_en", "code-python", "v1.2", "Prose", "a..b", "x."]


@pytest.mark.parametrize("name", HOSTILE + ORDINARY)
def test_one_component_inside_its_folder(name, tmp_path):
    part = path_name(name)
    assert "/" not in part and "\\" not in part and "\x00" not in part and part not in (".", "..")
    assert not part.startswith(".") and 0 < len(part.encode()) <= MAX_COMPONENT
    (tmp_path / part).mkdir()  # the file system takes it as one folder, inside tmp_path
    assert [p.name for p in tmp_path.iterdir()] == [part]


@pytest.mark.parametrize("name", ORDINARY)
def test_ordinary_names_read_as_themselves(name):
    assert path_name(name) == name


def test_distinct_names_never_share_a_folder():
    names = HOSTILE + ORDINARY + ["x" * 299, "x" * 301, "é" * 299, ".x", "%2Ex", "%252E"]
    parts = [path_name(n) for n in names]
    assert len(set(parts)) == len(set(names))
    for a, b in itertools.combinations(names, 2):
        assert (path_name(a) == path_name(b)) == (a == b)


@pytest.mark.parametrize("name", [n for n in HOSTILE + ORDINARY if len(path_name(n)) < MAX_COMPONENT - 40])
def test_reversible(name):
    assert name_from_path(path_name(name)) == name


def test_long_names_are_hashed():
    assert name_from_path(path_name("x" * 300)) is None
    assert path_name("x" * 300).startswith("x" * 100)


def test_a_job_named_dotdot_writes_under_out():
    assert Path(JobSection(name="..").output) == Path("out") / "%2E."
