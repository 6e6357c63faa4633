"""Every relative link in the README, docs/ and the benchmark pages points to a file that exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _documents() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "benchmarks").glob("*.md")),
        *sorted((ROOT / "benchmarks" / "summaries").glob("*.md")),
    ]


def _relative_links(doc: Path) -> list[str]:
    text = FENCE.sub("", doc.read_text(encoding="utf-8"))
    targets = (m.group(1).split("#", 1)[0] for m in LINK.finditer(text))
    return [t for t in targets if t and not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    missing = [t for t in _relative_links(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)}: broken links {missing}"


def test_readme_links_the_docs():
    # the depth lives in docs/: each page is reachable from the front door
    linked = {(ROOT / t).resolve() for t in _relative_links(ROOT / "README.md")}
    assert not [p.name for p in (ROOT / "docs").glob("*.md") if p.resolve() not in linked]
