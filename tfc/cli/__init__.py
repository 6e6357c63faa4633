"""The `tfc` command: a click group whose subcommands load lazily (no torch for header-only work)."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from tfc.errors import TfcError

# name -> (module, function, one-line help); modules import only what their command needs.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "inspect": (
        "tfc.cli.inspect_cmd",
        "inspect",
        "What a pack or image holds, from headers or manifests alone.",
    ),
    "plan": (
        "tfc.cli.plan_cmd",
        "plan",
        "The rank weight plan of a pack and its placement on a target, without writing anything.",
    ),
    "prepare": (
        "tfc.cli.prepare_cmd",
        "prepare",
        "Build (or find in the cache) the prepared image of every rank.",
    ),
    "verify": ("tfc.cli.verify_cmd", "verify", "Recompute an image's payload digests."),
    "cache": ("tfc.cli.cache_cmd", "cache", "List, remove and prune prepared images."),
    "load": ("tfc.cli.load_cmd", "load", "Open, upload and capture an image, print phase times, exit."),
    "generate": (
        "tfc.cli.generate_cmd",
        "generate",
        "Generate text from an image with the runtime's forward.",
    ),
    "serve": ("tfc.cli.serve_cmd", "serve", "Serve an image over an OpenAI-compatible HTTP API."),
    "chat": ("tfc.cli.chat_cmd", "chat", "Chat with an image in the terminal (reasoning, tool calls)."),
    "bench": ("tfc.cli.bench_cmd", "bench", "Load an OpenAI-compatible server: throughput, TTFT, TPOT, ITL."),
    "engram": ("tfc.cli.engram_cmd", "engram", "Which Engram table rows a text touches."),
    "dequant": ("tfc.cli.dequant_cmd", "dequant", "One EXL3 group's dense weight from the reference decode."),
    "fixture": ("tfc.cli.fixture_cmd", "fixture", "Write a synthetic pack in the real layout."),
}


class LazyGroup(click.Group):
    """A group that imports a subcommand's module only when that subcommand runs."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (module, _, _) in COMMANDS.items() if _module_exists(module)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, help_text = COMMANDS[name]
        if not _module_exists(module):
            return None
        command = getattr(importlib.import_module(module), attr)
        command.short_help = command.short_help or help_text
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _module_exists(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog='\b\nExample: tfc fixture tiny ./pack && tfc generate "$(tfc prepare ./pack)" --prompt Hello',
)
@click.version_option(package_name="tfc")
def cli() -> None:
    """tfc: prepare DeepSeek-V4.1 EXL3 packs ahead of time and serve the prepared images."""


def usage_line(error: click.ClickException) -> str:
    """Click's own refusal (missing argument, bad value, unknown option or command) as one line."""
    ctx = getattr(error, "ctx", None)
    if isinstance(error, click.exceptions.NoArgsIsHelpError):
        group = ctx.command
        names = group.list_commands(ctx) if isinstance(group, click.Group) else []
        message = f"missing command; one of {', '.join(names)}" if names else "missing command"
    else:
        message = " ".join(error.format_message().split()).rstrip(".")
        if message[:2].istitle():  # "Missing argument" -> "missing argument", as tfc's own lines read
            message = message[0].lower() + message[1:]
    if ctx is not None:
        return f"{message} (see `{ctx.command_path} --help`)"
    if isinstance(error, click.UsageError):  # the option parser raises without a context
        return f"{message} (see `{_command_path(sys.argv[1:])} --help`)"
    return message


def _command_path(args: list[str]) -> str:
    """`tfc cache ls` from the leading command names of `args`."""
    path, command = ["tfc"], cli
    ctx = click.Context(cli)
    for arg in args:
        found = command.get_command(ctx, arg) if isinstance(command, click.Group) else None
        if found is None:
            break
        path.append(arg)
        command = found
    return " ".join(path)


def main() -> None:
    """Entry point: run the CLI and turn typed errors into one line and exit code 2."""
    try:
        code = cli.main(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except TfcError as error:
        click.echo(f"tfc: error: {error}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        click.echo("tfc: aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        click.echo(f"tfc: error: {usage_line(error)}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("tfc: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except OSError as error:
        click.echo(f"tfc: error: {error.strerror or error}: {error.filename or ''}".rstrip(": "), err=True)
        sys.exit(2)
