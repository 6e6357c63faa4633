"""Every source package is in pyproject's package list, so a plain (non-editable) install holds all of tfc."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_folder_with_an_init_is_an_installed_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed, dirs = set(project["packages"]), project["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            parts = [p for p in rel.parts if p]
            if "__pycache__" not in parts:
                found.add(".".join([name, *parts]))
    assert (found | set(dirs)) - listed == set(), "missing from pyproject's packages"
