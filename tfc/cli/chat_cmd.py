"""`tfc chat IMAGE`: an interactive chat in the terminal on the serving engine (reasoning dimmed, tool calls as JSON)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click

from tfc.cli.options import device_option, example, jobs_option, seed_option
from tfc.errors import TfcError


class ChatCommandError(TfcError):
    """A chat session that cannot start (tools file, options)."""


@click.command(
    "chat", epilog=example("tfc chat ~/.cache/tfc/images/263e81d431bff5c3 --thinking --effort high")
)
@click.argument("image", type=click.Path(path_type=Path))
@click.option("--system", default=None, help="A system message that opens the conversation.")
@click.option("--thinking/--no-thinking", default=None, help="Reason before answering (default: off).")
@click.option("--effort", default=None, help="Reasoning effort: 1-100, low, medium, high, xhigh or max.")
@click.option("--tools", "tools_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="A JSON file of OpenAI tools the model may call.")  # fmt: skip
@click.option(
    "--tool-choice", type=click.Choice(["auto", "required", "none"]), default="auto", show_default=True
)
@click.option(
    "--max-tokens", type=click.IntRange(1), default=256, show_default=True, help="Tokens per reply."
)
@click.option("--temperature", type=click.FloatRange(0), default=0.7, show_default=True, help="0 = greedy.")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=0.95, show_default=True)
@seed_option("Sampling seed of the first reply, 0 to 2**63-1 (reply k uses seed + k).")
@device_option()
@click.option("--dtype", type=click.Choice(["float32", "float64"]), default="float32", show_default=True)
@jobs_option("Upload threads (default: as `tfc load`).")
def chat(image, system, thinking, effort, tools_file, tool_choice, max_tokens, temperature, top_p, seed, device,
         dtype, jobs) -> None:  # fmt: skip
    """Chat with IMAGE: each line read from standard input is a user turn, answered as it streams.

    Reasoning prints dimmed, the answer plainly, each tool call as one JSON line once complete. The
    conversation is kept (earlier reasoning dropped as the chat encoding says); `/reset` starts over and
    `/exit` (or the end of input) ends. Works on a pipe as well as a terminal.
    """
    tools = _tools(tools_file)
    effort_value: str | int | None = int(effort) if effort is not None and effort.isdigit() else effort
    asyncio.run(_session(image, system, thinking, effort_value, tools, tool_choice, max_tokens, temperature,
                         top_p, seed, device, dtype, jobs))  # fmt: skip


def _tools(path: Path | None) -> tuple[dict, ...]:
    if path is None:
        return ()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ChatCommandError(f"{path}: not a readable JSON file of tools ({error})") from None
    if not isinstance(data, list):
        raise ChatCommandError(f"{path}: a JSON list of OpenAI tools is needed")
    return tuple(data)


async def _session(image, system, thinking, effort, tools, tool_choice, max_tokens, temperature, top_p, seed,
                   device, dtype, jobs) -> None:  # fmt: skip
    import secrets

    import torch

    from tfc.runtime.engine.chat import ChatOptions
    from tfc.runtime.engine.engine import Engine, EngineConfig
    from tfc.runtime.engine.grammar import Grammars
    from tfc.runtime.engine.request import PromptError, Request
    from tfc.runtime.engine.sampling import SamplingParams
    from tfc.runtime.engine.tokenizer import image_tokenizer
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.server.chat import ConstraintError, plan_constraints
    from tfc.runtime.worker.worker import Worker

    options = RuntimeOptions.from_settings(graphs=False)
    worker = Worker.start(image, device=device, options=options, jobs=jobs)
    try:
        runner = worker.load_model(dtype=getattr(torch, dtype), slots=1)
        tok = image_tokenizer(worker.booted.image, str(image))
        info, fmt = runner.info, worker.chat_format(tok)
        grammars = Grammars(tok, info.vocab_size, info.eos_ids)
        engine = Engine(worker, tok, EngineConfig(max_seqs=1, max_context=info.context))
        engine.start()
        base = seed if seed is not None else secrets.randbits(62)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        options = ChatOptions(thinking=thinking, effort=effort, tools=tools, tool_choice=tool_choice)
        interactive = sys.stdin.isatty()
        turn = 0
        while True:
            if interactive:
                click.echo(click.style("> ", bold=True), nl=False, err=True)
            line = sys.stdin.readline()
            if not line or line.strip() == "/exit":
                break
            text = line.rstrip("\n")
            if text.strip() == "/reset":
                messages = messages[:1] if system else []
                continue
            if not text.strip():
                continue
            messages.append({"role": "user", "content": text})
            try:
                plan = fmt.plan(messages, options)
                (constraint,) = plan_constraints(grammars, plan, 1)
            except (PromptError, ConstraintError) as error:
                messages.pop()
                click.secho(f"tfc: error: {error}", err=True, fg="red")
                continue
            params = SamplingParams(temperature=temperature, top_p=top_p, seed=(base + turn) % (1 << 63))
            request = Request(plan.prompt, params, min(max_tokens, info.context - len(plan.prompt)),
                              frozenset(info.eos_ids), constraint=constraint, reader=plan.reader)  # fmt: skip
            turn += 1
            reply, last = await _reply(engine, request)
            messages.append(reply.message())
            click.echo(
                f"[{last.usage.completion_tokens} tokens, {reply.finish_reason(last.finish)}]", err=True
            )
        engine.close()
    finally:
        worker.close()


async def _reply(engine, request):
    """Stream one reply: reasoning dimmed, the answer plain, each tool call as JSON when it closes."""
    from tfc.runtime.server.chat import Reply

    reply, last = Reply(), None
    (stream,) = engine.submit([request])
    was_reasoning = False
    async for event in stream:
        for delta in reply.add(event.text if isinstance(event.text, list) else []):
            if "reasoning_content" in delta:
                click.echo(click.style(delta["reasoning_content"], dim=True), nl=False)
                was_reasoning = True
            elif "content" in delta:
                if was_reasoning:
                    click.echo()
                    was_reasoning = False
                click.echo(delta["content"], nl=False)
        last = event
    click.echo()
    if last.finish == "error":
        click.secho(f"tfc: error: {last.error}", err=True, fg="red")
    for call in reply.message().get("tool_calls", []):
        fn = call["function"]
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            arguments = fn["arguments"]
        click.echo(json.dumps({"tool_call": {"id": call["id"], "name": fn["name"], "arguments": arguments}},
                              ensure_ascii=False))  # fmt: skip
    return reply, last
