"""End-to-end jobs composing curation and training, and the ``winnow`` command."""

from winnow import __version__

__all__ = ["__version__"]
