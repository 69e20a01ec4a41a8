"""Distributed training on torch.distributed: DDP / FSDP2, expert parallelism, PowerSGD and top-k compression, launched by torchrun."""

from winnow.train.parallel.config import ParallelConfig
from winnow.train.parallel.mesh import World, exit_process, init_world, shutdown
from winnow.train.parallel.runtime import Parallel

__all__ = ["Parallel", "ParallelConfig", "World", "exit_process", "init_world", "shutdown"]
