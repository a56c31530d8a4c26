"""What loading a model can raise: each carries a one-line reason for the user."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """A model could not be loaded; str(e) is a one-line reason for the user."""


class VocabMismatchError(ValueError):
    """Target and draft vocabularies differ; str(e) names the first difference."""
