"""`tfc bench URL`: load an OpenAI-compatible server (tfc, vLLM, SGLang) and report TTFT, TPOT and ITL."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from tfc.cli.options import example, seed_option


def _list_option(parse):
    """A click callback that turns a comma-separated option into a list, refusing a bad item in one line."""

    def callback(ctx: click.Context, param: click.Parameter, value: str | None):
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None

    return callback


def _concurrency(ctx, param, value):
    from tfc.bench.load import parse_concurrency

    return _list_option(parse_concurrency)(ctx, param, value)


def _rates(ctx, param, value):
    from tfc.bench.load import parse_rates

    return _list_option(parse_rates)(ctx, param, value)


@click.command(
    "bench",
    epilog=example(
        "tfc bench http://127.0.0.1:8000 --concurrency 1,4,16,64 --input-len 512 --output-len 128 --warmup 4",
        "tfc bench http://127.0.0.1:8000/v1 --endpoint chat --rate 1,4,inf --dataset sharegpt.json --json",
    ),
)
@click.argument("url")
@click.option("--endpoint", type=click.Choice(["completions", "chat"]), default="completions", show_default=True,
              help="Stream /v1/completions or /v1/chat/completions.")  # fmt: skip
@click.option("--concurrency", metavar="C,C,…", callback=_concurrency,
              help="Settings run one after another, each with at most C requests in flight (default: 1,4,16,64).")  # fmt: skip
@click.option("--rate", metavar="R,R,…", callback=_rates,
              help="Settings of Poisson arrivals at R requests/s instead (inf: all at once); no in-flight limit.")  # fmt: skip
@click.option("--requests", type=click.IntRange(1, 1_000_000), metavar="N",
              help="Requests per setting (default: 64, or 4 per slot of the concurrency when that is more).")  # fmt: skip
@click.option("--input-len", type=click.IntRange(1, 1_000_000), default=256, show_default=True, metavar="WORDS",
              help="Synthetic prompt length in random common English words (roughly a token each; the server's "
                   "tokenizer is not known here).")  # fmt: skip
@click.option("--output-len", type=click.IntRange(1), default=128, show_default=True, metavar="TOKENS",
              help="Tokens to ask for (max_tokens, unless --max-tokens).")  # fmt: skip
@click.option(
    "--max-tokens", type=click.IntRange(1), metavar="N", help="max_tokens sent (default: --output-len)."
)
@click.option("--ignore-eos", is_flag=True,
              help="Send ignore_eos (a vLLM extension tfc and SGLang take) so every reply runs to max_tokens.")  # fmt: skip
@click.option("--dataset", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Prompts from a JSONL file of {\"prompt\": …} lines or a ShareGPT JSON array (first human turn).")  # fmt: skip
@click.option("--model", help="The model to ask for (default: the first that /v1/models lists).")
@click.option("--api-key", envvar="OPENAI_API_KEY", help="Bearer key (also OPENAI_API_KEY).")
@seed_option("Seed of the synthetic prompts, the dataset order and the arrival times.", default=0)
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=600.0, show_default=True,
              metavar="S", help="Seconds a request may take before it counts as failed.")  # fmt: skip
@click.option("--warmup", type=click.IntRange(0, 10_000), default=0, show_default=True, metavar="N",
              help="Requests sent together before the first setting, not counted.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="One JSON object per setting on stdout, one a line.")
def bench(url, endpoint, concurrency, rate, requests, input_len, output_len, max_tokens, ignore_eos, dataset, model,
          api_key, seed, timeout_s, warmup, as_json) -> None:  # fmt: skip
    """Load the OpenAI-compatible server at URL with streamed requests; per setting, report requests ok and
    failed, output tokens/s, requests/s, and TTFT, TPOT (time per output token after the first) and ITL
    (gaps between streamed chunks) at p50 / p90 / p99.

    Exit 0 when any request succeeded, 1 when none did; an unreachable or non-OpenAI URL, or a dataset that
    does not parse, is one line and exit 2.
    """
    if concurrency is not None and rate is not None:
        raise click.UsageError("--concurrency and --rate exclude each other")
    from tfc.bench.client import base_url
    from tfc.bench.load import Plan, run, sweep
    from tfc.bench.prompts import PromptSource, load_dataset
    from tfc.bench.report import ConsoleReporter

    plan = Plan(
        base=base_url(url), endpoint=endpoint, settings=sweep(concurrency, rate, requests),
        max_tokens=max_tokens or output_len, model=model, ignore_eos=ignore_eos, api_key=api_key,
        timeout_s=timeout_s, warmup=warmup, seed=seed,
    )  # fmt: skip
    prompts = PromptSource(seed, input_len, load_dataset(dataset) if dataset is not None else None)
    reporter = ConsoleReporter(as_json)
    try:
        summaries = asyncio.run(run(plan, prompts, reporter))
    finally:
        reporter.close()
    if not any(s["ok"] for s in summaries):
        click.echo("tfc bench: no request succeeded", err=True)
        sys.exit(1)
