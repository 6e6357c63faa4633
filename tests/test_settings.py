"""The settings registry: every TFC_ variable the product reads is declared once, read through it, and listed
on docs/settings.md exactly as the registry says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tfc import settings
from tfc.settings import REGISTRY, SettingError

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("runtime", "kernels", "tfc", "compiler", "cache", "packs", "fixtures")
REGISTRY_FILE = ROOT / "tfc" / "settings.py"
NAME = re.compile(r"\bTFC_[A-Z0-9_]+\b")
DIRECT_READ = re.compile(r"""(environ\.get\(|environ\[|getenv\()\s*["']TFC_""")


def _sources(*roots: str) -> list[Path]:
    files = [
        p for r in roots for p in (ROOT / r).rglob("*") if p.is_file() and p.suffix in (".py", ".c", ".md")
    ]
    return [p for p in files if "__pycache__" not in p.parts and p != REGISTRY_FILE]


def _names(path: Path) -> set[str]:
    return set(NAME.findall(path.read_text(encoding="utf-8", errors="replace")))


def test_every_tfc_variable_the_product_names_is_registered():
    unregistered = {
        f"{p.relative_to(ROOT)}: {n}" for p in _sources(*PRODUCT) for n in _names(p) - set(REGISTRY)
    }
    assert not unregistered, f"declare these in tfc/settings.py, or delete them: {sorted(unregistered)}"


def test_every_registered_variable_is_read_through_the_registry():
    me = Path(__file__).resolve()
    text = "\n".join(p.read_text(encoding="utf-8") for p in _sources(*PRODUCT, "tests") if p.resolve() != me)
    unread = [n for n in REGISTRY if not re.search(rf"""\.get\(\s*["']{n}["']""", text)]
    assert not unread, f"registered but never read with settings.get: {unread}"


def test_only_the_registry_and_its_readers_name_tfc_variables():
    """No product file reads a TFC_ variable from the environment itself; a file that names one reads settings."""
    around, unread = [], []
    for path in _sources(*PRODUCT):
        text = path.read_text(encoding="utf-8", errors="replace")
        if DIRECT_READ.search(text):
            around.append(str(path.relative_to(ROOT)))
        if (
            path.suffix == ".py"
            and NAME.search(text)
            and not re.search(r"^\s*from tfc import settings$", text, re.M)
        ):
            unread.append(str(path.relative_to(ROOT)))
    assert not around, f"these read a TFC_ variable around the registry: {around}"
    assert not unread, f"these name a TFC_ variable but do not read the registry: {unread}"


def test_the_settings_page_is_the_registrys():
    page = (ROOT / settings.PAGE).read_text(encoding="utf-8")
    assert page == settings.markdown(), "run: python -m tfc.settings --markdown > docs/settings.md"


def test_the_registry_is_short_for_operators_and_says_each_thing_once():
    operator = [s.name for s in settings.SETTINGS if s.audience == settings.OPERATOR]
    assert 0 < len(operator) <= settings.MAX_OPERATOR, operator
    assert len(REGISTRY) == len(settings.SETTINGS)  # no name declared twice
    for s in settings.SETTINGS:
        assert s.name.startswith("TFC_") and s.audience in (settings.OPERATOR, settings.INTERNAL)
        assert s.help and "\n" not in s.help and s.help.endswith("."), s.name
        if s.default not in (None, "", ()):
            assert settings.get(s.name, {s.name: settings.text_of(s.name, s.default)}) == settings.default(
                s.name
            )


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [("TFC_GRAPHS", " OFF ", False), ("TFC_GRAPHS", "yes", True), ("TFC_GRAPHS_MAX", "7", 7),
     ("TFC_TP_HANG_S", "0.5", 0.5), ("TFC_SSE_KEEPALIVE_S", "0", 0.0), ("TFC_API_KEY", " a, b ,,c", ("a", "b", "c")),
     ("TFC_CACHE", "~/x", Path.home() / "x"), ("TFC_TEST_SERVE_DEVICE", "cuda", "cuda"), ("TFC_LAUNCHER", "r1", "r1")],
)  # fmt: skip
def test_a_value_is_read_as_its_type(name, text, value):
    assert settings.get(name, {name: text}) == value


def test_unset_or_empty_is_the_default():
    assert settings.get("TFC_GRAPHS_MAX", {}) == settings.get("TFC_GRAPHS_MAX", {"TFC_GRAPHS_MAX": " "}) == 48
    assert settings.get("TFC_CACHE", {}) == Path.home() / ".cache" / "tfc" / "images"
    assert settings.get("TFC_LAUNCH_T0", {}) is None and settings.get("TFC_API_KEY", {}) == ()


@pytest.mark.parametrize(
    ("name", "text", "takes"),
    [("TFC_GRAPHS", "maybe", "on or off (1, on, true, yes / 0, off, false, no)"),
     ("TFC_GRAPHS_MAX", "-1", "a whole number of at least 0"), ("TFC_GRAPHS_MAX", "4.5", "a whole number"),
     ("TFC_TP_HANG_S", "0.1", "seconds, a number of at least 0.5"), ("TFC_TP_TIMEOUT_S", "inf", "seconds"),
     ("TFC_SSE_KEEPALIVE_S", "soon", "seconds"), ("TFC_TEST_SERVE_DEVICE", "tpu", "cpu or cuda"),
     ("TFC_LAUNCHER", "two words", "a run id (one word)")],
)  # fmt: skip
def test_a_bad_value_is_one_line_naming_the_variable_and_what_it_takes(name, text, takes):
    with pytest.raises(SettingError) as caught:
        settings.get(name, {name: text})
    line = str(caught.value)
    assert (
        line.startswith(f"{name}={text!r} cannot be used: {name} takes ")
        and takes in line
        and "\n" not in line
    )


def test_a_name_the_registry_does_not_declare_is_refused():
    unknown = "TFC_" + "NO_SUCH_THING"
    with pytest.raises(SettingError, match=f"{unknown} is not a tfc setting"):
        settings.get(unknown, {})
    with pytest.raises(SettingError):
        settings.text_of("TFC_LAUNCHER", "two words")


def test_the_page_is_printed_by_the_module(capsys):
    assert settings.main(["--markdown"]) == 0 and capsys.readouterr().out == settings.markdown()
    assert settings.main([]) == 2
