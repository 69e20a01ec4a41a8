"""``winnow train`` under ``torchrun --nproc_per_node 2`` (gloo) on a tiny job: one run folder, written by rank 0."""

import json
import os
import subprocess
import sys

import pytest

from tests.train.shards_util import make_docs, write_job

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("layout", ["ep = 2", "tp = 2"])
def test_winnow_train_under_torchrun_two_processes(tmp_path, layout):
    docs = make_docs(60)
    write_job(tmp_path / "job", [docs[:30], docs[30:]], val=[docs[:6]])
    run = tmp_path / "run"
    (tmp_path / "job.toml").write_text(f"""
[job]
output = "{tmp_path / 'job'}"
[train]
output = "{run}"
steps = 3
eval_every = 0
[train.model]
dim = 32
n_layers = 2
n_heads = 2
ffn_hidden = 32
n_experts = 4
[train.data]
batch_size = 2
seq_len = 32
num_workers = 0
[train.metrics]
log_every = 1
[train.parallel]
{layout}
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # --standalone: a rendezvous on a free port (the default 29500 would clash with a concurrent test)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "pipelines.cli", "train", str(tmp_path / "job.toml")],
                          env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("training done at step 3") == 1  # rank 0 prints the summary
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]  # one record per step, not one per rank
    assert steps[-1]["tokens_seen"] > 0 and (run / "checkpoints" / "step-00000003" / "state.pt").exists()
