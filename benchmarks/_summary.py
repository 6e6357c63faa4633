"""benchmarks/summary.json, the latest value of every headline metric, and the README's figures table rendered
from it.

    python benchmarks/_summary.py                          # print the table
    python benchmarks/_summary.py --readme                 # rewrite the README's table between its markers
    python benchmarks/_summary.py --apply R.json ... --readme  # result files into summary.json, then the table
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = ROOT / "benchmarks" / "summary.json"
README = ROOT / "README.md"
KEYS = ("id", "value", "unit", "target", "limit", "hardware", "date", "commit", "command")
OPS = {">=": "≥", "<=": "≤"}


def parse_target(text: str | None) -> dict | None:
    """A target as written (">= 0.5") -> {"op": ">=", "value": 0.5}; a note may follow the number ("<= 0.25 with the step at 4 ms")."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(>=|<=)\s*([-+0-9.eE]+)\s*(.*)", text)
    if not m:
        raise ValueError(f"a target reads '>= X' or '<= X', got {text!r}")
    out: dict = {"op": m.group(1), "value": float(m.group(2))}
    if m.group(3):
        out["note"] = m.group(3).strip()
    return out


def load_summary(path: Path = SUMMARY) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def write_summary(doc: dict, path: Path = SUMMARY) -> None:
    """One metric a line, in the file's order: small diffs when a run updates a few."""
    lines = [json.dumps({k: m.get(k) for k in KEYS}, ensure_ascii=False) for m in doc["metrics"]]
    path.write_text('{"metrics": [\n' + ",\n".join(lines) + "\n]}\n", encoding="utf-8")


def update_summary(id: str, value: float | None, unit: str, target: dict | None, limit: str | None,
                   hardware: str, date: str, commit: str, command: str, path: Path = SUMMARY) -> None:  # fmt: skip
    """Replace the entry of `id` (or add it at the end) with this run's figure."""
    doc = load_summary(path)
    entry = {"id": id, "value": value, "unit": unit, "target": target, "limit": limit, "hardware": hardware,
             "date": date, "commit": commit, "command": command}  # fmt: skip
    at = next((i for i, m in enumerate(doc["metrics"]) if m["id"] == id), None)
    if at is None:
        doc["metrics"].append(entry)
    else:
        doc["metrics"][at] = entry
    write_summary(doc, path)


def apply_result(path: Path, summary: Path = SUMMARY) -> int:
    """A benchmark's result file (benchmarks/results/<topic>/*.json) into summary.json: each measured metric's
    entry replaced; how many."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    done = 0
    for m in doc["metrics"]:
        if m["value"] is not None:
            update_summary(m["id"], m["value"], m["unit"], m["target"], m["limit"], doc["hardware_line"],
                           doc["date"], doc["commit"], doc["command"], summary)  # fmt: skip
            done += 1
    return done


# -- the README's figures table ---------------------------------------------------------------------------------

BEGIN = "<!-- figures: generated from benchmarks/summary.json by `python benchmarks/_summary.py --readme` -->"
END = "<!-- /figures -->"
# (what, the metrics of the row, its summary page): at most 12 rows, each a line
README_ROWS = (
    ("decode step vs its byte floor, 1 / 16 / 64 rows", ("decode.floor_ratio.rows1", "decode.floor_ratio.rows16",
     "decode.floor_ratio.rows64"), "decode.md"),
    ("whole Flash, one stream (projected): serial / drafted at 2.8 tokens a round",
     ("decode.whole_flash_tok_s.streams1", "decode.whole_flash_tok_s.drafted_al2.8"), "decode.md"),
    ("kernel launches a decode layer / drafter round vs a one-row step",
     ("decode.launches_per_layer", "drafter.round_vs_step"), "decode.md"),
    ("prefill vs the bf16 peak, 2k / 16k-token prompts", ("prefill.peak_ratio.2k", "prefill.peak_ratio.16k"),
     "decode.md"),
    ("`tfc serve`, whole Flash at 64 streams (projected) / one stream vs `tfc generate`",
     ("serve.whole_flash_tok_s.streams64", "serve.one_stream_vs_generate.slice"), "serve.md"),
    ("`tfc serve` restart to ready, Flash slice / TP=2 boot vs its slower rank alone",
     ("serve.start_to_ready_s.slice", "parallel.tp2_boot_ratio"), "serve.md"),
    ("prefix cache: 16k-token next turn, cached vs uncached / host restore vs pinned copy",
     ("prefix_cache.ttft_speedup.slice16k", "prefix_cache.host_restore_vs_h2d"), "serve.md"),
    ("beyond HBM: Engram lookup's share of a step, host / NVMe tier; whole Flash on one GPU, one stream (projected)",
     ("engram.host_step_share", "engram.nvme_step_share", "decode.whole_flash_tok_s.one_gpu_streams1"),
     "kernels.md"),
    ("EXL3 one-row head GEMV / one-token MoE vs HBM copy", ("kernels.gemv_head_vs_copy",
     "kernels.moe_token_vs_copy.ragged"), "kernels.md"),
    ("boot: warm vs pinned-copy floor / cold vs disk / speed-up on safetensors",
     ("boot.warm_upload_vs_floor", "boot.cold_vs_disk", "boot.vs_safetensors"), "boot.md"),
    ("`tfc prepare` vs plain copy / `verify --full` vs plain read, cold / warm",
     ("prepare.vs_copy", "verify.full_vs_read.cold", "verify.full_vs_read.warm"), "prepare.md"),
    ("`tfc inspect` / `tfc plan --tp 2` of the full-scale headers, whole process",
     ("cli.inspect_s", "cli.plan_tp2_s"), "prepare.md"),
)  # fmt: skip


def format_value(value: float | None, unit: str, target: bool = False) -> str:
    """A figure as the README shows it (a target without trailing zeros)."""
    if value is None:
        return "not measured"
    if unit == "fraction":
        return f"{value * 100:g} %" if target else f"{value * 100:.1f} %"
    if unit == "x":
        return f"{value:.0f}×" if value >= 10 else f"{value:.3g}×"
    if unit == "s":
        return f"{value:g} s" if target else f"{value:.2f} s"
    if unit == "tok/s":
        return f"{value:,.1f} tok/s" if value < 100 and not target else f"{value:,.0f} tok/s"
    if unit == "launches":
        return f"{value:.0f}"
    return f"{value:g} {unit}"


def format_target(target: dict | None, unit: str) -> str:
    if not target:
        return "stated"
    return f"{OPS[target['op']]} {format_value(target['value'], unit, target=True)}"


def short_hardware(text: str) -> str:
    """'NVIDIA H100 80GB HBM3 (16-core ...)' -> 'H100'; a CPU-only host -> 'N-core CPU'."""
    if text.endswith("CPU only"):
        cores = re.match(r"(\d+)-core", text)
        return f"{cores.group(1)}-core CPU" if cores else "CPU"
    gpu = re.search(r"\b(H100|H200|B200|GB10|A100|L40S)\b", text)
    return gpu.group(1) if gpu else text.split(" (")[0][:30]


def render_table(doc: dict) -> str:
    """The README's figures table: one line a row of README_ROWS, values and targets joined by ' / '."""
    by_id = {m["id"]: m for m in doc["metrics"]}
    lines = ["| what | measured | target | on | details |", "| --- | --- | --- | --- | --- |"]
    for what, ids, page in README_ROWS:
        ms = [by_id[i] for i in ids]
        measured = " / ".join(format_value(m["value"], m["unit"]) for m in ms)
        target = " / ".join(format_target(m["target"], m["unit"]) for m in ms)
        on = (
            " / ".join(dict.fromkeys(short_hardware(m["hardware"]) for m in ms if m["value"] is not None))
            or "—"
        )
        lines.append(f"| {what} | {measured} | {target} | {on} | [{page}](benchmarks/summaries/{page}) |")
    return "\n".join(lines)


def readme_block(text: str) -> str:
    """The README's text between the figures markers (the table), stripped."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"README.md has no figures markers ({BEGIN} ... {END})")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write_readme(readme: Path = README, summary: Path = SUMMARY) -> None:
    """Put the rendered table between the README's markers, leaving the rest as it is."""
    text = readme.read_text(encoding="utf-8")
    readme_block(text)  # the markers must be there
    before, rest = text.split(BEGIN, 1)
    after = rest.split(END, 1)[1]
    table = render_table(load_summary(summary))
    readme.write_text(f"{before}{BEGIN}\n{table}\n{END}{after}", encoding="utf-8")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--readme", action="store_true", help="rewrite README.md's figures table from summary.json"
    )
    ap.add_argument("--apply", nargs="+", type=Path, metavar="RESULT",
                    help="put these result files' metrics into summary.json first (in the order given)")  # fmt: skip
    args = ap.parse_args()
    for result in args.apply or ():
        print(f"{result}: {apply_result(result)} entries of {SUMMARY.relative_to(ROOT)}")
    if args.readme:
        write_readme()
        print(f"README.md's figures table rewritten from {SUMMARY.relative_to(ROOT)}")
    elif not args.apply:
        print(render_table(load_summary()))
