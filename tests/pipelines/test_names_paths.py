"""Names from data or a job file never leave the folder they are put in (study, per-source sets, run folders)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.train.shards_util import write_job
from winnow.pipelines.ablate.layout import StudyLayout
from winnow.pipelines.ablate.sources import split_by_source
from winnow.pipelines.train import default_run_folder

HOSTILE = ["..", "../escape", "/abs", "a/b", ".hidden"]


def test_per_source_sets_stay_in_their_folder(tmp_path):
    rows = [
        {"id": f"{s}-{i}", "source": s, "text": f"text {i} of {s}", "meta": None} for i in range(3) for s in HOSTILE
    ]
    job = write_job(tmp_path / "study" / "job", [rows])
    out = tmp_path / "study" / "sources"
    before = set(tmp_path.rglob("*"))
    folders, shares = split_by_source(str(job), out)
    assert sorted(folders) == sorted(HOSTILE) and abs(sum(shares.values()) - 1) < 1e-9  # names as given
    written = set(tmp_path.rglob("*")) - before
    assert written and all(p == out or out in p.parents for p in written)
    assert len({Path(f) for f in folders.values()}) == len(HOSTILE)
    for source, folder in folders.items():  # each set holds its own source, named as given
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        assert Path(folder).parent == out and manifest["sources"] == [source]


def test_study_paths_stay_in_the_study(tmp_path):
    layout = StudyLayout(tmp_path / "study")
    for name in HOSTILE + ["without_..", "without_../../x"]:
        for path in (layout.run_dir(name), layout.source_dir(name), layout.result_path(name)):
            assert layout.root in path.parents and ".." not in path.relative_to(layout.root).parts


def test_default_run_folder_of_a_dotdot_folder(tmp_path):
    assert Path(default_run_folder(str(tmp_path / "x" / ".."))).parent == Path("out") / "%2E."
