"""Options every command spells the same way: --device, -j/--jobs, --store, --seed, --tp."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import click

MAX_JOBS = 1024
MAX_SEED = 2**63 - 1  # what torch and numpy generators take
DEVICES = ("auto", "cuda", "cpu")
STORE_HELP = "Image store folder (default: $TFC_CACHE or ~/.cache/tfc/images)."


class AliasedOption(click.Option):
    """An option whose old spellings still parse but stay out of --help and error messages."""

    def __init__(self, param_decls: Sequence[str], *, old: Sequence[str] = (), **kwargs) -> None:
        super().__init__([*param_decls, *old], **kwargs)
        self.old = tuple(old)

    def _shown(self) -> list[str]:
        return [o for o in self.opts if o not in self.old]

    def get_help_record(self, ctx: click.Context):
        opts, self.opts = self.opts, self._shown()
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = opts

    def get_error_hint(self, ctx: click.Context | None) -> str:
        shown = self._shown()
        return " / ".join(f"'{o}'" for o in [o for o in shown if o.startswith("--")] or shown)


Decorator = Callable[[Callable], Callable]


def device_option() -> Decorator:
    """--device auto|cuda|cpu, for commands that run on a device."""
    return click.option(
        "--device",
        type=click.Choice(DEVICES),
        default="auto",
        show_default=True,
        help="Where to run: auto takes CUDA when present.",
    )


def jobs_option(help: str, default: int | None = None, old: Sequence[str] = ()) -> Decorator:
    """-j/--jobs N (1..1024), the one spelling of a thread or process count."""
    return click.option(
        "-j",
        "--jobs",
        "jobs",
        cls=AliasedOption,
        old=old,
        type=click.IntRange(1, MAX_JOBS),
        metavar="N",
        default=default,
        show_default=default is not None,
        help=help,
    )


def store_option(old: Sequence[str] = (), help: str = STORE_HELP) -> Decorator:
    """--store DIR, the one spelling of the image store's root."""
    return click.option(
        "--store",
        "store",
        cls=AliasedOption,
        old=old,
        type=click.Path(file_okay=False),
        metavar="DIR",
        default=None,
        help=help,
    )


def seed_option(help: str, default: int | None = None) -> Decorator:
    """--seed N, 0..2**63-1 (0 is a seed like any other)."""
    return click.option(
        "--seed",
        type=click.IntRange(0, MAX_SEED),
        metavar="N",
        default=default,
        show_default=default is not None,
        help=help,
    )


def _tp_world(ctx: click.Context, param: click.Parameter, value: int) -> int:
    from tfc.compiler.dsv41_plan import WORLDS

    if value not in WORLDS:
        shown = ", ".join(map(str, WORLDS[:-1])) + f" or {WORLDS[-1]}"
        raise click.BadParameter(f"{value} is not a tensor-parallel world size tfc builds ({shown})")
    return value


def tp_option() -> Decorator:
    """--tp N, the tensor-parallel world size (refused before any work unless the planner builds it)."""
    return click.option(
        "--tp",
        "world",
        type=int,
        metavar="N",
        default=1,
        show_default=True,
        callback=_tp_world,
        help="Tensor-parallel world size (1, 2, 4 or 8).",
    )


def example(*commands: str) -> str:
    """A command's --help epilog: its example lines, printed last and never rewrapped."""
    return "\b\n" + "\n".join(f"Example: {c}" for c in commands)
