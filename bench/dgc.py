"""Top-k gradient compression (``compression = "topk"``) against plain DDP on the demo: bytes and held-out loss.

    python bench/dgc.py                                   # the demo's 150 steps, 2 gloo ranks, density 0.01
    python bench/dgc.py --density 0.01 0.05 --momentum 0.9 --warmup-steps 15
    python bench/dgc.py --density 0.01 --momentum 0.9 --warmup-density 0.1 --warmup-steps 10 --precondition none adam

Curates ``pipelines/demo.toml`` once into ``bench/_data/dgc/`` (``winnow curate``), then trains the
demo's model on it with ``torchrun --nproc_per_node 2 -m pipelines.cli train``: uncompressed DDP
(the demo's AdamW) and one top-k run per ``--density``, the same steps, data and seed. The demo's
``[train.attribution]`` is left out (it needs each step's whole gradient; top-k refuses it). With
``--momentum`` > 0 (momentum correction) the top-k runs move AdamW's first moment into the
compression: ``betas = [0.0, beta2]``. ``--precondition none adam`` runs each top-k setting both ways: AdamW
after the exchange, or its scaling before it (``[train.parallel.topk] precondition``, also with
``betas = [0.0, beta2]``: its first moment is ``--momentum``'s). All runs go at once: nothing here is timed.

Printed per top-k run: the bytes each rank sends per step (the trainer's ``comm.bytes_sent`` in
``metrics.jsonl``: the gradient exchange and the trainer's few scalar all-reduces), over the whole
run and in the last logged interval (after the warm-up), as "N x fewer bytes" than the
uncompressed run, and the final held-out loss with its ratio to the uncompressed run's. At 2
ranks what a rank contributes to an all-reduce (ring: 2(N-1)/N of its buffer) or to an all-gather
((N-1) times its message) is exactly what it puts on the wire.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from winnow.train.optim import OptimConfig  # noqa: E402

DATA = ROOT / "bench" / "_data" / "dgc"
DEMO = ROOT / "pipelines" / "demo.toml"
KEEP = ("model", "data", "optim", "metrics")  # the demo's [train.*] tables the runs keep


def machine() -> str:
    """The CPU model and its vector flags (``lscpu``), or what Python knows."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    info = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = [f for f in info.get("Flags", "").split() if f.startswith(("avx", "fma", "amx"))]
    return f"{info.get('Model name', '?').strip()}, {os.cpu_count()} CPUs, flags {' '.join(flags) or '-'}"


def curated() -> Path:
    """The demo's shards (curated once)."""
    out = DATA / "demo"
    if not (out / "manifest.json").is_file():
        subprocess.run(
            [sys.executable, "-m", "winnow.pipelines.cli", "curate", str(DEMO), "--output", str(out)],
            cwd=ROOT,
            check=True,
        )
    return out


def _value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML for {v!r}")


def job_file(path: Path, *, steps: int, parallel: dict, optim: dict | None = None) -> Path:
    """The demo's [job] and [train] (its model, data, optimizer, logging) with ``parallel`` as [train.parallel]."""
    demo = tomllib.loads(DEMO.read_text())
    train = demo["train"]
    tables = {
        "job": {"name": demo["job"]["name"], "output": str(path.parent / "job")},
        "train": {k: v for k, v in train.items() if not isinstance(v, dict)} | {"steps": steps},
    }
    tables |= {f"train.{k}": train[k] for k in KEEP if k in train}
    if optim:
        tables["train.optim"] = tables.get("train.optim", {}) | optim
    tables["train.parallel"] = {k: v for k, v in parallel.items() if not isinstance(v, dict)} | {"backend": "gloo"}
    tables |= {f"train.parallel.{k}": v for k, v in parallel.items() if isinstance(v, dict)}
    path.write_text(
        "".join(
            f"[{name}]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in table.items()) + "\n"
            for name, table in tables.items()
        )
    )
    return path


def launch(job: Path, shards: Path, run: Path) -> subprocess.Popen:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        "-m",
        "winnow.pipelines.cli",
        "train",
        str(job),
        "--shards",
        str(shards),
        "--output",
        str(run),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    with (run.parent / f"{run.name}.log").open("w") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def summary(run: Path, steps: int) -> dict:
    """Bytes per rank and step over the run and over the last logged interval; the last held-out loss."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if "comm" in r]
    evals = [r for r in records if "eval" in r]
    last, before = logged[-1], (logged[-2]["step"] if len(logged) > 1 else 0)
    return {
        "bytes_per_step": sum(r["comm"]["bytes_sent"] for r in logged) / steps,
        "last_bytes_per_step": last["comm"]["bytes_sent"] / (last["step"] - before),
        "loss": evals[-1]["eval"]["loss"],
        "eval_step": evals[-1]["step"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=tomllib.loads(DEMO.read_text())["train"]["steps"])
    ap.add_argument("--density", type=float, nargs="+", default=[0.01], help="one top-k run per density")
    ap.add_argument("--warmup-density", type=float, default=0.25)
    ap.add_argument("--warmup-steps", type=int, default=15)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument(
        "--value-dtype",
        nargs="+",
        default=["float32"],
        choices=["float32", "bfloat16"],
        help="one run per density and each",
    )
    ap.add_argument(
        "--precondition",
        nargs="+",
        default=["none"],
        choices=["none", "adam"],
        help="one run per density and each: 'adam' moves AdamW's moments before the exchange",
    )
    ap.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    shards = curated()
    runs = {"uncompressed": ({}, None)}
    for density in args.density:
        for value_dtype, precondition in itertools.product(args.value_dtype, args.precondition):
            topk = {
                "density": density,
                "warmup_density": max(args.warmup_density, density),
                "warmup_steps": args.warmup_steps,
                "momentum": args.momentum,
                "value_dtype": value_dtype,
                "precondition": precondition,
            }
            optim = {"betas": [0.0, OptimConfig().betas[1]]} if args.momentum or precondition == "adam" else None
            name = f"topk {density:g}" + (f" {value_dtype}" if len(args.value_dtype) > 1 else "")
            name += f" {precondition}" if len(args.precondition) > 1 else ""
            runs[name] = ({"compression": "topk", "topk": topk}, optim)
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        procs = {}
        for i, (name, (parallel, optim)) in enumerate(runs.items()):
            job = job_file(out / f"run{i}.toml", steps=args.steps, parallel=parallel, optim=optim)
            procs[name] = (launch(job, shards, out / f"run{i}"), out / f"run{i}")
        for name, (proc, _) in procs.items():
            if proc.wait() != 0:
                sys.exit(f"the {name} run failed; see {procs[name][1]}.log")
        got = {name: summary(run, args.steps) for name, (_, run) in procs.items()}
    base = got["uncompressed"]
    print(f"{datetime.date.today().isoformat()}  {machine()}")
    print(f"command: {command}")
    print(
        f"demo model and data, 2 gloo ranks, {args.steps} steps; top-k warm-up from {args.warmup_density} over "
        f"{args.warmup_steps} steps, momentum correction {args.momentum}, precondition {' / '.join(args.precondition)}"
    )
    for name, r in got.items():
        print(
            f"{name:>22}: {r['bytes_per_step'] / 1e3:10.1f} kB per rank and step ({r['last_bytes_per_step'] / 1e3:.1f} "
            f"in the last interval); held-out loss {r['loss']:.4f} at step {r['eval_step']}"
        )
    for name, r in got.items():
        if name != "uncompressed":
            print(
                f"{name:>22}: {base['bytes_per_step'] / r['bytes_per_step']:.1f} x fewer bytes over the run "
                f"({base['last_bytes_per_step'] / r['last_bytes_per_step']:.1f} x after the warm-up); "
                f"held-out loss ratio {r['loss'] / base['loss']:.4f} (top-k / uncompressed)"
            )


if __name__ == "__main__":
    main()
