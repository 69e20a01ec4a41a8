"""The documentation: the generated job-file reference matches the code, and the site builds without warnings."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference() -> str:
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render()


def test_job_file_reference_is_what_the_config_classes_generate(reference):
    committed = (ROOT / "docs" / "reference" / "job-file.md").read_text()
    assert committed == reference, "docs/reference/job-file.md is out of date: run python docs/gen_reference.py"


def test_job_file_reference_lists_every_table_and_built_in_stage_kind(reference):
    from winnow.curate.stages import _KINDS
    from winnow.pipelines.config import tables

    text = reference
    for name in tables():
        assert f"### `[[{name}]]`" in text or f"### `[{name}]`" in text, name
    for kind in _KINDS:
        assert f'### `kind = "{kind}"`' in text, kind


def test_docs_site_builds_strict_with_no_broken_links(tmp_path):
    """`mkdocs build --strict` fails on a broken link, a missing anchor or a page outside the nav."""
    pytest.importorskip("mkdocs")
    # the command CI runs, from the repository root (mkdocs.yml sits in the docs folder it builds)
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "docs/mkdocs.yml", "-d", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "job-file" / "index.html").exists()
