"""Building blocks of the ``split``, ``mix`` and ``order`` stages: stable hashes, mixture
weights, per-source selection, curriculum pacing and source stratification."""
