"""winnow: curate multi-source text into training shards, train on them, and measure what each source does.

Installed, the code is one package: ``winnow.curate`` (reading, stages, shards; needs no torch),
``winnow.train`` (the loader, the model, the trainer, attribution) and ``winnow.pipelines`` (the
``winnow`` command, reports and studies). The repository keeps them as the folders ``curate/``,
``train/`` and ``pipelines/``; ``pyproject.toml`` maps them under this package.
"""

__version__ = "0.1.0"
