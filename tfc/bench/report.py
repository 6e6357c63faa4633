"""How `tfc bench` shows a run: a progress bar per setting on stderr, then its table (or one JSON line) on stdout."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

import click
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table
from rich.text import Text

from tfc.bench.client import Outcome
from tfc.bench.load import Setting

QUANTILES = ("p50", "p90", "p99")
ROWS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_ms"), ("latency", "latency_ms"))


class ConsoleReporter:
    """Bars on stderr while a setting runs (on a terminal); each setting's table, or JSON line, once it ends."""

    def __init__(self, as_json: bool, bars: bool | None = None):
        self.as_json = as_json
        self.bars = sys.stderr.isatty() if bars is None else bars
        self.err = Console(stderr=True)
        self._progress: Progress | None = None
        self._task = None
        self._failed = 0

    def started(self, model: str, url: str, settings: Sequence[Setting]) -> None:
        """One line on stderr: what is benchmarked."""
        click.echo(f"tfc bench: {model} at {url}, {len(settings)} setting(s)", err=True)

    def warmed_up(self, outcomes: Sequence[Outcome]) -> None:
        failed = [o for o in outcomes if not o.ok]
        if failed:
            click.echo(
                f"tfc bench: warmup: {len(failed)} of {len(outcomes)} failed: {failed[0].error}", err=True
            )

    def setting_started(self, setting: Setting) -> None:
        self._failed = 0
        self._progress = Progress(
            TextColumn(f"[bold]{setting.label}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[failed]}"),
            TimeElapsedColumn(), console=self.err, transient=True, disable=not self.bars,
        )  # fmt: skip
        self._task = self._progress.add_task("", total=setting.requests, failed="")
        self._progress.start()

    def request_done(self, outcome: Outcome) -> None:
        self._failed += not outcome.ok
        failed = f"[red]{self._failed} failed" if self._failed else ""
        self._progress.update(self._task, advance=1, failed=failed)

    def setting_done(self, summary: dict) -> None:
        self.close()
        if self.as_json:
            print(json.dumps(summary), flush=True)
        else:
            Console().print(table(summary))

    def close(self) -> None:
        """Take the bar down (also when a run is interrupted, so the terminal gets its cursor back)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def table(summary: dict) -> Group:
    """A setting's summary: counts and rates on one line, then p50 / p90 / p99 rows in ms, then its errors."""
    setting = ", ".join(f"{k} {v}" for k, v in summary.items() if k in ("concurrency", "rate"))
    head = Text(
        f"{setting}: {summary['ok']} ok, {summary['failed']} failed in {summary['duration_s']:.2f} s; "
        f"{summary['output_tok_s']:,.1f} output tok/s, {summary['request_s']:,.2f} requests/s"
    )
    out = Table("ms", *(Column(q, justify="right") for q in QUANTILES))
    for name, key in ROWS:
        out.add_row(name, *(_ms(summary[key][q]) for q in QUANTILES))
    errors = [Text("errors: " + "; ".join(summary["errors"]))] if summary["errors"] else []
    return Group(head, out, *errors)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"
