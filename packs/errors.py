"""Typed errors of pack reading: every message names the file and the tensor it is about."""

from __future__ import annotations

from tfc.errors import TfcError


class PackError(TfcError):
    """An input pack is unreadable, inconsistent or not the model it claims to be."""


class HeaderError(PackError):
    """A safetensors header (or the shard index) breaks the format's rules."""


class ConfigError(PackError):
    """config.json is missing a field, has a bad value, or names an unsupported model."""


class MissingTensor(PackError):
    """A tensor the model needs is not stored in any shard."""


class CoverageError(PackError):
    """Stored tensors that are neither planned nor on the ignore list."""
