"""One implementation per operation: no module-global switch picks between two in kernels/ or runtime/, and no
benchmark times a variant by patching a kernel module (a variant is a config value the caller passes)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWITCH = re.compile(r"^[A-Z_][A-Z_0-9]* *(: *bool *)?= *(True|False)\b", re.MULTILINE)


def _switches(folder: str) -> list[str]:
    """'path:line: text' of every module-global boolean switch in the Python files under folder."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        text = path.read_text()
        for hit in SWITCH.finditer(text):
            line = text.count("\n", 0, hit.start()) + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {hit.group(0)}")
    return found


def _kernel_aliases(tree: ast.Module) -> set[str]:
    """Names a module binds to tfc.kernels modules (import ... as, from tfc.kernels[.x] import module)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.asname for a in node.names if a.name.startswith("tfc.kernels.") and a.asname}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfc.kernels"):
            # a submodule is lower case; classes and functions imported beside it cannot be patched as modules
            names |= {a.asname or a.name for a in node.names if a.name.islower() and a.name != "*"}
    return names


def _patches(path: Path, root: Path = ROOT) -> list[str]:
    """'path:line' of each setattr(...) on, or assignment to an attribute of, a tfc.kernels module in path."""
    tree = ast.parse(path.read_text())
    modules = _kernel_aliases(tree)
    found = []
    for node in ast.walk(tree):
        targets = []
        called = (
            getattr(node.func, "id", getattr(node.func, "attr", "")) if isinstance(node, ast.Call) else ""
        )
        if called == "setattr":
            targets = node.args[:1]
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                targets += target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
            targets = [t.value for t in targets if isinstance(t, ast.Attribute)]
        if any(isinstance(t, ast.Name) and t.id in modules for t in targets):
            found.append(node.lineno)
    return [f"{path.relative_to(root)}:{line}" for line in sorted(found)]


def test_no_kernel_module_holds_a_boolean_switch():
    assert _switches("kernels") == []


def test_no_runtime_module_holds_a_boolean_switch():
    assert _switches("runtime") == []


def test_no_benchmark_patches_a_kernel_module():
    found = [hit for path in sorted((ROOT / "benchmarks").rglob("*.py")) for hit in _patches(path)]
    assert found == []


def test_the_benchmarks_folder_stays_small_at_its_top():
    # one script a topic, their shared helpers and the summary; pages, probes and raw runs in their folders
    top = [p.name for p in (ROOT / "benchmarks").iterdir() if p.is_file() and not p.name.startswith(".")]
    assert len(top) <= 16, sorted(top)


def test_the_checks_see_a_switch_and_a_patch(tmp_path):
    """The checks above find what they are for (a check that finds nothing proves nothing)."""
    assert SWITCH.search("FAST = True  # on\n") and SWITCH.search("X: bool = False\n")
    assert not SWITCH.search("    LOCAL = True\nMAX = 16\n")
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tfc.kernels.exl3 import rows as xr\nimport tfc.kernels.dsv41.attend_rows as ar\n"
        "from tfc.kernels.exl3.rows import RowsConfig\n"
        "xr.BLOCK_M = 32\nsetattr(ar, 'SPLIT', 2)\na, ar.X = 1, 2\nRowsConfig(block_m=32)\nother.X = 1\n"
    )
    assert _kernel_aliases(ast.parse(probe.read_text())) == {"xr", "ar"}
    assert _patches(probe, tmp_path) == ["probe.py:4", "probe.py:5", "probe.py:6"]
