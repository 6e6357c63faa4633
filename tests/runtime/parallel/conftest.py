"""Fixtures of the tensor-parallel tests: the tiny pack prepared at TP 1, 2 and 4."""

from __future__ import annotations

import pytest
from support.tp_images import prepare_worlds


@pytest.fixture(scope="session")
def tp_images(tiny_pack, tmp_path_factory):
    """{world: image folder} of the tiny pack at TP 1, 2 and 4."""
    return prepare_worlds(tiny_pack, tmp_path_factory.mktemp("tp"))
