"""report.html (standalone, inline SVG plots) and the datasets' README card."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from typing import Any

import yaml

from thicket.aggregate.forest import EVALUATED

W, H, PAD = 560, 220, 36


def svg_bars(title: str, labels: Sequence[str], values: Sequence[float], fmt: str = "{:g}") -> str:
    """A bar chart as an inline <svg> (no scripts, no network)."""
    esc = html.escape
    top = max(values, default=0) or 1
    n = max(len(values), 1)
    slot = (W - 2 * PAD) / n
    bars = []
    for i, (label, value) in enumerate(zip(labels, values)):
        h = (H - 2 * PAD) * value / top
        x = PAD + i * slot + slot * 0.1
        y = H - PAD - h
        bars.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.8:.1f}" height="{h:.1f}" fill="#4477aa">'
            f"<title>{esc(label)}: {esc(fmt.format(value))}</title></rect>"
            f'<text x="{x + slot * 0.4:.1f}" y="{H - PAD + 14}" font-size="10" text-anchor="middle">{esc(label)}</text>'
            f'<text x="{x + slot * 0.4:.1f}" y="{y - 3:.1f}" font-size="10" text-anchor="middle">{esc(fmt.format(value))}</text>'
        )
    if not values:
        bars.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" fill="#888">no data</text>')
    axis = f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#333"/>'
    return (
        f'<figure><svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        f'font-family="sans-serif"><text x="{PAD}" y="18" font-size="13" font-weight="bold">{esc(title)}</text>'
        f"{axis}{''.join(bars)}</svg></figure>"
    )


def _hist(stats: dict[str, Any], key: str) -> tuple[list[str], list[float]]:
    pairs = stats[key]
    return [str(k) for k, _ in pairs], [float(v) for _, v in pairs]


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def report_html(stats: dict[str, Any], sweep: str) -> str:
    solved, trees = stats["solved_trees"], stats["trees"]
    cached = stats["cached_token_share"]
    charts = [
        svg_bars("Trees solved", ["solved", "unsolved"], [solved, trees - solved], "{:.0f}"),
        svg_bars("Nodes per depth", *_hist(stats, "depth_histogram")),
        svg_bars("Leaves per depth (path length)", *_hist(stats, "leaf_depth_histogram")),
        svg_bars("Branching: expanded nodes per child count", *_hist(stats, "branching_histogram")),
        svg_bars("Generated tokens per solved tree (log2 buckets, up to)", *_hist(stats, "tokens_per_success_histogram")),
        svg_bars(
            "Prompt tokens served from the prefix cache",
            ["cached", "computed"] if cached is not None else [],
            [cached, 1 - cached] if cached is not None else [],
            "{:.1%}",
        ),
        svg_bars("Leaves by stop reason", list(stats["stop_reasons"]), [float(v) for v in stats["stop_reasons"].values()]),
        svg_bars("Dataset rows", list(stats["datasets"]), [float(v) for v in stats["datasets"].values()]),
    ]
    facts = [
        ("tasks", stats["tasks"]),
        ("trees", trees),
        ("nodes", stats["nodes"]),
        ("success rate", _share(stats["success_rate"])),
        ("generated tokens", stats["generated_tokens"]),
        ("tokens per success", "n/a" if stats["tokens_per_success"] is None else f"{stats['tokens_per_success']:.0f}"),
        ("cached-token share", _share(cached)),
    ]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>thicket report: {html.escape(sweep)}</title>"
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
        "figure{display:inline-block;margin:0.5em}th{text-align:left;padding-right:1em}</style></head><body>"
        f"<h1>thicket report: {html.escape(sweep)}</h1><table>{table}</table>{''.join(charts)}"
        f"<h2>stats.json</h2><pre>{html.escape(json.dumps(stats, indent=1, sort_keys=True))}</pre></body></html>\n"
    )


DESCRIPTIONS = {
    "sft": "The best successful root-to-leaf path per task (highest return, then fewest steps, then lowest "
    "node id) as TRL conversational `messages`: the exact chat the policy saw plus the final assistant turn.",
    "sft_fastchat": "The same paths in FastChat layout: `id`, `conversations` of {from: system|human|gpt, value}.",
    "dpo": "Preference pairs in TRL format (`prompt`, `chosen`, `rejected` message lists). `kind` = trajectory: "
    "a successful path vs a failed one of the same task (ETO-style); `kind` = step: sibling replies whose "
    "values differ by at least beta (DensePolicy-style). The prompt is the chat up to the shared prefix.",
    "revision": "Agent-R revision trajectories: a bad path up to its transition point (loss 0), an assistant "
    "revision turn `Thought: ...\\nAction: wait` (loss 1), user `ok.`, then the good path from where the two "
    "part (assistant turns loss 1). Every message carries a `loss` flag; `transition_method` says how the "
    "cut was found.",
    "tokens": "Token-level RL rows, one per root-to-leaf trajectory with sampled ids: `prompt_ids`, "
    "`response_ids`, `loss_mask` (1 on sampled reply tokens), `rollout_logprobs`, `stop_reason`, `reward` "
    "(the path's return), `group_id` (the task: a GRPO group), `trajectory_id`. Paths that the search's "
    "budget, a timeout or an error cut short have reward 0 without an outcome: for outcome rewards keep the "
    "rows whose `stop_reason` is one of " + ", ".join(EVALUATED) + ".",
}


def dataset_card(
    sweep: str, spec: dict[str, Any] | None, rows: dict[str, int], files: dict[str, list[str]], params: dict[str, Any]
) -> str:
    lines = [
        f"# Datasets of sweep `{sweep}`",
        "",
        "Built by `thicket aggregate` from the sweep's committed tree shards. Paths are relative to this folder.",
        "",
    ]
    lines += ["| dataset | rows | files |", "| --- | ---: | ---: |"]
    lines += [f"| `{name}` | {rows[name]} | {len(files[name])} |" for name in sorted(rows)]
    lines += [""]
    for name in sorted(rows):
        lines += [f"## {name}", "", DESCRIPTIONS[name], ""]
        if files[name]:
            lines += [
                "```python",
                "import datasets",
                f'ds = datasets.load_dataset("parquet", data_files={{"train": "{name}/*.parquet"}}, split="train")',
                "```",
                "",
            ]
        else:
            lines += ["(empty: no rows, no files)", ""]
    lines += ["## Parameters", "", "```yaml", yaml.safe_dump(params, sort_keys=True).rstrip(), "```", ""]
    lines += ["## Sweep spec", ""]
    if spec is None:
        lines += ["(no spec.yaml in the sweep folder)", ""]
    else:
        summary = {k: spec[k] for k in ("name", "tasks", "search", "policy", "seed") if k in spec}
        lines += ["```yaml", yaml.safe_dump(summary, sort_keys=False).rstrip(), "```", ""]
    lines += [
        "`stats.json` holds the sweep's statistics and `report.html` plots them. `_SUCCESS.json` is written last "
        "and lists every file with its SHA-256 and row count: read only a folder that has it.",
        "",
    ]
    return "\n".join(lines)
