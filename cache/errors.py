"""Typed errors of the image store."""

from __future__ import annotations

from tfc.errors import TfcError


class ImageError(TfcError):
    """A prepared image is missing, malformed, damaged, stale or cannot be written."""


class ImageBusy(ImageError):
    """An image is held by a running process (or being written) and was left alone."""
