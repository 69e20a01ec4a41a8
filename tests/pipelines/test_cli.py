"""The ``winnow`` command: each command imports only what it runs, and says which extra a missing package needs."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from winnow.pipelines.cli import COMMANDS, EXTRA_PACKAGES, build_parser, main

ROOT = Path(__file__).resolve().parents[2]

# A tiny job through the demo's stage kinds (inline: workers = 1), then what the process loaded.
CURATE_AND_REPORT = """
import json, sys
from winnow.pipelines.cli import main
from winnow.curate.stages import stage_class, stage_kinds
rc = main(["-q", "curate", sys.argv[1]])
for kind in stage_kinds():
    stage_class(kind)  # every stage module, not only the job's
import numba.core.registry as reg
misses = {f"{name}.{attr}": sum(obj.stats.cache_misses.values())
          for name, mod in list(sys.modules.items()) if name.startswith("winnow.curate") and mod is not None
          for attr, obj in vars(mod).items() if isinstance(obj, reg.CPUDispatcher) and obj.signatures}
print(json.dumps({"rc": rc, "heavy": sorted(m for m in ("torch", "matplotlib", "tensorboard", "datasets", "ray")
                                            if m in sys.modules), "misses": misses}))
"""

JOB = """[job]
name = "tiny"
output = "{out}"
workers = 1
[[inputs]]
source = "a"
path = "{data}"
[[stages]]
kind = "clean"
[[stages]]
kind = "filter.length"
min_words = 2
[[stages]]
kind = "filter.gopher_repetition"
[[stages]]
kind = "dedup.exact"
[[stages]]
kind = "dedup.minhash"
[[stages]]
kind = "score.heuristic"
[[stages]]
kind = "score.difficulty"
[[stages]]
kind = "split"
val_fraction = 0.2
[[stages]]
kind = "mix"
[[stages]]
kind = "order"
"""


def _curate_in_subprocess(tmp_path: Path) -> dict:
    tmp_path.mkdir()
    data = tmp_path / "a.jsonl"
    words = [f"w{k}" for k in range(300)]
    texts = [" ".join(words[(i * 37 + j * 11) % 300] for j in range(30)) for i in range(40)]
    data.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    job = tmp_path / "tiny.toml"
    job.write_text(JOB.format(out=tmp_path / "out", data=data))
    proc = subprocess.run(
        [sys.executable, "-c", CURATE_AND_REPORT, str(job)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_curate_path_loads_no_training_or_plotting_and_compiles_nothing_twice(tmp_path):
    first = _curate_in_subprocess(tmp_path / "1")
    assert first["rc"] == 0 and first["heavy"] == []
    second = _curate_in_subprocess(tmp_path / "2")
    assert second["heavy"] == []
    assert second["misses"], "no compiled kernel ran: the job does not exercise the numba paths"
    compiled = {k: v for k, v in second["misses"].items() if v}
    assert not compiled, f"numba kernels compiled again (cache=True missing?): {compiled}"


def _loaded(argv: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh process running ``winnow ARGV`` loaded (the command must succeed)."""
    code = (
        f"import sys\nfrom winnow.pipelines.cli import main\ntry:\n    rc = main({argv!r})\nexcept SystemExit as e:\n"
        f"    rc = e.code or 0\nprint(rc, sorted(m for m in {modules!r} if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rc, loaded = proc.stdout.strip().splitlines()[-1].split(" ", 1)
    assert rc == "0", proc.stdout
    return ast.literal_eval(loaded)


@pytest.mark.parametrize("argv", [["--help"], ["curate", "--help"]])
def test_help_imports_neither_torch_nor_polars(argv):
    assert _loaded(argv, ("torch", "matplotlib", "polars", "pyarrow", "numba")) == []


@pytest.mark.parametrize(
    "argv", [["check", "pipelines/demo.toml"], ["check", "pipelines/ablation.toml"], ["config", "show", "train"]]
)
def test_checking_a_job_or_showing_its_training_keys_imports_no_torch(argv):
    """The training configs lived in modules (and packages) that import torch: `winnow check` of any job with
    [train], and `winnow config show train`, paid for torch (~2 s) to read a few dataclasses."""
    assert _loaded(argv, ("torch", "matplotlib")) == []


def test_command_table_matches_what_each_module_registers():
    registered: dict[str, str] = {}
    for module in {c.module for c in COMMANDS.values()}:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(module).register(sub)
        registered.update({a.dest: a.help for a in sub._choices_actions})
    assert registered == {name: c.help for name, c in COMMANDS.items()}
    assert set(build_parser()._subparsers._group_actions[0].choices) == set(COMMANDS)


def test_training_command_without_torch_names_the_extra(monkeypatch, capsys):
    def no_torch(name, *args, **kwargs):
        if name == "winnow.pipelines.train":
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return importlib.import_module(name, *args, **kwargs)

    monkeypatch.setattr("winnow.pipelines.cli.importlib.import_module", no_torch)
    assert main(["train", "job.toml"]) == 2
    err = capsys.readouterr().err
    assert "winnow train: error:" in err and "'torch'" in err and "pip install 'winnow[train]'" in err
    assert "torch" in EXTRA_PACKAGES["train"]


def test_a_missing_module_that_no_extra_brings_is_a_bug_not_a_hint(monkeypatch):
    def broken(name, *args, **kwargs):
        raise ModuleNotFoundError("No module named 'pipelines.trian'", name="pipelines.trian")

    monkeypatch.setattr("winnow.pipelines.cli.importlib.import_module", broken)
    with pytest.raises(ModuleNotFoundError):
        main(["train", "job.toml"])


def test_a_module_missing_where_the_command_runs_names_the_extra(monkeypatch, capsys):
    """`winnow export` imports torch when it runs, not when it parses: the hint is the same (it was a traceback)."""
    from winnow.pipelines import export

    def no_torch(args):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(export, "run_export", no_torch)
    assert main(["export", "run"]) == 2
    assert "pip install 'winnow[train]'" in capsys.readouterr().err


def test_a_path_the_system_refuses_is_one_line_naming_it(tmp_path, capsys):
    """A name past the file system's limit, a read-only folder, a folder where a file goes: the system's error
    with the path, never a traceback."""
    from tests.pipelines.report_util import healthy_records, write_run

    run = write_run(tmp_path / "run", healthy_records())
    long = tmp_path / ("x" * 300 + ".html")
    assert main(["report", str(run), "--output", str(long)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("winnow report: error: ") and "x" * 300 in err and "File name too long" in err
    assert "Traceback" not in err
    fits = tmp_path / ("y" * 250 + ".html")  # a legal name: the temporary file beside it must be legal too
    assert main(["report", str(run), "--output", str(fits)]) == 0 and fits.is_file()


def test_quiet_and_verbose_work_before_and_after_the_command():
    from winnow.pipelines.cli import verbosity

    assert verbosity(build_parser("curate").parse_args(["curate", "job.toml", "-q"])) == (0, True)
    assert verbosity(build_parser("curate").parse_args(["-v", "curate", "job.toml", "-v"])) == (2, False)
    assert verbosity(build_parser("config").parse_args(["config", "show", "dedup.exact", "-q"])) == (0, True)


def test_version_prints_the_package_version(capsys):
    from winnow.pipelines import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"winnow {__version__}"


@pytest.mark.parametrize("command", ["curate", "run"])
def test_sigterm_stops_a_curation_as_ctrl_c_does_and_says_so(command, capsys):
    """A scheduler's SIGTERM (or `timeout`) ended `winnow curate` by the default action: exit 143 without a
    word. It now stops as Ctrl-C does (pool workers terminated, outputs as after a kill), names the signal and how
    to resume, and the handler before it is back afterwards."""
    import os
    import signal
    import time

    from winnow.pipelines.cli import _run

    def work(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)  # interrupted at once
        return 0

    before = signal.getsignal(signal.SIGTERM)
    assert _run(argparse.Namespace(command=command, func=work)) == 143
    assert f"winnow {command}: stopped by SIGTERM; re-run the same command to resume" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_reader_of_stdout_that_goes_away_ends_the_command_without_a_traceback():
    """`winnow config show | head -c 10`: a BrokenPipeError traceback (an OSError naming no file)."""
    code = (
        "import os, sys\n"
        "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"  # stdout is a pipe nobody reads any more
        "from winnow.pipelines.cli import main\n"
        "sys.exit(main(['config', 'show']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr


def test_limits_of_the_process_are_said_in_one_line_with_the_way_out(monkeypatch, capsys):
    """`ulimit -n 24` or a pids limit: a polars OSError naming no file, or Arrow's "Failed to launch worker thread",
    was a traceback (exit 1)."""
    from winnow.pipelines import cli

    for err, said in (
        (OSError("Too many open files (os error 24): out/_work/keys.parquet"), "(`ulimit -n`); raise the limit"),
        (
            RuntimeError("Unknown error: Failed to launch worker thread: Resource temporarily unavailable"),
            "`ulimit -u`",
        ),
    ):

        def run(args, err=err):
            raise err

        args = argparse.Namespace(command="curate", func=run)
        assert cli._run(args) == 2
        assert said in capsys.readouterr().err


def test_checking_a_study_of_a_curated_job_imports_no_torch(tmp_path):
    """With its job curated, `winnow check` plans the study on the job's manifest and checks its reference runs
    (their tokenizer files): none of that needs torch."""
    from tests.pipelines.ablate_util import study_toml, tiny_job

    job = tiny_job(tmp_path / "job")
    toml = study_toml(tmp_path / "study.toml", job, tmp_path / "study", kind='["leave_one_out"]')
    assert _loaded(["check", str(toml)], ("torch",)) == []
