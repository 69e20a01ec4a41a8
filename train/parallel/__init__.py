"""Distributed training on torch.distributed: DDP / FSDP2, expert parallelism, PowerSGD and top-k compression, launched by torchrun."""

from winnow.train import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "Parallel": "winnow.train.parallel.runtime",
        "ParallelConfig": "winnow.train.parallel.config",
        "World": "winnow.train.parallel.mesh",
        "exit_process": "winnow.train.parallel.mesh",
        "init_world": "winnow.train.parallel.mesh",
        "shutdown": "winnow.train.parallel.mesh",
    },
)
