"""Options every command spells the same way: --device, -j/--jobs, --store, --seed, --tp."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import click

from tfc import settings

MAX_JOBS = 1024
MAX_SEED = 2**63 - 1  # what torch and numpy generators take
DEVICES = ("auto", "cuda", "cpu")
STORE_HELP = f"Image store folder (default: $TFC_CACHE, else {settings.declared('TFC_CACHE').shown_default})."


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


def placement_options() -> Decorator:
    """The target a placement is planned for: --gpu-memory-gib, --host-memory-gib, --nvme, --max-context,
    --max-seqs, --overhead-gib (the command gets them as one `budget`: a Budget, or None without a GPU size)."""
    gib = click.FloatRange(0, 1 << 20, min_open=True)
    options = [
        click.option("--gpu-memory-gib", "gpu_gib", type=gib, metavar="G",
                     help="GPU memory of each rank's GPU: place every segment for it (without: all on the device)."),
        click.option("--host-memory-gib", "host_gib", type=gib, metavar="G",
                     help="Host memory the ranks may pin for segments off the GPU, all ranks together (default: no limit)."),
        click.option("--nvme", "nvme_dir", type=click.Path(file_okay=False), metavar="DIR",
                     help="Folder on the target's NVMe: Engram rows that fit neither GPU nor host are read from it."),
        click.option("--max-context", "max_context", type=click.IntRange(1), metavar="N",
                     help="Tokens a sequence may reach, for the KV memory kept free on the GPU (default 65,536)."),
        click.option("--max-seqs", "max_seqs", type=click.IntRange(1, 1024), metavar="N",
                     help="Sequences served at once, for the KV memory kept free on the GPU (default 16)."),
        click.option("--overhead-gib", "overhead_gib", type=click.FloatRange(0, 1 << 20), metavar="G",
                     help="GPU memory kept free for the runtime besides weights and KV (default 6)."),
    ]  # fmt: skip

    def to_budget(ctx: click.Context, kwargs: dict):
        from tfc.compiler.placement import DEFAULT_CONTEXT, DEFAULT_OVERHEAD_GIB, DEFAULT_SEQS, Budget

        values = {name: kwargs.pop(name) for name in
                  ("gpu_gib", "host_gib", "nvme_dir", "max_context", "max_seqs", "overhead_gib")}  # fmt: skip
        if values["gpu_gib"] is None:
            given = [name for name, value in values.items() if value is not None]
            if given:
                flag = {"host_gib": "--host-memory-gib", "nvme_dir": "--nvme"}.get(given[0])
                flag = flag or "--" + given[0].replace("_", "-")
                raise click.UsageError(
                    f"{flag} places segments for a target: give its --gpu-memory-gib too", ctx
                )
            return None
        return Budget(
            values["gpu_gib"],
            values["host_gib"],
            values["nvme_dir"],
            values["max_context"] or DEFAULT_CONTEXT,
            values["max_seqs"] or DEFAULT_SEQS,
            DEFAULT_OVERHEAD_GIB if values["overhead_gib"] is None else values["overhead_gib"],
        )

    def decorate(fn: Callable) -> Callable:
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            kwargs["budget"] = to_budget(click.get_current_context(), kwargs)
            return fn(*args, **kwargs)

        for option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate
