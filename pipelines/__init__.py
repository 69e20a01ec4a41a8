"""End-to-end jobs composing curation and training, and the ``winnow`` command."""

__version__ = "0.1.0"
