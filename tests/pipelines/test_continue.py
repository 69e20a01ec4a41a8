"""Continued pretraining: start from a run, check it fits, mix several data sets, hold out other jobs' sources."""

import dataclasses
import json
import re

import pytest

from tests.pipelines.continue_util import make_job, tiny_config
from winnow.curate.errors import ConfigError as JobFileError
from winnow.pipelines.train import build_trainer, load_train_config
from winnow.train.data.sets import ReplayConfig, ShardSetConfig
from winnow.train.errors import ConfigError
from winnow.train.init import load_init
from winnow.train.tokenizer import train_bpe


def _fit(cfg):
    with build_trainer(cfg) as trainer:
        return trainer, trainer.fit()


def _tokens_by_source(run_dir) -> dict[str, int]:
    """Training tokens per source over every logged step of a run."""
    tokens: dict[str, int] = {}
    for record in _records(run_dir, "per_source"):
        for source, figures in record["per_source"].items():
            tokens[source] = tokens.get(source, 0) + figures["tokens"]
    return tokens


def _records(run_dir, key):
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if key in r]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A base job (prose, legal), a new-domain job (code) and a short base run on the first."""
    root = tmp_path_factory.mktemp("continue")
    jobs = {"base": make_job(root / "base", ("prose", "legal")), "new": make_job(root / "new", ("code",))}
    _, summary = _fit(tiny_config(root / "base" / "train", str(jobs["base"]), steps=6))
    return root, jobs, summary


def test_step_zero_losses_are_the_base_runs_exactly(base, one_thread):
    root, jobs, base_summary = base
    cfg = tiny_config(
        root / "cont",
        str(jobs["new"]),
        steps=2,
        init_from=str(root / "base" / "train"),
        eval=[str(jobs["base"]), str(jobs["new"])],
        seed=1,
    )
    # training shuffles with another seed: held-out batches must not follow it
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, shuffle_window=8, seed=1))
    trainer, _ = _fit(cfg)
    first = _records(root / "cont", "eval")[0]
    assert first["step"] == 0
    base_losses = base_summary["eval"]["eval"]["per_source"]
    assert {s: first["eval"]["per_source"][s] for s in base_losses} == base_losses  # exact, not approximate
    assert first["eval"]["per_source"]["code"] is not None  # the new source is measured from step 0 too
    prov = trainer.init.provenance()
    assert prov["step"] == 6 and prov["run_dir"] == str(root / "base" / "train") and len(prov["sha256"]) == 64


def test_mismatched_model_or_tokenizer_is_refused_naming_the_key(base):
    root, jobs, _ = base
    run = str(root / "base" / "train")
    cfg = tiny_config(root / "bad", str(jobs["new"]), init_from=run)
    wider = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, n_layers=3, dim=64))
    with pytest.raises(ConfigError, match=r"n_layers \(base 2, this run 3\)") as err:
        build_trainer(wider)
    assert "dim (base 32, this run 64)" in str(err.value)
    bpe = train_bpe([["def f(x): return x"] * 20], vocab_size=300)
    bpe.save(root / "bpe")
    with pytest.raises(ConfigError, match="tokenizer 'byte-258', this run 'bpe-"):
        build_trainer(dataclasses.replace(cfg, tokenizer=str(root / "bpe")))


def test_init_from_a_checkpoint_file_or_url_and_bad_paths(base):
    root, _, _ = base
    run = root / "base" / "train"
    (checkpoint,) = sorted((run / "checkpoints").iterdir())
    by_file = load_init(str(checkpoint / "state.pt"))
    by_url = load_init(f"file://{run}")
    assert by_file.sha256 == by_url.sha256 and by_file.step == by_url.step == 6
    assert by_url.run_dir == f"file://{run}" and by_file.run_dir == str(run)
    with pytest.raises(ConfigError, match="train.init_from = .* does not exist"):
        load_init(str(root / "nowhere"))
    with pytest.raises(ConfigError, match="holds no checkpoints"):
        load_init(str(root / "base"))


def test_two_data_sets_mix_at_the_given_weights(base, one_thread):
    root, jobs, _ = base
    cfg = tiny_config(
        root / "mixed",
        [ShardSetConfig(path=str(jobs["base"]), weight=0.3), ShardSetConfig(path=str(jobs["new"]), weight=0.7)],
        steps=12,
    )
    _fit(cfg)
    tokens = _tokens_by_source(root / "mixed")
    share = tokens["code"] / sum(tokens.values())
    assert share == pytest.approx(0.7, abs=0.01)


def test_replay_shorthand_and_job_file_keys(base, tmp_path):
    root, jobs, _ = base
    job = tmp_path / "job.toml"
    job.write_text(
        f'[train]\neval_every = 0\nshards = "{jobs["new"]}"\ninit_from = "{root}/base/train"\n'
        f'replay = {{from = "{jobs["base"]}", share = 0.25}}\n[train.optim]\nschedule = "wsd"\n'
        "[train.stop]\npatience = 2\n"
    )
    with pytest.raises(JobFileError, match="train.stop"):  # stop rules read periodic evaluations
        load_train_config(job)
    cfg = load_train_config(job, eval_every=5)
    assert cfg.replay == ReplayConfig(path=str(jobs["base"]), share=0.25) and cfg.stop.patience == 2
    job.write_text('[train]\nreplay = {path = "x", share = 0.1}\n')
    with pytest.raises(JobFileError, match="needs 'from'"):
        load_train_config(job)


def test_per_source_weights_within_a_data_set(base, one_thread):
    root, jobs, _ = base
    cfg = tiny_config(
        root / "per_source",
        [
            ShardSetConfig(path=str(jobs["base"]), weight=0.5, sources={"prose": 1.0, "legal": 0.0}),
            ShardSetConfig(path=str(jobs["new"]), weight=0.5),
        ],
        steps=8,
    )
    _fit(cfg)
    tokens = _tokens_by_source(root / "per_source")
    assert tokens["legal"] == 0 and tokens["prose"] / sum(tokens.values()) == pytest.approx(0.5, abs=0.01)
    assert (root / "per_source" / "sources" / "set-0" / "prose" / "manifest.json").is_file()
    with pytest.raises(JobFileError, match=r"train.shards\[0\].sources: 'web' has no train rows"):
        build_trainer(tiny_config(root / "bad_source", [ShardSetConfig(path=str(jobs["base"]), sources={"web": 1.0})]))


def test_the_shipped_job_pair_parses():
    from winnow.pipelines.ablate.config import AblateConfig
    from winnow.pipelines.jobfile import build_config, load_job, read_toml

    for name in ("continue_base", "continue"):
        load_job(f"pipelines/{name}.toml")
        cfg = load_train_config(f"pipelines/{name}.toml")
    assert cfg.init_from == "out/cpt-base/train" and cfg.replay == ReplayConfig(path="out/cpt-base", share=0.05)
    assert cfg.optim.schedule == "wsd" and cfg.optim.rewarm_from == "current" and cfg.stop.sources == ["code"]
    study = build_config(AblateConfig, read_toml("pipelines/continue.toml")["ablate"], "continue.toml [ablate]")
    assert study.kind == "replay" and study.shares == [0.0, 0.01, 0.05, 0.25]


def test_init_optimizer_keeps_the_moments_not_the_hyperparameters(base):
    import torch

    from winnow.train.optim import OptimConfig

    root, jobs, _ = base
    run = root / "base" / "train"
    saved = load_init(str(run)).state
    cfg = tiny_config(
        root / "opt",
        str(jobs["new"]),
        init_from=str(run),
        init_optimizer=True,
        optim=OptimConfig(lr=1e-3, weight_decay=0.0, warmup_steps=4, rewarm_from="current"),
    )
    with build_trainer(cfg) as trainer:
        opt = trainer.optimizer
        moments = [opt.state[p]["exp_avg"] for group in opt.param_groups for p in group["params"]]
        saved_moments = [s["exp_avg"] for s in saved["optimizer"]["state"].values()]
        assert all(torch.equal(a, b) for a, b in zip(moments, saved_moments)) and len(moments) == len(saved_moments)
        assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 0.0]  # this run's, not the base's 0.1
        base_lr = saved["scheduler"]["_last_lr"][0]
        start = base_lr / 1e-3
        assert trainer.init.start_factor(cfg.optim) == pytest.approx(start)
        assert opt.param_groups[0]["lr"] == pytest.approx(1e-3 * (start + (1 - start) / 4))  # re-warm from there


def test_init_from_an_s3_run_folder(base, s3_server):
    import s3fs

    root, _, _ = base
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir("winnow-cpt")
    fs.put(str(root / "base" / "train") + "/", "winnow-cpt/runs/base", recursive=True)
    remote, local = load_init("s3://winnow-cpt/runs/base"), load_init(str(root / "base" / "train"))
    assert remote.sha256 == local.sha256 and remote.step == 6
    assert remote.run_dir == "s3://winnow-cpt/runs/base" and remote.checkpoint.startswith(
        "s3://winnow-cpt/runs/base/checkpoints/"
    )
    assert remote._run_files(["tokenizer_meta.json"]) == local._run_files(
        ["tokenizer_meta.json"]
    )  # the tokenizer check reads it


def test_a_resumed_continuation_keeps_the_record_of_the_checkpoint_it_started_from(tmp_path):
    """The base run trained on later: the resume re-read its newest checkpoint into provenance.json, naming weights
    the continuation never started from."""
    from winnow.pipelines.provenance import write_provenance
    from winnow.pipelines.train import run_inputs

    job = make_job(tmp_path / "job", ("prose",))
    _fit(tiny_config(tmp_path / "base", str(job), steps=4))

    def continued(steps):
        cfg = tiny_config(tmp_path / "cont", str(job), steps=steps, init_from=str(tmp_path / "base"))
        with build_trainer(cfg) as trainer:
            write_provenance(cfg.output, job_file=None, **run_inputs(cfg, trainer))  # as `winnow train` does
            trainer.fit()
        return json.loads((tmp_path / "cont" / "provenance.json").read_text())["init_from"]

    started = continued(2)
    assert started["step"] == 4
    _fit(tiny_config(tmp_path / "base", str(job), steps=6))  # the base trains on: its newest checkpoint is step 6
    assert continued(4) == started


def test_check_refuses_an_init_from_whose_model_or_tokenizer_differs_as_training_does(base, tmp_path, capsys):
    """`winnow check` builds the run's tokenizer and checks ``init_from`` against it and ``[train.model]`` with the
    code training uses, so the mismatch is the same message, before anything runs."""
    from winnow.pipelines.cli import main

    root, jobs, _ = base
    bpe = train_bpe([["def f(x): return x"] * 20], vocab_size=300)
    bpe.save(tmp_path / "bpe")
    job = tmp_path / "job.toml"
    for layers, tokenizer, message in [
        (2, "", None),
        (3, "", r"n_layers \(base 2, this run 3\)"),
        (2, f'[train.tokenizer]\npath = "{tmp_path / "bpe"}"\n', "tokenizer 'byte-258', this run 'bpe-"),
    ]:
        job.write_text(
            f'[train]\nshards = "{jobs["new"]}"\noutput = "{tmp_path / f"cont-{layers}-{len(tokenizer)}"}"\ninit_from = "{root / "base" / "train"}"\n'
            f"[train.model]\ndim = 32\nn_layers = {layers}\nn_heads = 2\nffn_hidden = 32\nn_experts = 4\ntop_k = 2\n"
            f"max_seq_len = 64\n[train.data]\nseq_len = 32\n{tokenizer}"
        )
        rc = main(["check", str(job)])
        err = capsys.readouterr().err
        assert not (tmp_path / f"cont-{layers}-{len(tokenizer)}").exists()  # nothing written
        if message is None:
            assert rc == 0, err
            continue
        assert rc == 2 and re.search(message, err), err
        with pytest.raises(ConfigError) as raised:  # the message training gives
            build_trainer(load_train_config(job))
        assert str(raised.value) in err


def test_check_refuses_an_init_from_that_does_not_fit_on_data_without_a_manifest(base, tmp_path, capsys):
    """A folder of Parquet files trains with the byte tokenizer: check reads ``init_from`` against it as training
    does (it skipped the check for data without a manifest.json)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from winnow.pipelines.cli import main

    root, _, _ = base
    (tmp_path / "data" / "train").mkdir(parents=True)
    pq.write_table(pa.table({"text": ["def f(x): return x"] * 8}), tmp_path / "data" / "train" / "a.parquet")
    job = tmp_path / "job.toml"
    job.write_text(
        f'[train]\nshards = "{tmp_path / "data"}"\noutput = "{tmp_path / "run"}"\ninit_from = "{root / "base" / "train"}"\n'
        "[train.model]\ndim = 32\nn_layers = 3\nn_heads = 2\nffn_hidden = 32\nn_experts = 4\ntop_k = 2\nmax_seq_len = 64\n"
        "[train.data]\nseq_len = 32\nnum_workers = 0\n"
    )
    assert main(["check", str(job)]) == 2
    err = capsys.readouterr().err
    assert re.search(r"n_layers \(base 2, this run 3\)", err), err
    assert not (tmp_path / "run").exists()  # nothing written
    with pytest.raises(ConfigError) as raised:  # the message training gives
        build_trainer(load_train_config(job))
    assert str(raised.value) in err
