"""Mistakes in a job file are errors (or warnings) that name the file, the table and the key, and say what to write."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from winnow.curate.errors import ConfigError
from winnow.pipelines.cleanup import removed_on_failure
from winnow.pipelines.cli import main
from winnow.pipelines.jobfile import load_job

BASE = (
    '[job]\nname = "t"\n[[inputs]]\nsource = "docs"\npath = "d.jsonl"\n[[inputs]]\nsource = "web"\npath = "w.jsonl"\n'
)


def _load(tmp_path, body: str, base: str = BASE):
    path = tmp_path / "t.toml"
    path.write_text(base + body)
    return load_job(path)


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (
            'kind = "filter.length"\nsources = ["doc"]',
            r"\(filter\.length\) key 'sources': no input has source 'doc' \(did you mean 'docs'\?\); the inputs' "
            r"sources: docs, web",
        ),
        (
            'kind = "mix"\nweights = { docs = 1.0, wbe = 2.0 }',
            r"\(mix\) key 'weights': no input has source 'wbe' "
            r"\(did you mean 'web'\?\)",
        ),
    ],
    ids=["stage-scope", "mix-weights"],
)
def test_a_stage_key_naming_a_source_no_input_has_is_an_error(tmp_path, stage, message):
    with pytest.raises(ConfigError, match=r"t\.toml \[\[stages\]\] #1 " + message):
        _load(tmp_path, f"[[stages]]\n{stage}\n")


def test_training_tables_naming_a_source_the_job_does_not_curate_are_errors(tmp_path, capsys):
    path = tmp_path / "t.toml"
    path.write_text(BASE + "[train]\nsteps = 5\neval_every = 1\n[train.stop]\nthresholds = { dcos = 2.0 }\n")
    assert main(["check", str(path)]) == 2
    assert (
        "t.toml [train.stop] key 'thresholds': no input has source 'dcos' (did you mean 'docs'?)"
        in capsys.readouterr().err
    )


def test_an_unknown_source_is_only_a_warning_when_an_input_reads_sources_from_a_column(tmp_path, caplog):
    base = BASE + '[[inputs]]\nsource_field = "site"\npath = "s.jsonl"\n'
    with caplog.at_level(logging.WARNING):
        job = _load(tmp_path, '[[stages]]\nkind = "dedup.exact"\nsources = ["forum"]\n', base=base)
    assert job.stages[0].config.sources == ["forum"]
    assert "no input has source 'forum'" in caplog.text and "source_field column 'site'" in caplog.text


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[job]\nname = "t"\nsteps = 10\n', r"\[job\]: unknown key 'steps' \(it belongs in \[train\]"),
        ("[train]\nbatch_size = 4\n", r"\[train\]: unknown key 'batch_size' \(it belongs in \[train\.data\]\)"),
        (
            "[output]\nthreshold = 0.8\n",
            r"\[output\]: unknown key 'threshold' \(it belongs in \[\[stages\]\] kind = \"dedup\.minhash\"\)",
        ),
    ],
    ids=["job-train", "train-data", "output-stage"],
)
def test_a_key_in_the_wrong_table_says_where_it_belongs(tmp_path, capsys, body, message):
    path = tmp_path / "t.toml"
    path.write_text(
        body + '[[inputs]]\nsource = "a"\npath = "x"\n' + ('[job]\nname = "t"\n' if "[job]" not in body else "")
    )
    assert main(["check", str(path)]) == 2
    assert re.search(r"t\.toml " + message, capsys.readouterr().err)


def test_a_key_above_every_table_says_where_it_belongs(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text("steps = 10\n" + BASE)
    with pytest.raises(ConfigError, match=r"t\.toml: key 'steps' is outside every table \(it belongs in \[train\]"):
        load_job(path)


def test_a_misspelt_table_gets_a_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown table \[trian\] \(did you mean \[train\]\?\)"):
        _load(tmp_path, "[trian]\nsteps = 3\n")


def test_stages_written_with_single_brackets_say_to_write_double_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"t\.toml: \[stages\] must be written \[\[stages\]\] \(two brackets\)"):
        _load(tmp_path, '[stages]\nkind = "clean"\n')


def test_train_on_a_job_without_a_train_table_is_an_error(tmp_path, capsys):
    path = tmp_path / "t.toml"
    path.write_text(BASE.replace('name = "t"', f'name = "t"\noutput = "{tmp_path / "out"}"'))
    assert main(["train", str(path)]) == 2
    assert "t.toml: no [train] table" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["check", "train", "ablate"])
@pytest.mark.parametrize("shards", ["", "shards = []\n"])
def test_a_train_table_with_no_data_to_train_on_says_where_data_comes_from(tmp_path, capsys, command, shards):
    """No [job] table and no train.shards (or an empty list): every command says how to give data (check said ok,
    train and ablate raised TypeErrors)."""
    path = tmp_path / "t.toml"
    path.write_text(f"[train]\nsteps = 2\n{shards}" + ('[ablate]\nkind = "weights"\n' if command == "ablate" else ""))
    assert main([command, str(path)]) == 2
    assert "no data to train on; set train.shards" in capsys.readouterr().err


def _shards(folder):
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["some text here"] * 4, "source": ["a"] * 4}), folder / "train-0.parquet")
    return folder


def _failing_train_job(tmp_path, output):
    """A [train] table that passes validation and fails while the trainer is built (its tokenizer is missing)."""
    path = tmp_path / "t.toml"
    path.write_text(
        f'[train]\nshards = "{_shards(tmp_path / "corpus")}"\noutput = "{output}"\n'
        f'[train.tokenizer]\npath = "{tmp_path / "no-tokenizer"}"\n'
    )
    return path


def test_a_failed_train_removes_the_run_folder_it_created(tmp_path, capsys):
    path = _failing_train_job(tmp_path, tmp_path / "out" / "t" / "train")
    assert main(["train", str(path)]) == 2
    assert "no-tokenizer" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # the run folder and the parents made for it


def test_a_failed_train_leaves_a_folder_it_did_not_create(tmp_path):
    run = tmp_path / "mine"
    run.mkdir()
    (run / "notes.txt").write_text("the user's")
    assert main(["train", str(_failing_train_job(tmp_path, run))]) == 2
    assert (run / "notes.txt").read_text() == "the user's"


def test_a_run_folder_with_a_recorded_step_is_kept_after_a_failure(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(RuntimeError), removed_on_failure(run):
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
        raise RuntimeError("a later step failed")
    assert (run / "metrics.jsonl").is_file()


def test_run_validates_train_before_curating(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "a document"}) + "\n")
    path = tmp_path / "t.toml"
    path.write_text(
        f'[job]\nname = "t"\noutput = "{tmp_path / "out"}"\n[[inputs]]\nsource = "docs"\n'
        f'path = "{tmp_path / "d.jsonl"}"\n[train]\nstesp = 3\n'
    )
    assert main(["run", str(path)]) == 2
    assert "[train]: unknown key 'stesp' (did you mean 'steps'?)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing was curated


def test_check_validates_every_table_and_writes_nothing(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "a document"}) + "\n")
    job = (
        f'[job]\nname = "t"\noutput = "{tmp_path / "out"}"\n[[inputs]]\nsource = "docs"\npath = "{tmp_path / "d.jsonl"}"\n'
        '[[stages]]\nkind = "dedup.exact"\n[train]\nsteps = 5\n[ablate]\nkind = "leave_one_out"\n'
    )
    path = tmp_path / "t.toml"
    path.write_text(job)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "t.toml: ok" in out and "docs (1 file)" in out and "5 steps" in out and "leave_one_out" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "t.toml"]
    path.write_text(job.replace('kind = "leave_one_out"', 'kind = "leave_one_out"\nseeds = 2'))
    assert main(["check", str(path)]) == 2
    assert "[ablate]: unknown key 'seeds'" in capsys.readouterr().err
    path.write_text(job.replace(str(tmp_path / "d.jsonl"), str(tmp_path / "missing.jsonl")))
    assert main(["check", str(path)]) == 2
    assert "input docs: " in capsys.readouterr().err
    # what the commands refuse at once, check refuses too (it said ok)
    for change, message in (
        (("steps = 5", f'steps = 5\ninit_from = "{tmp_path / "no-run"}"'), "key 'init_from': .*no-run does not exist"),
        (("steps = 5", f'steps = 5\ntokenizer = "{tmp_path / "no-tok"}"'), "key 'tokenizer.path': .*does not exist"),
        (
            ('kind = "leave_one_out"', 'kind = "random_mixes"\ntarget = "dosc"'),
            "key 'target': no input has source 'dosc'",
        ),
        (
            ('kind = "leave_one_out"', 'kind = "drop"\ndrop = ["dedup.minhash"]'),
            r"ablate.drop\[0\] = 'dedup.minhash' is not",
        ),
    ):
        path.write_text(job.replace(*change))
        assert main(["check", str(path)]) == 2
        assert re.search(message, capsys.readouterr().err)


def test_an_evaluation_cap_that_leaves_sources_out_names_them_once(tmp_path, caplog):
    """eval_batches = 1 (64 tokens) ends inside the first held-out documents: the sources it never reached have no
    held-out loss, and the first such evaluation says which and what to set (ablation tables showed None)."""
    from tests.pipelines.test_resume_records import cfg_for, fit
    from tests.train.shards_util import make_docs, write_job

    long = [{**d, "text": d["text"] * 20} for d in make_docs(12)]  # held-out documents of ~1,000 tokens
    job = write_job(tmp_path / "job", [make_docs(40)], val=[long])
    with caplog.at_level("WARNING", logger="winnow.train.trainer"):
        fit(cfg_for(job, tmp_path / "run", eval_every=2, eval_batches=1))
    said = [r.getMessage() for r in caplog.records if "held-out loss for" in r.getMessage()]
    assert len(said) == 1 and "eval_batches = 1 (64 tokens a pass)" in said[0]


def test_a_source_the_whole_val_split_lacks_is_said_once_not_as_an_evaluation_cap(tmp_path, caplog):
    """With eval_batches unset nothing was said of a source whose every val row was rejected (its held-out loss
    null in every record); the cap's advice, to raise eval_batches, would not have helped."""
    from tests.pipelines.test_resume_records import cfg_for, fit
    from tests.train.shards_util import make_docs, write_job

    docs = make_docs(40)
    val = [d for d in make_docs(12) if d["source"] == docs[0]["source"]]  # one source only
    job = write_job(tmp_path / "job", [docs], val=[val], sources=sorted({d["source"] for d in docs}))
    with caplog.at_level("WARNING", logger="winnow.train.trainer"):
        fit(cfg_for(job, tmp_path / "run", eval_every=2))
    said = [r.getMessage() for r in caplog.records if "held-out loss for" in r.getMessage()]
    assert len(said) == 1 and "the val split holds none of their rows" in said[0] and "eval_batches" not in said[0]


@pytest.mark.parametrize(
    ("command", "key"),
    [("check", "train"), ("train", "train"), ("ablate", "train"), ("check", "ablate"), ("ablate", "ablate")],
)
def test_a_run_or_study_folder_equal_to_the_job_folder_it_trains_on_is_refused_before_anything_is_written(
    tmp_path, capsys, command, key
):
    """Before curation the folder does not exist: a study claimed it (its marker) and later trained among the shards."""
    job = tmp_path / "job"
    table = f'output = "{job}"\n' if key == "train" else ""
    study = '[ablate]\nkind = "weights"\n' + (f'output = "{job}/"\n' if key == "ablate" else "")
    path = tmp_path / "t.toml"
    path.write_text(f'[job]\nname = "t"\noutput = "{job}"\n[train]\nsteps = 2\n{table}{study}')
    assert main([command, str(path)]) == 2
    err = capsys.readouterr().err
    assert (
        f"t.toml [{key}] key 'output'" in err and f"= '{job}" in err and "is a curated job folder the run reads" in err
    )
    assert not job.exists()


def test_a_job_folder_and_a_run_folder_refuse_each_other(tmp_path, capsys):
    from winnow.curate.errors import OutputError
    from winnow.curate.outdir import claim
    from winnow.train.errors import ConfigError as TrainConfigError
    from winnow.train.runfolder import claim_run_folder

    curated, run = tmp_path / "curated", tmp_path / "run"
    claim(curated, "t")
    with pytest.raises(TrainConfigError, match=r"train\.output = '.*curated' is a job folder `winnow curate` wrote"):
        claim_run_folder(curated)
    claim_run_folder(run)
    with pytest.raises(OutputError, match=r"output folder .*run is a training run's or a study's folder"):
        claim(run, "t")
    assert sorted(p.name for p in curated.iterdir()) == [".winnow-output"]
    assert sorted(p.name for p in run.iterdir()) == [".winnow-run"]


@pytest.mark.parametrize(
    "job",
    sorted(p.name for p in (Path(__file__).parents[2] / "pipelines").glob("*.toml") if p.name != "continue.toml"),
)
def test_check_passes_every_shipped_job_file(job, capsys, monkeypatch):
    """Each is checked as the command a user runs on it (a study varying the curation trains on its job's output).
    continue.toml starts from continue_base.toml's run, which check finds missing until that has run."""
    monkeypatch.chdir(Path(__file__).parents[2])
    assert main(["check", f"pipelines/{job}"]) == 0, capsys.readouterr().err
    assert f"pipelines/{job}: ok" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["check", "ablate"])
def test_a_study_on_a_list_of_shard_sets_is_refused_naming_the_key(tmp_path, capsys, command):
    path = tmp_path / "t.toml"
    path.write_text(
        f'[train]\nsteps = 2\nshards = [{{path = "{tmp_path / "a"}"}}, {{path = "{tmp_path / "b"}"}}]\n'
        '[ablate]\nkind = "leave_one_out"\n'
    )
    assert main([command, str(path)]) == 2
    assert (
        "t.toml [train] key 'shards': a study re-mixes the sources of one curated job folder" in capsys.readouterr().err
    )


def test_check_refuses_the_run_folders_train_would_refuse_writing_nothing(tmp_path, capsys):
    """`winnow run` checks before it curates: a run folder holding a user's files, one inside the job's own shards/,
    and a study's folder are refused by check, not after curation."""
    job = tmp_path / "job"
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    study = tmp_path / "study"
    (study / "ablation").mkdir(parents=True)
    (study / ".winnow-run").write_text("")
    cases = {
        mine: "holds files winnow did not write (notes.txt)",
        job / "shards" / "parquet" / "run": "lies in shards of the job folder",
        study: "is a study (`winnow ablate` wrote",
    }
    for output, message in cases.items():
        path = tmp_path / "t.toml"
        path.write_text(f'[job]\nname = "t"\noutput = "{job}"\n[train]\nsteps = 2\noutput = "{output}"\n')
        assert main(["check", str(path)]) == 2
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"] and not job.exists()
    assert main(["train", str(path)]) == 2  # the study's folder: train refuses it too
    assert "is a study (`winnow ablate` wrote" in capsys.readouterr().err
    assert sorted(p.name for p in study.iterdir()) == [".winnow-run", "ablation"]


def test_check_refuses_a_model_the_checkpoints_it_would_resume_from_do_not_fit(tmp_path, capsys):
    """`winnow train` refuses it at start; check says it too (and `winnow run`, before it curates)."""
    import dataclasses

    from winnow.train.config import TrainConfig
    from winnow.train.model.config import ModelConfig

    run = tmp_path / "run"
    saved = TrainConfig(output=str(run), model=ModelConfig(dim=32, n_heads=2, n_layers=1, n_experts=2, top_k=1))
    (run / "checkpoints" / "step-00000003").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(saved)))
    (run / ".winnow-run").write_text("")
    path = tmp_path / "t.toml"
    model = "[train.model]\ndim = 64\nn_heads = 2\nn_layers = 1\nn_experts = 2\ntop_k = 1\n"
    path.write_text(f'[job]\nname = "t"\noutput = "{tmp_path / "job"}"\n[train]\noutput = "{run}"\n{model}')
    assert main(["check", str(path)]) == 2
    assert "differs in dim (the run's 32, this config's 64)" in capsys.readouterr().err
    path.write_text(path.read_text().replace("dim = 64", "dim = 32"))
    (tmp_path / "job").mkdir()  # the shards it trains on, which check reads as training does
    pq.write_table(pa.table({"text": ["a document"]}), tmp_path / "job" / "a.parquet")
    assert main(["check", str(path)]) == 0


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('shards = "{tmp}/nosuch"', r"nosuch: no manifest.json, and no such folder"),
        ('shards = "{tmp}/data"\n[train.stop]\npatience = 2', r"train.stop: its rules read held-out losses"),
        ('shards = "{tmp}/data"\neval = ["{tmp}/nosuch"]', r"train.eval = '.*nosuch' does not exist"),
        (
            'shards = "{tmp}/data"\nreplay = {{from = "{tmp}/nosuch", share = 0.1}}',
            r"train.replay.from = '.*nosuch' does not exist",
        ),
        ('shards = "{tmp}/data"\neval = [""]', r"train.eval = '' is invalid"),
        ('shards = "{tmp}/data"\ninit_from = ""', r"train.init_from = '' is invalid"),
        ('shards = "{tmp}/data"\ntokenizer = ""', r"train.tokenizer.path = '' is invalid"),
        ('shards = "{tmp}/data"\n[train.distill]\nteacher = ""', r"train.distill.teacher = '' is invalid"),
    ],
    ids=["no-shards", "stop-without-held-out-rows", "no-eval-folder", "no-replay-folder", "empty-eval",
         "empty-init-from", "empty-tokenizer", "empty-teacher"],
)  # fmt: skip
def test_check_refuses_the_data_train_refuses_at_once_with_its_message(tmp_path, capsys, table, message):
    """`winnow check` said ok; `winnow train` stopped at once."""
    from tests.pipelines.tiny import TINY_MODEL

    (tmp_path / "data" / "train").mkdir(parents=True)  # Parquet without a manifest or a val split
    pq.write_table(pa.table({"text": ["a document"] * 4}), tmp_path / "data" / "train" / "a.parquet")
    path = tmp_path / "t.toml"
    path.write_text(f'[train]\noutput = "{tmp_path / "run"}"\nsteps = 2\n{table.format(tmp=tmp_path)}\n{TINY_MODEL}')
    said = {}
    for command in ("check", "train"):
        assert main(["-q", command, str(path)]) == 2
        said[command] = capsys.readouterr().err.strip().splitlines()[-1].split(": error: ", 1)[-1]
    assert re.search(message, said["check"]) and said["check"] == said["train"]
    assert not (tmp_path / "run").exists()


def _one_input_job(tmp_path, output, source: str, rest: str):
    """A job file curating one JSONL document as ``source`` into ``output``, then the tables in ``rest``."""
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "a document of words"}) + "\n")
    path = tmp_path / "t.toml"
    path.write_text(
        f'[job]\nname = "t"\noutput = "{output}"\n[[inputs]]\nsource = "{source}"\npath = "{tmp_path / "d.jsonl"}"\n'
        + rest
    )
    return path


@pytest.mark.parametrize(
    ("study", "message"),
    [
        (
            'kind = "drop"\ndrop = ["clean", "clean"]',
            r"ablate\.drop\[1\]: the same change is listed twice \('drop_clean'\)",
        ),
        (
            "kind = \"settings\"\nsettings = { 'filter.length.min_words' = [3, 3] }",
            r"ablate\.settings\.'filter\.length\.min_words' = 3: the same change is listed twice",
        ),
    ],
)
def test_a_curation_variant_listed_twice_is_refused_by_check(tmp_path, capsys, study, message):
    rest = '[[stages]]\nkind = "clean"\n[[stages]]\nkind = "filter.length"\nmin_words = 2\n'
    path = _one_input_job(tmp_path, tmp_path / "out", "docs", rest + f"[train]\nsteps = 2\n[ablate]\n{study}\n")
    assert main(["check", str(path)]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


def test_file_urls_name_local_folders_for_train_and_report(tmp_path, monkeypatch):
    """``file:///a/b`` was read as the relative path ``file:/a/b``: a folder ``file:`` appeared in the current one."""
    from tests.pipelines.ablate_util import TINY_MODEL, tiny_job

    monkeypatch.chdir(tmp_path)
    job = tiny_job(tmp_path / "job")
    path = tmp_path / "t.toml"
    path.write_text(
        f'[train]\nshards = "file://{job}"\noutput = "file://{tmp_path / "run"}"\nsteps = 2\n{TINY_MODEL}\n'
    )
    assert main(["-q", "train", str(path)]) == 0
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    assert main(["report", f"file://{tmp_path / 'run'}"]) == 0
    assert (tmp_path / "run" / "report.html").is_file() and not (tmp_path / "file:").exists()


def test_the_run_folder_checks_know_every_folder_curate_owns():
    from winnow.curate.outdir import OWN_ENTRIES
    from winnow.train.runfolder import CURATED_ENTRIES

    assert set(CURATED_ENTRIES) == {e for e in OWN_ENTRIES if "." not in e}  # train never imports curate


def test_run_checks_train_as_it_trains_it_and_check_the_study_as_ablate_does(tmp_path, capsys):
    """`winnow run --steps` on a file holding [ablate] (a TypeError), and study-only rules or a stale manifest
    blocking `winnow run` (which never reads [ablate]): each is the command's own check."""
    from tests.pipelines.ablate_util import tiny_job
    from winnow.pipelines.check import validate

    job = tiny_job(tmp_path / "job")  # curated: code and prose
    path = _one_input_job(
        tmp_path,
        job,
        "docs2",
        f'[train]\nsteps = 4\n[train.mixing]\nadaptive = "doremi"\nreference = "{job}"\n'
        '[ablate]\nkind = "leave_one_out"\nsources = ["docs2"]\n',
    )
    checked = validate(path, train_overrides={"steps": 2}, study=False)  # as `winnow run --steps 2` checks it
    assert checked.train.steps == 2 and checked.train.mixing.adaptive == "doremi"
    with pytest.raises(ConfigError, match=r"\[train\.mixing\] key 'adaptive': a study sets every run's mix"):
        validate(path)  # `winnow check`: as the study trains it
    path.write_text(path.read_text().replace('[train.mixing]\nadaptive = "doremi"\n', "[train.mixing]\n"))
    assert validate(path).ablate.sources == ["docs2"]  # the inputs' source: curation makes it (the manifest lacks it)


def test_a_run_folder_inside_a_job_folder_it_evaluates_or_replays_is_refused(tmp_path, capsys):
    from tests.pipelines.ablate_util import tiny_job

    job, other = tiny_job(tmp_path / "job"), tiny_job(tmp_path / "other")
    for table, output in ((f'eval = ["{job}", "{other}"]', other / "shards" / "run"),
                          (f'replay = {{from = "{other}", share = 0.1}}', other / "rejects" / "run")):  # fmt: skip
        path = tmp_path / "t.toml"
        path.write_text(f'[train]\nshards = "{job}"\noutput = "{output}"\nsteps = 2\n{table}\n')
        assert main(["check", str(path)]) == 2
        assert f"lies in {output.parent.name} of the job folder {other}" in capsys.readouterr().err
    assert not (other / "shards" / "run").exists()


@pytest.mark.parametrize("url", ["file://{}", "file://localhost{}", "file:{}"])
def test_every_form_of_a_file_url_is_its_local_folder(tmp_path, url):
    from winnow.curate.workdir import local_path

    assert local_path(url.format("/a/b")) == Path("/a/b") and local_path("a/b") == Path("a/b")


def test_run_trains_on_the_shards_train_names_and_follows_output_only_for_its_own(tmp_path):
    """`[train] shards = "X"` in a job that curates was replaced by the job's output without a word: `winnow run`
    trained on other data than the file names. Its own `[job] output` (or none) still follows `--output`."""
    from tests.pipelines.ablate_util import tiny_job
    from winnow.pipelines.check import validate

    other = tiny_job(tmp_path / "other")
    path = _one_input_job(tmp_path, tmp_path / "mine", "docs", f'[train]\nsteps = 2\nshards = "{other}"\n')
    assert validate(path, study=False).train.shards == str(other)
    moved = tmp_path / "moved"
    for shards in (f'shards = "{tmp_path / "mine"}"\n', ""):
        path = _one_input_job(tmp_path, tmp_path / "mine", "docs", f"[train]\nsteps = 2\n{shards}")
        assert validate(path, output=str(moved), study=False).train.shards == str(moved)


@pytest.mark.parametrize(
    ("table", "command", "said"),
    [
        ('[train]\nsteps = 2\noutput = "s3://bucket/run"\n', "check", r"train\.output = 's3://bucket/run' is invalid"),
        ('[train]\nsteps = 2\n[ablate]\nkind = "weights"\noutput = "s3://bucket/study"\n', "check",
         r"ablate\.output = 's3://bucket/study' is invalid"),
    ],
)  # fmt: skip
def test_an_output_that_must_be_local_given_as_a_url_is_refused_naming_the_key(tmp_path, capsys, table, command, said):
    """Read as a path, `s3://bucket/run` was a folder `s3:` in the current one: the run or study went there, and
    nothing reached the store."""
    path = _one_input_job(tmp_path, tmp_path / "job", "docs", table)
    assert main([command, str(path)]) == 2
    assert re.search(said, capsys.readouterr().err)
    assert not (Path.cwd() / "s3:").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "RUN", "--output", "s3://bucket/export"],
        ["report", "RUN", "--output", "s3://bucket/report.html"],
        ["tokenizer", "train", "RUN", "--output", "s3://bucket/tok"],
    ],
)
def test_a_command_output_given_as_a_url_is_refused(tmp_path, capsys, argv):
    argv = [str(tmp_path) if a == "RUN" else a for a in argv]
    assert main(argv) == 2
    assert "--output = 's3://bucket/" in capsys.readouterr().err
    assert not (Path.cwd() / "s3:").exists()


def test_a_job_output_under_home_written_with_a_tilde_goes_there(tmp_path, monkeypatch):
    """`output = "~/out"` wrote a folder `~` in the current one, while the ownership checks (through fsspec) read
    the home folder's: a later `rm -rf ~` of that stray folder would have been the user's home."""
    from winnow.curate.pipeline import run_job

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    path = _one_input_job(tmp_path, "~/out", "docs", "")
    run_job(load_job(path), progress=False)
    assert (tmp_path / "home" / "out" / "manifest.json").is_file() and not (tmp_path / "~").exists()


@pytest.mark.parametrize(
    "error",
    [MemoryError("Unable to allocate 8.00 TiB for an array"), RuntimeError("[enforce fail] DefaultCPUAllocator: "
     "can't allocate memory: you tried to allocate 68719476736 bytes")],
)  # fmt: skip
def test_settings_that_need_more_memory_than_the_machine_has_are_one_line(monkeypatch, capsys, error):
    """`batch_size = 2**40`, `dim = 65536`: numpy's ArrayMemoryError or torch's allocator error as a traceback."""
    import winnow.pipelines.check as check

    def fail(*_a, **_k):
        raise error

    monkeypatch.setattr(check, "validate", fail)
    assert main(["check", "job.toml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("winnow check: error: out of memory (") and "lower the model's sizes" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(("table", "key"), [("[train.model]\nnorm_eps = -1.0\n", "norm_eps"),
                                            ("[train.data]\nseed = -1\nshuffle_window = 4\n", "seed")])  # fmt: skip
def test_a_norm_eps_at_or_below_zero_and_a_negative_data_seed_are_refused(tmp_path, capsys, table, key):
    """norm_eps = -1 trained every step NaN and skipped, exit 0; seed = -1 was numpy's ValueError at the first batch."""
    path = _one_input_job(tmp_path, tmp_path / "job", "docs", f"[train]\nsteps = 2\n{table}")
    assert main(["check", str(path)]) == 2
    assert f".{key} = -1" in capsys.readouterr().err


def test_run_output_moves_the_run_folder_only_where_train_names_none_and_a_bom_is_read(tmp_path):
    """`winnow run --output X` replaced an explicit `[train] output`, where its help says it does not; a job file that
    an editor saved with a byte-order mark was "not valid TOML: Invalid statement"."""
    import argparse

    from winnow.pipelines.run import train_overrides

    path = tmp_path / "t.toml"
    for table, expected in (
        ('[train]\noutput = "mine"\n', None),
        ("[train]\nsteps = 2\n", str(tmp_path / "o" / "train")),
        ('[job]\noutput = "out/j"\n[train]\noutput = "out/j/train"\n', str(tmp_path / "o" / "train")),  # the default
    ):
        path.write_bytes("\ufeff".encode() + table.encode())
        args = argparse.Namespace(job=str(path), output=str(tmp_path / "o"), steps=None, shards=None)
        assert train_overrides(args).get("output") == expected


def test_a_run_that_repeats_its_data_many_times_records_its_passes_and_says_so_once(tmp_path, caplog):
    """24 passes over the data in 3 steps were trained without a word, and no record said how many."""
    from tests.pipelines.test_resume_records import cfg_for, fit
    from tests.train.shards_util import make_docs, write_job

    job = write_job(tmp_path / "job", [make_docs(2)], val=[make_docs(2)])
    with caplog.at_level("WARNING", logger="winnow.train.trainer"):
        fit(cfg_for(job, tmp_path / "run", steps=6))
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    passes = [r["epoch"] for r in records if "loss" in r]
    assert passes == sorted(passes) and passes[-1] >= 4
    said = [r.getMessage() for r in caplog.records if "passed over its training data" in r.getMessage()]
    assert len(said) == 1 and "Muennighoff" in said[0]


def test_a_small_second_training_set_repeated_many_times_is_counted_and_named(tmp_path, caplog):
    """With several training sets only the first one's passes were counted: a tiny second set passed over again
    and again logged epoch 0 and no warning."""
    import tomllib

    from tests.pipelines.test_resume_records import fit
    from tests.pipelines.tiny import TINY_MODEL
    from tests.train.shards_util import make_docs, write_job
    from winnow.pipelines.jobfile import build_config
    from winnow.train.config import TrainConfig

    big = write_job(tmp_path / "big", [make_docs(400, prefix="b")], val=[make_docs(4, prefix="b")])
    tiny = write_job(tmp_path / "tiny", [make_docs(2, sources=("tiny",))], val=[make_docs(2, sources=("tiny",))])
    shards = [{"path": str(big), "weight": 1.0}, {"path": str(tiny), "weight": 3.0}]
    table = {"shards": shards, "output": str(tmp_path / "run"), "steps": 6, **tomllib.loads(TINY_MODEL)["train"]}
    with caplog.at_level("WARNING", logger="winnow.train.trainer"):
        fit(build_config(TrainConfig, table, "test [train]"))
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if "loss" in r][-1] >= 4
    said = [r.getMessage() for r in caplog.records if "passed over its training data" in r.getMessage()]
    assert len(said) == 1 and f"(the set {tiny} (sources: tiny))" in said[0]


def test_messages_say_what_is_wrong_with_the_path_or_key_given(tmp_path, capsys):
    """A missing report folder "held neither a job, a run nor a study"; a job file that is a folder was "(a device,
    a FIFO or a socket reads forever)"; an unknown key of `replay` listed `path, share` where the file writes `from`."""
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert f"{tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    assert main(["check", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a folder; give the path of the file itself" in err and "FIFO" not in err
    path = tmp_path / "t.toml"
    path.write_text('[train]\nsteps = 2\nshards = "x"\nreplay = {from = "y", portion = 0.1}\n')
    assert main(["check", str(path)]) == 2
    assert "allowed keys: from, share" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("table", "said"),
    [
        (
            '[output]\nformats = ["parquet", "parquet"]\n',
            r"output\.formats = \['parquet', 'parquet'\] is invalid.*each once",
        ),
        (
            "[train]\nsteps = 2\n[train.alerts]\nthroughput_drop = 5.0\n",
            r"train\.alerts\.throughput_drop = 5\.0 is invalid",
        ),
    ],
)
def test_values_that_cannot_mean_anything_are_refused_naming_the_key(tmp_path, capsys, table, said):
    """A format listed twice, a throughput alert at 5x the recent median (every interval "slow"): accepted."""
    path = _one_input_job(tmp_path, tmp_path / "job", "docs", table)
    assert main(["check", str(path)]) == 2
    assert re.search(said, capsys.readouterr().err)


def test_an_hf_builder_on_an_input_of_another_format_is_refused(tmp_path, capsys):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "a document of words"}) + "\n")
    path = tmp_path / "t.toml"
    path.write_text(
        f'[job]\nname = "t"\n[[inputs]]\nsource = "s"\npath = "{tmp_path / "d.jsonl"}"\nhf_builder = "json"\n'
    )
    assert main(["check", str(path)]) == 2
    assert "hf_builder = 'json' reads files through a Hugging Face builder" in capsys.readouterr().err


def test_check_plans_a_study_of_the_mix_on_the_curated_shards_when_the_file_also_curates(tmp_path, capsys):
    """`winnow check` skipped the study's plan when the file had [[inputs]]: a weights study of a one-source job
    passed check, and `winnow ablate` (which never curates a study of the mix) refused it at once."""
    from tests.train.shards_util import make_docs, write_job

    docs = [d for d in make_docs(20) if d["source"] == make_docs(1)[0]["source"]]
    job = write_job(tmp_path / "job", [docs], val=[docs[:2]])
    path = _one_input_job(tmp_path, job, docs[0]["source"], '[train]\nsteps = 2\n[ablate]\nkind = "weights"\n')
    assert main(["check", str(path)]) == 2
    assert "ablate.kind = 'weights' varies a source's share against the others'" in capsys.readouterr().err
    # random mixtures of one source: as many identical runs, and a NaN in mixes.json
    path = _one_input_job(tmp_path, job, docs[0]["source"], '[train]\nsteps = 2\n[ablate]\nkind = "random_mixes"\n')
    assert main(["check", str(path)]) == 2
    assert "ablate.kind = 'random_mixes' draws mixtures of the job's sources" in capsys.readouterr().err


def test_a_mix_whose_weights_sum_past_the_largest_float_is_refused(tmp_path, capsys):
    """1e308 twice summed to inf: the plan, the effects and table.csv showed both shares as 0.000."""
    path = _one_input_job(
        tmp_path, tmp_path / "job", "docs", '[ablate]\nkind = "mixes"\nmixes = {big = {docs = 1e308, code = 1e308}}\n'
    )
    assert main(["check", str(path)]) == 2
    assert "ablate.mixes.big = {'docs': 1e+308, 'code': 1e+308} is invalid" in (err := capsys.readouterr().err)
    assert "whose sum is finite" in err


@pytest.mark.parametrize(
    "text, said",
    [
        ("[]", "a JSON list, not an object"),
        ('{"held_out": {}, "weights": {"a": 1.0}}', "no held-out losses"),
        ('{"held_out": {"a": "x"}, "weights": {"a": 1.0}}', "held_out['a'] = 'x' is not a loss"),
        ('{"held_out": {"a": 2.5}, "weights": ["a"]}', "its weights are not numbers by source"),
    ],
)
def test_a_study_result_of_another_shape_is_run_again(tmp_path, caplog, text, said):
    """A result.json that was JSON of another shape stopped the study's next run with a TypeError; one without
    losses was taken as finished (its effects NaN)."""
    from winnow.pipelines.ablate.layout import StudyLayout

    layout = StudyLayout(tmp_path)
    layout.result_path("without_a").parent.mkdir(parents=True)
    layout.result_path("without_a").write_text(text)
    with caplog.at_level("WARNING"):
        assert layout.read_result("without_a") is None
    assert f"is not a finished run's result ({said}); variant without_a is run again" in caplog.text
    layout.result_path("without_a").write_text('{"held_out": {"a": 2.5, "b": null}, "weights": {"a": 1.0}}')
    assert layout.read_result("without_a")["held_out"] == {"a": 2.5, "b": None}


def test_an_empty_output_is_refused_not_taken_for_the_default(tmp_path, capsys):
    """`--output ''` or `output = ""` curated into out/<name>, which may be a folder the user did not mean."""
    path = _one_input_job(tmp_path, "", "docs", "")
    assert main(["check", str(path)]) == 2
    assert "job.output = '' is invalid; allowed: a folder or an fsspec URL (leave it out for out/t)" in (
        capsys.readouterr().err
    )
    path = _one_input_job(tmp_path, tmp_path / "out", "docs", "")
    assert main(["curate", str(path), "--output", ""]) == 2
    assert "job.output = '' is invalid" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_resume_whose_config_json_cannot_be_read_says_so(tmp_path, caplog):
    """Damaged, it let a resume with other settings (steps, lr, batch) pass without a word."""
    from winnow.pipelines.train import _records_follow
    from winnow.train.config import TrainConfig

    (tmp_path / "config.json").write_text("not json")
    with caplog.at_level(logging.WARNING):
        assert _records_follow(TrainConfig(shards="x", output=str(tmp_path)), 12, tmp_path / "config.json")
    assert f"resuming from step 12, but {tmp_path / 'config.json'} cannot be read" in caplog.text
