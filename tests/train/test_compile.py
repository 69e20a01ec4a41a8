"""``[train] compile = true``: each block compiled, the run the same as eager under every layout (CPU, gloo)."""

import logging

import pytest
import torch

from tests.train.parallel_workers import spawn
from tests.train.test_trainer_loop import make_trainer, run_losses, tiny_config
from winnow.train.config import TrainConfig
from winnow.train.errors import ConfigError

# each changes what a compiled block sees: replicated blocks behind a gradient all-reduce (DDP), sharded parameters
# (FSDP2), experts held by one rank with tokens dispatched to them (EP), sharded matmuls (TP)
LAYOUTS = {"ddp": {}, "fsdp2": {"dp_shard": 2, "dp_replicate": 1}, "ep": {"ep": 2}, "tp": {"tp": 2}}


def _need_inductor() -> None:
    """Inductor compiles CPU kernels with a C++ compiler; without one there is nothing to test."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as e:  # noqa: BLE001 - any failure to find the toolchain means the same: skip
        pytest.skip(f"torch inductor's C++ toolchain is not available: {e}")


@pytest.mark.slow  # inductor compiling the block's kernels takes ~30 s of CPU
def test_compiled_blocks_match_eager_in_one_process(tmp_path, caplog):
    _need_inductor()
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    eager = run_losses(make_trainer(tiny_config(tmp_path / "eager", steps=4)), 4)
    trainer = make_trainer(tiny_config(tmp_path / "compiled", steps=4, compile=True))
    with caplog.at_level(logging.INFO, logger="winnow.train.hooks"):
        compiled = run_losses(trainer, 4)
    assert counters["stats"]["unique_graphs"] > 0  # dynamo really traced the blocks
    assert all(block._compiled_call_impl is not None for block in trainer.model.blocks)
    assert compiled == pytest.approx(eager, abs=1e-4)
    logged = [r.getMessage() for r in caplog.records if r.name == "winnow.train.hooks"]
    assert len(logged) == 1 and logged[0].startswith("torch.compile: ")  # the compile time, once


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_compiled_training_matches_eager_over_20_steps(tmp_path, layout):
    _need_inductor()
    got = spawn(
        {"run_dir": str(tmp_path / "run"), "steps": 20, "parallel": layout, "compare_compile": True},
        tmp_path / "out.json",
    )
    assert len(got["compiled"]) == len(got["eager"]) == 20
    assert got["compiled"] == pytest.approx(got["eager"], abs=1e-4)


def test_compile_with_attribution_is_refused_naming_the_key():
    from winnow.train.attribution import AttributionConfig

    with pytest.raises(ConfigError, match=r"train\.compile = True .*train\.attribution"):
        TrainConfig(compile=True, attribution=AttributionConfig(every=5))
