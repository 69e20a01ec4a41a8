"""Per-source attribution: which training source moved which source's held-out loss, adding up to what was measured."""

from winnow.train import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "AttributionConfig": "winnow.train.attribution.config",
        "SourceAttribution": "winnow.train.attribution.estimator",
    },
)
