"""The training data path: job shards -> tokens -> packed batches with per-token source ids."""

from train.data.batch import Batch
from train.data.config import LoaderConfig
from train.data.loader import Loader

__all__ = ["Batch", "Loader", "LoaderConfig"]
