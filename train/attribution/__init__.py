"""Per-source attribution: which training source moved which source's held-out loss, adding up to what was measured."""

from winnow.train.attribution.config import AttributionConfig
from winnow.train.attribution.estimator import SourceAttribution

__all__ = ["AttributionConfig", "SourceAttribution"]
