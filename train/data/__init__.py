"""The training data path: job shards -> tokens -> packed batches with per-token source ids.

Exports are resolved lazily so that loader worker processes started with ``spawn`` or
``forkserver`` import only the reading and tokenizing modules, not torch.
"""

from winnow.train import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "Batch": "winnow.train.data.batch",
        "Loader": "winnow.train.data.loader",
        "LoaderConfig": "winnow.train.data.config",
        "RepeatBatch": "winnow.train.data.batch",
    },
)
