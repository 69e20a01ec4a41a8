"""The replay study on the sample data: 0% replay forgets the base sources more than 25%, beyond seed noise."""

import dataclasses
import gzip
import json

import polars as pl
import pytest

from tests.pipelines.continue_util import make_job, tiny_config
from tests.train.shards_util import write_job
from winnow.pipelines.ablate.config import AblateConfig
from winnow.pipelines.ablate.layout import StudyLayout
from winnow.pipelines.ablate.replay import replay_variants
from winnow.pipelines.cli import main
from winnow.pipelines.train import build_trainer
from winnow.train.data import LoaderConfig
from winnow.train.optim import OptimConfig


def _sample_rows(source: str, n: int) -> list[dict]:
    """The first ``n`` documents of a sample source, cut to 600 characters (no curation: rows as they are)."""
    if source == "docs":
        with gzip.open("data_samples/docs/part-00000.jsonl.gz", "rt") as fh:
            texts = [json.loads(line)["text"] for _, line in zip(range(n), fh)]
    elif source == "changelog":
        with open("data_samples/changelog/part-00000.jsonl") as fh:
            texts = [json.loads(line)["text"] for _, line in zip(range(n), fh)]
    else:
        texts = pl.read_parquet("data_samples/code/part-00000.parquet")["text"].head(n).to_list()
    return [{"id": f"{source}/{i}", "source": source, "text": t[:600], "meta": None} for i, t in enumerate(texts)]


def _job(folder, sources):
    rows = {s: _sample_rows(s, 90) for s in sources}
    train = [r for s in sources for r in rows[s][:80]]
    return write_job(folder, [train[0::2], train[1::2]], val=[rows[s][80:] for s in sources], sources=list(sources))


def test_variants_per_share_and_noise_seeds():
    runs = replay_variants(AblateConfig(kind="replay", shares=[0.0, 0.25], noise_seeds=2), seed=3)
    assert [(v["name"], v["share"], v["seed"]) for v in runs] == [
        ("replay_0", 0.0, 3),
        ("replay_0.25", 0.25, 3),
        ("replay_0_seed4", 0.0, 4),
    ]
    assert runs[0]["weights"] == {"new": 1.0} and runs[1]["weights"] == {"new": 0.75, "replay": 0.25}


MODEL = """[train.model]
dim = 32
n_layers = 2
n_heads = 2
ffn_hidden = 32
n_experts = 4
top_k = 2
max_seq_len = 64
"""  # the model of every continued run here


@pytest.mark.slow
def test_no_replay_forgets_more_than_a_quarter_replay_beyond_seed_noise(tmp_path, one_thread):
    base, new = _job(tmp_path / "base", ("docs", "changelog")), _job(tmp_path / "new", ("code",))
    # long enough for the base to be past generic learning (at ~120 steps continuing on code still helps docs)
    cfg = tiny_config(base / "train", str(base), steps=200, optim=OptimConfig(lr=3e-3, warmup_steps=5))
    trainer = build_trainer(dataclasses.replace(cfg, data=LoaderConfig(batch_size=8, seq_len=64, num_workers=0)))
    trainer.fit()
    trainer.data.close()
    study = tmp_path / "study"
    toml = tmp_path / "continue.toml"
    toml.write_text(f'''[train]
output = "{tmp_path / "unused"}"
shards = "{new}"
init_from = "{base / "train"}"
replay = {{from = "{base}", share = 0.05}}
steps = 30
eval_every = 0
{MODEL}[train.optim]
lr = 3e-3
warmup_steps = 5
[train.data]
batch_size = 8
seq_len = 64
num_workers = 0
shuffle_window = 16
[train.checkpoint]
every = 0
[ablate]
kind = "replay"
shares = [0.0, 0.25]
noise_seeds = 2
output = "{study}"
''')
    assert main(["ablate", str(toml)]) == 0
    table = pl.read_csv(StudyLayout(study).table_csv)
    by_name = {r["variant"]: r for r in table.iter_rows(named=True)}
    noise = abs(by_name["replay_0"]["forgetting"] - by_name["replay_0_seed1"]["forgetting"])
    assert by_name["replay_0"]["forgetting"] > 0  # continuing on code alone raises the base sources' loss
    assert by_name["replay_0"]["forgetting"] - by_name["replay_0.25"]["forgetting"] > noise
    assert by_name["replay_0"]["gain"] > 0 and by_name["replay_0.25"]["gain"] > 0  # both learn the new source
    summary = json.loads((study / "ablation" / "replay.json").read_text())
    assert summary["old"] == ["docs", "changelog"] and summary["new"] == ["code"]
    assert (study / "ablation" / "replay.png").stat().st_size > 0 and (study / "report.html").is_file()


def test_a_replay_study_refuses_a_folder_holding_the_users_files_and_resumes_its_own(tmp_path, capsys, one_thread):
    """Its folder was never claimed: a user's ablation/table.md was overwritten, and variants/ and report.html
    added, where a mix study refuses the folder."""
    base, new = make_job(tmp_path / "base", ("prose", "legal"), n=8), make_job(tmp_path / "new", ("code",), n=8)
    cfg = tiny_config(base / "train", str(base), steps=2)
    with build_trainer(cfg) as trainer:
        trainer.fit()
    mine = tmp_path / "mine"
    (mine / "ablation").mkdir(parents=True)
    (mine / "notes.txt").write_text("my notes")
    (mine / "ablation" / "table.md").write_text("MY OWN TABLE")
    toml = tmp_path / "replay.toml"

    def study(output):
        toml.write_text(f'''[train]
shards = "{new}"
init_from = "{base / "train"}"
replay = {{from = "{base}", share = 0.05}}
steps = 2
{MODEL}[train.data]
batch_size = 2
seq_len = 32
num_workers = 0
[train.checkpoint]
every = 0
[ablate]
kind = "replay"
shares = [0.0, 0.25]
output = "{output}"
threads = 1
''')
        return toml

    for command in ("check", "ablate"):
        assert main([command, str(study(mine))]) == 2
        assert f"ablate.output = {str(mine)!r} holds files winnow did not write (ablation, notes.txt)" in (
            capsys.readouterr().err
        )
    assert sorted(p.name for p in mine.rglob("*")) == ["ablation", "notes.txt", "table.md"]
    assert (mine / "ablation" / "table.md").read_text() == "MY OWN TABLE"
    own = tmp_path / "study"
    assert main(["-q", "ablate", str(study(own))]) == 0
    mtime = StudyLayout(own).result_path("replay_0").stat().st_mtime
    assert main(["check", str(toml)]) == 0 and main(["-q", "ablate", str(toml)]) == 0  # its own: resumed, not retrained
    (own / ".winnow-run").unlink()  # a study an older winnow wrote, which did not mark its folder
    assert main(["check", str(toml)]) == 0 and main(["-q", "ablate", str(toml)]) == 0
    assert StudyLayout(own).result_path("replay_0").stat().st_mtime == mtime
