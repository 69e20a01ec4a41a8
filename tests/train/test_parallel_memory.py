"""Meta-device construction: under FSDP2 on 4 gloo ranks no rank ever holds more than its quarter of the
weights plus one block's, and every rank's shard is its part of the one-process model's weights."""

import json
import os
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from tests.train.parallel_workers import start
from tests.train.test_trainer_loop import tiny_config
from winnow.train.build import build_model
from winnow.train.parallel import Parallel, ParallelConfig, exit_process, shutdown

pytestmark = pytest.mark.slow

MODEL = {"vocab_size": 64, "dim": 64, "n_layers": 8, "n_heads": 4, "ffn_hidden": 64, "n_experts": 4, "top_k": 2}


def peak_bytes(prof) -> int:
    """The most CPU memory held at once over a profiled stretch: allocations (at their op) and frees in time order."""
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    held = peak = 0
    for event in events:
        held += event.self_cpu_memory_usage
        peak = max(peak, held)
    return peak


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    try:
        parallel = Parallel.from_env(ParallelConfig(dp_replicate=1, dp_shard=world), device="cpu", n_experts=4)
        cfg = tiny_config(Path(out).parent / str(rank), model=MODEL)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            model, _ = build_model(cfg, parallel)
        torch.manual_seed(0)
        full = {k: v.double().sum().item() for k, v in parallel.model_state(model).items()}  # gathered: a collective
        result = {
            "peak": peak_bytes(prof),
            "full_sums": full,
            "local": sum(p.to_local().numel() * 4 for p in model.parameters()),
        }
        Path(f"{out}.{rank}").write_text(json.dumps(result))
    finally:
        shutdown()
    exit_process(0)  # a spawned rank that finished: no finalization for gloo's threads to race


def test_fsdp2_ranks_hold_a_quarter_of_the_weights_plus_one_block_while_building(tmp_path):
    out = tmp_path / "memory.json"
    start(_worker, 4, str(out))
    ranks = [json.loads(Path(f"{out}.{r}").read_text()) for r in range(4)]
    cfg = tiny_config(tmp_path, model=MODEL)
    with torch.device("meta"):
        from winnow.train.model import Transformer

        plain = Transformer(cfg.model)
    total = sum(p.numel() for p in plain.parameters()) * 4
    units = [sum(p.numel() for p in b.parameters()) * 4 for b in plain.blocks]
    units.append(sum(p.numel() for n, p in plain.named_parameters() if not n.startswith("blocks.")) * 4)  # the root
    bound = total / 4 + max(units)
    for r in ranks:
        print(
            f"peak parameter bytes while building: {r['peak']} of {total} ({r['peak'] / total:.1%}); "
            f"bound {bound:.0f} ({bound / total:.1%}); shard {r['local']}"
        )
        assert r["local"] <= total / 4 + 4 * 4 * len(list(plain.parameters()))  # a quarter (FSDP2 pads rows)
        assert r["peak"] <= bound
    # every rank's shard is its part of the one-process model's weights, drawn the same whatever the layout
    torch.manual_seed(0)
    one = Transformer(cfg.model)
    one.init_weights(cfg.seed)
    expected = {k: v.double().sum().item() for k, v in one.state_dict().items()}
    assert ranks[0]["full_sums"] == pytest.approx(expected, rel=1e-6)
