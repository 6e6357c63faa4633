"""`tfc verify IMAGE`: recompute an image's digests; exit 1 naming every damaged segment and file."""

from __future__ import annotations

import json
from pathlib import Path

import click

from tfc.cli.options import example, jobs_option

SAMPLE_HELP = (
    "Check a sample: manifests and file sizes as always, and of each segment's n 4 MiB chunks only "
    "chunk 0, chunk n-1 and every 16th chunk (0, 16, 32, ...): segments up to 8 MiB are hashed whole, "
    "GB-sized ones about 1/16."
)


@click.command("verify", epilog=example("tfc verify ~/.cache/tfc/images/263e81d431bff5c3 --sample"))
@click.argument("image", type=click.Path(path_type=Path))
@click.option("--full", "mode", flag_value="full", default=True, help="Re-hash every byte (default).")
@click.option("--sample", "mode", flag_value="sample", help=SAMPLE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report on stdout.")
@jobs_option("Hashing threads (default: all cores).")
@click.pass_context
def verify(ctx: click.Context, image: Path, mode: str, as_json: bool, jobs: int | None) -> int:
    """Verify IMAGE, a world folder (every rank in it) or one rank folder.

    Checks each manifest's root digest and structure, that every rank of the world is present,
    every data file's size, and recomputes segment digests (BLAKE3 over 4 MiB chunks) in parallel.
    Exit 0 when clean, 1 naming every damaged, truncated or missing segment and file, 2 when
    IMAGE is not an image.
    """
    from tfc.cache.verify import verify_image

    with _Progress() as bar:
        report = verify_image(image, mode=mode, jobs=jobs, progress=bar.update)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=1))
    else:
        for problem in report.problems:
            click.echo(problem.line())
        speed = report.bytes_checked / report.seconds / 1e9 if report.seconds else 0.0
        status = "ok" if report.ok else f"FAILED ({len(report.problems)} problem(s))"
        click.echo(
            f"{status}: {image}: {len(report.ranks)} rank(s), {report.segments} segments, "
            f"{report.bytes_checked / 1e9:.2f} of {report.bytes_total / 1e9:.2f} GB hashed ({mode}) "
            f"in {report.seconds:.2f} s, {speed:.2f} GB/s"
        )
    ctx.exit(0 if report.ok else 1)


class _Progress:
    """A rich bytes/s progress bar on stderr, shown only on a terminal and for runs over 256 MiB."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=True)
        self.progress = None
        self.task = None

    def __enter__(self) -> _Progress:
        return self

    def update(self, done: int, total: int) -> None:
        if self.progress is None:
            if not self.console.is_terminal or total < (256 << 20):
                return
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            self.progress = Progress(
                "verify", BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                console=self.console, transient=True,
            )  # fmt: skip
            self.progress.start()
            self.task = self.progress.add_task("verify", total=total)
        self.progress.update(self.task, completed=done)

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()
