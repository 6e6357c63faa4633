"""Triton's compiled kernels kept in the image store, one folder per GPU architecture and Triton version.

Triton keys each compiled kernel by its source, constants and target inside its cache folder; pointing that
folder into the store (`<store>/.kernels/sm_90-triton-3.6.0/`) makes the first boot of an image on a GPU host
compile once and every restart after it load the compiled kernels instead (the fast forward's stage kernels
among them: nothing else is compiled at a start). An operator's TRITON_CACHE_DIR is left alone. `cache ls` lists
only image folders, so the store's `.kernels` never shows as one.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ENV = "TRITON_CACHE_DIR"
RANK = re.compile(r"rank\d+")


def store_of(image: Path) -> Path:
    """The store an image (rank folder or world folder) lives in."""
    image = Path(image).resolve()
    return image.parent.parent if RANK.fullmatch(image.name) else image.parent


def cache_dir(image: Path, capability: tuple[int, int], triton_version: str) -> Path:
    """The store's kernel folder for one GPU architecture and Triton version."""
    return store_of(image) / ".kernels" / f"sm_{capability[0]}{capability[1]}-triton-{triton_version}"


def use_store_cache(image: Path, device: str) -> Path | None:
    """Point Triton's cache into the store for a CUDA device (unless the operator chose one); the folder used."""
    if os.environ.get(ENV) or not str(device).startswith("cuda"):
        return None
    import torch
    import triton

    folder = cache_dir(image, torch.cuda.get_device_capability(torch.device(device)), triton.__version__)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only store: Triton's default cache still works
        return None
    os.environ[ENV] = str(folder)
    return folder
