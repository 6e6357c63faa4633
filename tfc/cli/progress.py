"""Progress bars on stderr for the commands: bytes (upload) and counts (weights decoded)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def _bar(label: str, enabled: bool, *columns) -> Iterator[Callable[[int, int], None]]:
    """A transient rich bar that starts on the first update; yields `update(done, total)`."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    bar = Progress(
        TextColumn(f"[bold]{label}"), BarColumn(), *columns, console=Console(stderr=True), transient=True,
        disable=not enabled,
    )  # fmt: skip
    task = [None]

    def update(done: int, total: int) -> None:
        if task[0] is None:
            bar.start()
            task[0] = bar.add_task("", total=total)
        bar.update(task[0], completed=done)

    try:
        yield update
    finally:
        bar.stop()


def byte_bar(label: str, enabled: bool):
    """A bar of bytes done, with the rate."""
    from rich.progress import DownloadColumn, TransferSpeedColumn

    return _bar(label, enabled, DownloadColumn(), TransferSpeedColumn())


def count_bar(label: str, enabled: bool):
    """A bar of items done out of the total."""
    from rich.progress import MofNCompleteColumn

    return _bar(label, enabled, MofNCompleteColumn())
