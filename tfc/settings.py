"""Every environment variable tfc reads, declared once: its name, type, default, audience and one line of help.

Readers ask `get(name)` for the typed value (unset or empty: the default); a value tfc cannot use is a
`SettingError` naming the variable and what it takes, which the CLI prints as one line (exit 2). Stdlib only,
so every layer may import it. `python -m tfc.settings --markdown` prints docs/settings.md.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfc.errors import TfcError

OPERATOR, INTERNAL = "operator", "internal"
MAX_OPERATOR = 8  # the operator's page stays short: a flag or a frozen config is the place for anything more
ON = ("1", "on", "true", "yes")
OFF = ("0", "off", "false", "no")
PAGE = "docs/settings.md"


class SettingError(TfcError):
    """An environment variable whose value tfc cannot use, or a name the registry does not declare."""


@dataclass(frozen=True)
class Kind:
    """How a variable's text becomes its value, and what it takes (said in errors and on the page)."""

    takes: str
    parse: Callable[[str], Any]


def _switch(text: str) -> bool:
    word = text.lower()
    if word in ON or word in OFF:
        return word in ON
    raise ValueError(text)


def switch() -> Kind:
    """On or off, in any of the spellings of ON and OFF (any case)."""
    return Kind("on or off (1, on, true, yes / 0, off, false, no)", _switch)


def seconds(least: float, what: str = "seconds") -> Kind:
    """A finite number of seconds, at least `least` (`what` they are, for the page)."""

    def parse(text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < least:
            raise ValueError(text)
        return value

    return Kind(f"{what}, a number of at least {least:g}", parse)


def count(least: int = 0) -> Kind:
    """A whole number, at least `least`."""

    def parse(text: str) -> int:
        value = int(text)
        if value < least:
            raise ValueError(text)
        return value

    return Kind(f"a whole number of at least {least}", parse)


def folder() -> Kind:
    """A folder path (`~` is the home folder)."""
    return Kind("a folder path", lambda text: Path(text).expanduser())


def words(what: str) -> Kind:
    """Comma-separated words (blanks around them dropped, empty ones skipped)."""
    return Kind(
        f"comma-separated {what}", lambda text: tuple(w.strip() for w in text.split(",") if w.strip())
    )


def choice(*values: str) -> Kind:
    """One of `values`."""

    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(text)
        return text

    return Kind(" or ".join(values), parse)


def word(what: str) -> Kind:
    """Any one word (no blanks)."""

    def parse(text: str) -> str:
        if text.split() != [text]:
            raise ValueError(text)
        return text

    return Kind(f"{what} (one word)", parse)


@dataclass(frozen=True)
class Setting:
    """One environment variable: how it is read, what it is when unset, who sets it and why."""

    name: str
    kind: Kind
    default: Any
    audience: str
    help: str
    shown: str | None = None  # the default as the page shows it, where its value reads poorly

    @property
    def shown_default(self) -> str:
        if self.shown is not None:
            return self.shown
        if isinstance(self.default, bool):
            return "on" if self.default else "off"
        if self.default is None or self.default == ():
            return "unset"
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


SETTINGS = (
    Setting("TFC_CACHE", folder(), Path("~/.cache/tfc/images"), OPERATOR,
            "The image store: where `tfc prepare` writes images and `tfc cache` looks (a command's --store wins)."),
    Setting("TFC_API_KEY", words("keys"), (), OPERATOR,
            "Keys `tfc serve` accepts from clients, beside --api-key and --api-key-file."),
    Setting("TFC_SSE_KEEPALIVE_S", seconds(0), 15.0, OPERATOR,
            "Seconds between `: keepalive` comments on a stream while it waits for its first token (0: none)."),
    Setting("TFC_GRAPHS", switch(), True, OPERATOR,
            "CUDA graphs for load, generate and serve; off runs every step eagerly, as --no-graphs does."),
    Setting("TFC_GRAPHS_MAX", count(0), 48, OPERATOR,
            "CUDA graphs a rank holds at most; the least recently used go first (0: none)."),
    Setting("TFC_TP_TIMEOUT_S", seconds(1), 600.0, OPERATOR,
            "A TP world's collective that waits this long fails (a lost rank is found sooner, by heartbeat)."),
    Setting("TFC_TP_HANG_S", seconds(0.5), 4.0, OPERATOR,
            "A TP rank whose heartbeat stands still this long is lost: every rank stops, exit 70."),
    Setting("TFC_LAUNCHER", word("a run id"), "", INTERNAL,
            "Set by tfc's launcher on each rank it starts: the world's run id; the rank's stdin is its pipe.",
            "unset (torchrun's ranks)"),
    Setting("TFC_LAUNCH_T0", seconds(0, "a wall time in seconds since 1970"), None, INTERNAL,
            "Wall time the ranks were launched at (tfc's launcher, or a benchmark): `tfc load` reports from it."),
    Setting("TFC_PREFAULT", switch(), True, INTERNAL,
            "Fault in the mmap upload's staging while torch imports (the boot benchmark turns it off to compare)."),
    Setting("TFC_NATIVE_CACHE", folder(), Path("~/.cache/tfc/native"), INTERNAL,
            "Where the mmap upload's C copy loop is built and kept (tests point it at a temporary folder)."),
    Setting("TFC_INSTANT_FAILURES", switch(), False, INTERNAL,
            "Tests: print a failure's traceback when it happens, so a run cut by its time limit still shows it."),
    Setting("TFC_TEST_SERVE_DEVICE", choice("cpu", "cuda"), "cpu", INTERNAL,
            "Tests: the device the server tests serve on."),
    Setting("TFC_TEST_FAST_DEVICE", choice("cpu", "cuda"), "cpu", INTERNAL,
            "Tests: the device the fast forward's drafting and prefill tests run on."),
    Setting("TFC_FLASH_IMAGE", folder(), None, INTERNAL,
            "Tests and benchmarks: a prepared flash-random image for the GPU agreement tests (unset: skipped)."),
)  # fmt: skip
REGISTRY: dict[str, Setting] = {s.name: s for s in SETTINGS}


def declared(name: str) -> Setting:
    """The registry's entry for `name` (a SettingError for a name it does not declare)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise SettingError(f"{name} is not a tfc setting ({PAGE} lists them)") from None


def get(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The typed value of `name` in `env` (default: this process's environment); unset or empty: its default."""
    setting = declared(name)
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return setting.default.expanduser() if isinstance(setting.default, Path) else setting.default
    try:
        return setting.kind.parse(raw)
    except ValueError:
        raise SettingError(f"{name}={raw!r} cannot be used: {name} takes {setting.kind.takes}") from None


def default(name: str) -> Any:
    """What `name` is when unset."""
    return get(name, {})


def text_of(name: str, value: Any) -> str:
    """`value` as the environment spells `name` (for the launcher, which sets variables for its ranks)."""
    if isinstance(value, bool):
        text = "1" if value else "0"
    else:
        text = repr(value) if isinstance(value, float) else str(value)
    get(name, {name: text})  # refuses a value the ranks could not read back
    return text


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(audience: str) -> list[str]:
    rows = ["| variable | takes | default | what it does |", "|---|---|---|---|"]
    for s in SETTINGS:
        if s.audience == audience:
            rows.append(
                f"| `{s.name}` | {_cell(s.kind.takes)} | {_cell(s.shown_default)} | {_cell(s.help)} |"
            )
    return rows


def markdown() -> str:
    """docs/settings.md: the operator's variables, then the internal ones."""
    lines = [
        "# Settings",
        "",
        "Every environment variable tfc reads. This page is generated from the registry in `tfc/settings.py`",
        "(`python -m tfc.settings --markdown > docs/settings.md`); a test fails when the two differ, and another",
        "when the code reads a `TFC_` variable the registry does not declare. A value tfc cannot use stops the",
        "command with one line naming the variable and what it takes (exit 2). Command-line flags are read by",
        "the command and passed down as a frozen value: a flag never sets a variable, and the ranks of a TP world",
        "compare every option at start ([parallel.md](parallel.md)).",
        "",
        "## For operators",
        "",
        *_table(OPERATOR),
        "",
        "## Internal",
        "",
        "Set by tfc itself (its launcher, for the ranks it starts), by its tests or by its benchmarks: not an",
        "interface to rely on.",
        "",
        *_table(INTERNAL),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """`python -m tfc.settings --markdown`: print the settings page."""
    if argv != ["--markdown"]:
        print("usage: python -m tfc.settings --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
