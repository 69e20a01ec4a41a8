"""Installed, winnow is one package: ``winnow.curate``, ``winnow.train``, ``winnow.pipelines``."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import winnow
from winnow.pipelines import __version__

ROOT = Path(__file__).resolve().parents[2]


def test_import_winnow_has_its_version():
    assert winnow.__version__ == __version__ and __version__.count(".") >= 1


def test_a_users_own_train_and_pipelines_beside_a_script_do_not_shadow_winnow(tmp_path):
    (tmp_path / "train.py").write_text("raise SystemExit('the user train.py was imported')\n")
    (tmp_path / "curate.py").write_text("raise SystemExit('the user curate.py was imported')\n")
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "__init__.py").write_text("raise SystemExit('the user pipelines/ was imported')\n")
    script = tmp_path / "script.py"
    script.write_text(
        "import winnow.train.model, winnow.curate.stages\nfrom winnow.pipelines.cli import main\n"
        "print(winnow.train.model.__name__, winnow.curate.stages.__name__)\nmain(['--version'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # as a user runs it: the script's folder first
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["winnow.train.model", "winnow.curate.stages", "winnow", winnow.__version__]


def test_every_package_folder_is_listed_for_the_build():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {name: ROOT / folder for name, folder in setup["package-dir"].items()}
    found = {"winnow"}
    for name in ("curate", "train", "pipelines"):
        for folder in [roots[f"winnow.{name}"], *roots[f"winnow.{name}"].rglob("*")]:
            if folder.is_dir() and any(folder.glob("*.py")) and folder != roots["winnow"]:
                found.add("winnow." + ".".join((name, *folder.relative_to(roots[f"winnow.{name}"]).parts)).rstrip("."))
    assert sorted(setup["packages"]) == sorted(found)
