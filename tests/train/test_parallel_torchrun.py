"""``winnow train`` under ``torchrun --nproc_per_node 2`` (gloo) on a tiny job: one run folder, written by rank 0."""

import json
import os
import subprocess
import sys

import pytest

from tests.train.shards_util import make_docs, write_job

pytestmark = pytest.mark.slow


def torchrun_train(job: str, env: dict) -> subprocess.CompletedProcess:
    """``winnow -q train JOB`` under ``torchrun --nproc_per_node 2`` (--standalone: a rendezvous on a free port)."""
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + ["-m", "winnow.pipelines.cli", "-q", "train", job],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize("layout", ["ep = 2", "tp = 2"])
def test_winnow_train_under_torchrun_two_processes(tmp_path, layout):
    docs = make_docs(60)
    write_job(tmp_path / "job", [docs[:30], docs[30:]], val=[docs[:6]])
    run = tmp_path / "run"
    (tmp_path / "job.toml").write_text(f"""
[job]
output = "{tmp_path / "job"}"
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
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "winnow.pipelines.cli",
            "train",
            str(tmp_path / "job.toml"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("training done at step 3") == 1  # rank 0 prints the summary
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]  # one record per step, not one per rank
    assert steps[-1]["tokens_seen"] > 0 and (run / "checkpoints" / "step-00000003" / "state.pt").exists()


@pytest.mark.parametrize("layout", ["dp", "pp"])
def test_adaptive_mixing_under_torchrun_moves_as_one_process_with_the_same_global_batch(tmp_path, layout):
    """Two DDP ranks sum their excess losses before the weights move; under two pipeline stages the last one
    scores the micro-batches and every stage moves to its weights. Either way the mix and the losses follow
    the one-process run that takes the same global batch as two micro-batches."""
    from tests.pipelines.continue_util import make_job
    from tests.pipelines.tiny import TINY_MODEL

    job = make_job(tmp_path / "job", ("prose", "legal", "code"))
    model = TINY_MODEL.replace("n_layers = 1", "n_layers = 2")  # a stage each

    def toml(name: str, extra: str) -> str:
        path = tmp_path / f"{name}.toml"
        path.write_text(
            f'[job]\noutput = "{job}"\n[train]\noutput = "{tmp_path / name}"\nsteps = 6\neval_every = 0\n'
            f"{extra}\n{model}[train.metrics]\nlog_every = 1\n"
        )
        return str(path)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = [sys.executable, "-m", "winnow.pipelines.cli", "-q", "train"]
    mixing = (
        f'[train.mixing]\nadaptive = "doremi"\nreference = "{tmp_path / "reference"}"\nevery = 2\nstep_size = 3.0\n'
    )
    for name, extra in (("reference", ""), ("one", "grad_accum = 2\n" + mixing)):
        proc = subprocess.run(cli + [toml(name, extra)], env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
    two = mixing if layout == "dp" else "grad_accum = 2\n" + mixing + '[train.parallel]\npp = 2\npp_schedule = "1f1b"\n'
    proc = torchrun_train(toml("two", two), env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = (
        [r for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines()) if "mix_weights" in r]
        for name in ("one", "two")
    )
    weights = [[w for r in run for w in r["mix_weights"].values()] for run in (one, two)]
    assert len(two) == 6 and weights[1] == pytest.approx(weights[0], abs=2e-4)  # fp32 sums in another order
    assert two[-1]["mix_weights"] != two[0]["mix_weights"]  # three updates moved it
    assert [r["step_loss"] for r in two] == pytest.approx([r["step_loss"] for r in one], rel=1e-4)


def test_a_capped_evaluation_under_two_ranks_is_the_one_process_runs_with_the_same_global_batch(tmp_path):
    """Each data-parallel rank scores its share of the held-out pass and the sums are added: two ranks of batch 2
    report the held-out losses of one process of batch 4 (every rank scored the same batches, so the figure
    followed the per-rank batch, and each rank did all the work)."""
    from tests.pipelines.continue_util import make_job
    from tests.pipelines.tiny import TINY_MODEL

    job = make_job(tmp_path / "job", ("prose", "legal", "code"))

    def toml(name: str, batch: int) -> str:
        path = tmp_path / f"{name}.toml"
        model = TINY_MODEL.replace("batch_size = 2", f"batch_size = {batch}")
        path.write_text(
            f'[job]\noutput = "{job}"\n[train]\noutput = "{tmp_path / name}"\nsteps = 2\neval_every = 1\n'
            f"eval_batches = 3\n{model}"
        )
        return str(path)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run(
        [sys.executable, "-m", "winnow.pipelines.cli", "-q", "train", toml("one", 4)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    two = torchrun_train(toml("two", 2), env)
    assert two.returncode == 0, two.stderr[-3000:]
    evals = {
        name: [
            r["eval"]
            for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines())
            if "eval" in r
        ]
        for name in ("one", "two")
    }
    assert len(evals["one"]) == 2  # training matches within 1e-5 (test_parallel_ddp.py), and so does evaluation
    for a, b in zip(evals["one"], evals["two"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert {k for k, v in b["per_source"].items() if v is not None} == {k for k, v in a["per_source"].items() if v}
