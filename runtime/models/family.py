"""The family registry: an image's manifest names its family, the registry gives its runner and chat format."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfc.packs import deepseek_v41_contract as dsv41

from tfc.errors import TfcError

if TYPE_CHECKING:
    from tfc.runtime.worker.runner import ModelRunner


class UnknownFamily(TfcError):
    """An image of a model family this runtime has no package for."""


@dataclass(frozen=True)
class Family:
    """What the worker and engine need of a family: build a runner over an opened image, a chat format."""

    name: str
    build_runner: Callable[..., ModelRunner]  # a runner stating its capabilities (runtime/worker/runner.py)
    chat_format: Callable[[Any, int | None], Any]


# family name (as manifests record it) -> module holding its FAMILY; imported when first asked for.
FAMILIES = {dsv41.FAMILY: "tfc.runtime.models.dsv41.family"}


def family_for(name: str, where: str = "image") -> Family:
    """The registered family of that name, or one readable error."""
    module = FAMILIES.get(name)
    if module is None:
        raise UnknownFamily(
            f"{where}: model family {name!r} is not one this runtime runs ({', '.join(FAMILIES)})"
        )
    return importlib.import_module(module).FAMILY
