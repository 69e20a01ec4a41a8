"""The catalogue of bad inputs, around training runs, studies, exports and reports.

Each kind builds a tiny bad input or fault and asserts the clear outcome. The curation kinds are
in ``tests/curate/test_bad_input_catalogue.py``, which counts every area's kinds.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.pipelines.tiny import TINY_MODEL
from tests.train.shards_util import make_docs, write_job
from winnow.curate.errors import OutputError
from winnow.pipelines.ablate.sources import split_by_source
from winnow.pipelines.jobfile import build_config
from winnow.train.config import TrainConfig


@dataclass(frozen=True)
class Kind:
    """One bad input or fault: ``run(tmp_path)`` builds it and asserts what happens."""

    name: str
    area: str  # training, study, export, report
    run: Callable[[Path], None]


KINDS: list[Kind] = []


def kind(area: str) -> Callable[[Callable[[Path], None]], Callable[[Path], None]]:
    def register(fn: Callable[[Path], None]) -> Callable[[Path], None]:
        KINDS.append(Kind(fn.__name__, area, fn))
        return fn

    return register


def tiny_cfg(shards: Path, run: Path, **train) -> TrainConfig:
    import tomllib

    table = {"shards": str(shards), "output": str(run), "steps": 2, **train, **tomllib.loads(TINY_MODEL)["train"]}
    return build_config(TrainConfig, table, "test [train]")


# -- training --------------------------------------------------------------------------------------------------
def _train_holder(cfg: TrainConfig, ready, done) -> None:
    from winnow.pipelines.train import build_trainer

    trainer = build_trainer(cfg)  # noqa: F841 - held while it lives
    ready.set()
    done.wait(120)


@kind("training")
def second_train_into_a_running_run_folder(tmp: Path) -> None:
    from winnow.pipelines.train import build_trainer

    job = write_job(tmp / "job", [make_docs(12)], val=[make_docs(4)])
    cfg = tiny_cfg(job, tmp / "run")
    fork = multiprocessing.get_context("fork")
    ready, done = fork.Event(), fork.Event()
    first = fork.Process(target=_train_holder, args=(cfg, ready, done))
    first.start()
    try:
        assert ready.wait(120)
        with pytest.raises(
            OutputError, match=rf"run folder .* in use by another winnow run \(host .*, pid {first.pid}"
        ):
            build_trainer(cfg)
    finally:
        done.set()
        first.join()
    assert not (tmp / "run" / "checkpoints").exists()  # the refused run wrote nothing there


def _lock_holder(folder: str, ready, done) -> None:
    from winnow.curate.lock import FolderLock

    FolderLock(folder, what="run folder").acquire()  # creates the folder, as a starting run does
    ready.set()
    done.wait(60)


@kind("training")
def second_train_started_as_the_first_creates_the_folder(tmp: Path) -> None:
    from winnow.curate.errors import FolderInUseError
    from winnow.curate.lock import FolderLock
    from winnow.pipelines.cleanup import removed_on_failure

    fork = multiprocessing.get_context("fork")
    ready, done = fork.Event(), fork.Event()
    first = fork.Process(target=_lock_holder, args=(str(tmp / "run"), ready, done))
    try:
        with pytest.raises(FolderInUseError), removed_on_failure(tmp / "run"):  # the folder is missing here...
            first.start()
            assert ready.wait(60)  # ...and made by the first run before this one's lock is refused
            FolderLock(tmp / "run", what="run folder").acquire()
        assert (tmp / "run" / ".winnow-lock").exists()  # the refused run removed nothing of the first's
    finally:
        done.set()
        first.join()


# -- studies -----------------------------------------------------------------------------------------------------
@kind("study")
def source_names_that_are_paths(tmp: Path) -> None:
    names = ["..", "../../escape", "/abs", "a/b"]
    rows = [{"id": f"{n}-{i}", "source": n, "text": f"text {i}", "meta": None} for i in range(2) for n in names]
    job = write_job(tmp / "study" / "job", [rows])
    folders, _ = split_by_source(str(job), tmp / "study" / "sources")
    assert sorted(folders) == sorted(names)
    assert all((tmp / "study" / "sources") in Path(f).parents for f in folders.values())
    assert not (tmp / "escape").exists() and not (tmp / "study" / "manifest.json").exists()


# -- exports -----------------------------------------------------------------------------------------------------
@kind("export")
def disk_full_during_export(tmp: Path) -> None:
    import contextlib
    import io

    from tests.disk import small_disk
    from tests.train.test_export import _trained_run
    from winnow.pipelines.cli import main

    _trained_run(tmp)
    out = tmp / "disk" / "export"
    with small_disk(tmp / "disk", "64k") as disk:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            assert main(["-q", "export", str(tmp / "run"), "--output", str(out)]) == 2
        assert f"no space left on the device holding {out}" in err.getvalue(), err.getvalue()
        assert "Traceback" not in err.getvalue() and not list((tmp / "disk").iterdir())  # nothing half-written
        disk.resize("64m")
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["-q", "export", str(tmp / "run"), "--output", str(out)]) == 0
        assert (out / "winnow-model.safetensors").is_file()


# -- reports -----------------------------------------------------------------------------------------------------
@kind("report")
def metrics_lines_that_are_not_records(tmp: Path) -> None:
    import contextlib
    import io
    import logging

    from tests.train.test_export import _trained_run
    from winnow.pipelines.cli import main

    _trained_run(tmp)
    with open(tmp / "run" / "metrics.jsonl", "ab") as f:  # a list, a string, bytes that are not UTF-8, a torn line
        f.write(b'[1, 2]\n"step"\n\xff\xfe{"step": 9}\n{"step": 10, "lo')
        # and records of other shapes than the trainer writes (edited by hand): skipped and counted the same
        shapes = [
            '{"step": 5, "loss": "high"}',
            '{"step": 5, "eval": 3}',
            '{"step": 5, "eval": {"per_source": [1]}}',
            '{"step": 5, "per_source": {"a": 5}}',
            '{"step": 5, "expert_load": "x"}',
            '{"step": 5, "mix_weights": {"a": "b"}}',
            '{"step": 1e400, "loss": 5}',
            '{"step": 5, "memory": 3}',
            '{"loss": 2.0}',  # no step: the report crashed on it (KeyError), and on a null step (TypeError)
            '{"step": null, "loss": 2.0}',
            '{"step": 6, "per_source": {"a": {"tokens": NaN}}}',
            '{"step": 7, "attribution": [1, 2]}',  # dropped without a word
            '{"step": 7, "counterfactual": [1, 2]}',
            '{"step": 7, "routing": [1, 2]}',
        ]
        # odd values inside records of the right shape: each stopped the report with a ValueError
        cf = '"sources": ["a"], "held_out": ["a"], "predicted": {"0": [[1.0]]}, "interval": {"0": [[0.1]]}'
        inner = [
            '{"step": 8, "attribution": {"sources": ["a"], "matrix": "x"}}',
            '{"step": 8, "attribution": {"sources": ["a", "b"], "matrix": [[1.0], [1.0, 2.0]]}}',
            '{"step": 8, "attribution": {"sources": ["a"], "matrix": [[1.0]], "measured": ["x"]}}',
            '{"step": 8, "attribution": {"sources": ["a"], "matrix": [[1.0]], "steps": ["a", "b"]}}',
            '{"step": 8, "attribution": {"sources": ["a"], "matrix": [[1.0]], "unattributed_parts": {"r": ["a"]}}}',
            '{"step": 8, "counterfactual": {' + cf + ', "steps": ["a", "b"]}}',
            '{"step": 8, "expert_load": [[1.0], [1.0, 2.0]]}',
            '{"step": 8, "routing": {"a": "x"}}',
        ]
        f.write(b"\n" + "\n".join(shapes + inner).encode() + b"\n")  # fmt: skip
    warnings: list[logging.LogRecord] = []
    said = logging.Handler(logging.WARNING)
    said.emit = warnings.append
    logging.getLogger("winnow.pipelines.report").addHandler(said)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["-q", "report", str(tmp / "run")]) == 0
    finally:
        logging.getLogger("winnow.pipelines.report").removeHandler(said)
    assert [w.getMessage() for w in warnings if "unreadable" in w.getMessage()] == [
        f"{tmp / 'run' / 'metrics.jsonl'}: 17 unreadable line(s) skipped (not JSON, or not of the shapes the trainer writes)"
    ]  # once, though the command reads the run for the page and for the terminal
    assert (tmp / "run" / "report.html").is_file()


@pytest.mark.parametrize("case", [pytest.param(k, id=f"{k.area}:{k.name}") for k in KINDS])
def test_bad_input(case: Kind, tmp_path: Path) -> None:
    case.run(tmp_path)
