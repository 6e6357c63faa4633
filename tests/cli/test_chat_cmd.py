"""`tfc chat IMAGE` on a pipe: one reply per line read, the conversation kept, tool calls printed as JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.fixture
def image(tiny_image):
    return tiny_image


def chat(image: str, lines: str, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tfc", "chat", image, "--device", "cpu", *args]
    return subprocess.run(cmd, input=lines, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_each_line_gets_a_reply_and_the_conversation_is_kept(image):
    out = chat(image, "Hello\n\n/reset\nHello\n/exit\nnot read\n", "--max-tokens", "5", "--temperature", "0")
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("[5 tokens, length]") == 2  # the blank line is skipped, /exit ends
    replies = out.stdout.split("\n")
    assert replies[0] == replies[1]  # after /reset the same greedy reply


@pytest.mark.slow
def test_a_required_tool_call_prints_as_json(image, tmp_path):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}]  # fmt: skip
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    out = chat(image, "Weather?\n", "--tools", str(path), "--tool-choice", "required", "--max-tokens", "200",
               "--temperature", "1", "--seed", "7")  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("{")]
    call = json.loads(line)["tool_call"]
    assert call["name"] == "get_weather" and call["arguments"]["city"] in ("Paris", "Oslo")
    assert "tool_calls]" in out.stderr and "｜DSML｜" not in out.stdout


def test_a_bad_tools_file_is_one_line(image, tmp_path):
    path = tmp_path / "tools.json"
    path.write_text("{")
    out = chat(image, "x\n", "--tools", str(path))
    assert (
        out.returncode == 2
        and out.stderr.strip().startswith("tfc: error:")
        and len(out.stderr.splitlines()) == 1
    )
