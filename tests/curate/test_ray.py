"""The Ray executor on a local Ray with 2 CPUs, writing to S3 (moto on 127.0.0.1).

* Every task ran in a Ray worker: its completion marker on the store records the Ray task,
  worker and node ids it ran under (``ray.get_runtime_context()``), not the driver's process.
* The shards are byte-identical to the local executor's.
* A worker killed mid-task (SIGKILL just before it publishes its second task's marker) fails
  the run; the re-run keeps the tasks that finished (same Ray task ids in their markers) and
  completes with the same bytes.

One Ray instance serves the module (start-up is slow on a loaded machine); every run is
bounded by an alarm.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
from pathlib import Path

import orjson
import pytest

from winnow.curate.errors import ConfigError
from winnow.curate.pipeline import run_job
from winnow.pipelines.jobfile import load_job

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[2]
BUCKET = "winnow-ray"
pytestmark = pytest.mark.slow

JOB = """[job]
name = "r"
output = "{out}"
workers = 2
executor = "{executor}"
keep_work = true
batch_rows = 16
group_bytes = 0  # a task per input file: tasks spread over the workers
{extra}

[[inputs]]
source = "web"
path = "{data}/web-*.jsonl"

[[stages]]
kind = "filter.length"
min_words = 3

[[stages]]
kind = "dedup.exact"

[[stages]]
kind = "split"
val_fraction = 0.2

[output]
formats = ["parquet", "webdataset"]
shard_rows = 10
"""


@contextlib.contextmanager
def deadline(seconds: int):
    def fire(*_):
        raise TimeoutError(f"no result within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def ray_cluster(s3_server):
    env = {
        k: os.environ[k]
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")
    }
    with deadline(180):
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(REPO), **env}},
        )
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    for f in range(4):
        recs = [{"id": f"w{f}-{i}", "text": f"web page {i % 13} about things {'x ' * (i % 4)}"} for i in range(30)]
        (data / f"web-{f}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    return data


def job_file(tmp_path: Path, data: Path, out: str, executor: str, extra: str = "") -> Path:
    path = tmp_path / f"job-{executor}-{hashlib.sha256(out.encode()).hexdigest()[:6]}.toml"
    path.write_text(JOB.format(out=out, executor=executor, data=data, extra=extra))
    return path


def s3fs_():
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    if not fs.exists(BUCKET):
        fs.mkdir(BUCKET)
    return fs


def stored_shards(fs, prefix: str) -> dict[str, str]:
    return {
        k[len(prefix) + 1 :]: hashlib.sha256(fs.cat_file(k)).hexdigest()
        for folder in ("shards", "rejects")
        for k in fs.find(f"{prefix}/{folder}")
    }


def local_shards(out: Path) -> dict[str, str]:
    return {
        p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in ("shards", "rejects")
        for p in sorted((out / folder).rglob("*"))
        if p.is_file()
    }


def markers(fs, prefix: str) -> dict[str, dict]:
    """Each finished map task's marker on the store: ``phase-k/task-N`` -> where it ran."""
    found = fs.glob(f"{prefix}/_work/phase-*/task-*/stats.json")
    return {"/".join(k.split("/")[-3:-1]): json.loads(fs.cat_file(k))["worker"] for k in found}


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, inputs):
    tmp = tmp_path_factory.mktemp("local")
    out = tmp / "out"
    with deadline(300):
        run_job(load_job(job_file(tmp, inputs, str(out), "local")), progress=False)
    return local_shards(out)


def test_tasks_run_in_ray_workers_and_write_the_local_executors_bytes_to_s3(ray_cluster, inputs, local_run, tmp_path):
    fs = s3fs_()
    prefix = f"{BUCKET}/same"
    with deadline(420):
        run_job(load_job(job_file(tmp_path, inputs, f"s3://{prefix}", "ray")), progress=False)
    assert stored_shards(fs, prefix) == local_run
    ran = markers(fs, prefix)
    assert len(ran) == 4 * 2  # 4 read tasks x 2 map phases (split at exact dedup's barrier)
    node = ray.get_runtime_context().get_node_id()
    for where in ran.values():
        assert where["pid"] != os.getpid()  # not the driver: a Ray worker process
        assert where["ray"]["node_id"] == node and len(where["ray"]["worker_id"]) > 16
    task_ids = [w["ray"]["task_id"] for w in ran.values()]
    assert len(set(task_ids)) == len(task_ids)  # one Ray task per winnow task
    # the write markers (validation shards) ran as Ray tasks too, and wrote to the store
    assert fs.glob(f"{prefix}/_work/write-val/task-*.json")


def test_a_killed_ray_worker_is_resumed_by_a_rerun_that_keeps_finished_tasks(
    ray_cluster, inputs, local_run, tmp_path, monkeypatch
):
    fs = s3fs_()
    prefix = f"{BUCKET}/killed"
    job = job_file(tmp_path, inputs, f"s3://{prefix}", "ray", extra="ray_max_retries = 0")
    # one worker (the first to get there) is SIGKILLed just before it publishes its second task's marker:
    # that task's outputs are on the store, unmarked; its first task is finished
    monkeypatch.setenv("WINNOW_CRASH_AT", "before:2@store:stats.json")
    monkeypatch.setenv("WINNOW_CRASH_ONCE", str(tmp_path / "fired"))
    with deadline(420), pytest.raises(ray.exceptions.RayError):
        run_job(load_job(job), progress=False)
    assert (tmp_path / "fired").exists()
    before = markers(fs, prefix)
    assert 1 <= len(before) < 8
    unmarked = {"/".join(k.split("/")[-3:-1]) for k in fs.glob(f"{prefix}/_work/phase-*/task-*/*.parquet")} - set(
        before
    )
    assert unmarked, "the killed task's uploads, without their marker"
    monkeypatch.delenv("WINNOW_CRASH_AT")
    monkeypatch.delenv("WINNOW_CRASH_ONCE")
    with deadline(420):
        run_job(load_job(job), progress=False)
    after = markers(fs, prefix)
    assert len(after) == 8
    assert {t: after[t] for t in before} == before  # finished tasks were not run again
    assert all(
        after[t]["ray"]["task_id"] not in {w["ray"]["task_id"] for w in before.values()}
        for t in set(after) - set(before)
    )
    assert stored_shards(fs, prefix) == local_run


def test_a_ray_address_that_cannot_be_reached_names_the_key(inputs, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed once the block ends: nothing listens there
    job = load_job(job_file(tmp_path, inputs, str(tmp_path / "out"), "ray", extra=f'ray_address = "127.0.0.1:{port}"'))
    with (
        deadline(60),
        pytest.raises(
            ConfigError,
            match=rf"job\.ray_address = '127\.0\.0\.1:{port}' cannot be reached"
            r".*ray start --head",
        ),
    ):
        run_job(job, progress=False)
    assert not (tmp_path / "out").exists()  # refused before the output folder is touched
    with pytest.raises(ConfigError, match=r"job\.ray_address = 'x:1' is set but job\.executor = 'local'"):
        load_job(job_file(tmp_path, inputs, str(tmp_path / "out2"), "local", extra='ray_address = "x:1"'))
