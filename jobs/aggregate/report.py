"""report.html (standalone, inline SVG plots); the datasets' README card is card.py."""

from __future__ import annotations

import html
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from thicket.aggregate.forest import Forest
from thicket.aggregate.quality import quality_html

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


def _estimate(policy: dict[str, Any] | None, name: str) -> str:
    """A policy figure with its interval, or why there is none (stats.json `policy`)."""
    if not policy:
        return "n/a (no independent samples: algorithm sample, or thicket eval)"
    e = policy[name]
    return f"{e['mean']:.3f} [{e['low']:.3f}, {e['high']:.3f}] over {policy['tasks']} tasks (95%)"


@dataclass(frozen=True)
class TaskRow:
    """One committed tree, as the report's per-task table shows it."""

    task: int
    nodes: int
    successes: int  # success nodes (the root excluded)
    best_return: float | None  # the highest path return of its leaves; None: no leaves, or not stored
    llm_calls: int | None  # None: the shard does not record them

    @classmethod
    def of(cls, task: int, table: pa.Table) -> TaskRow:
        columns = table.column_names
        parent = table.column("parent").to_numpy(zero_copy_only=False).astype(np.int64)
        is_root = parent < 0
        success = table.column("success").to_numpy(zero_copy_only=False).astype(bool) & ~is_root
        has_child = np.zeros(len(parent), dtype=bool)
        has_child[parent[~is_root]] = True
        leaves = ~has_child & ~is_root
        best = None
        if "path_return" in columns and leaves.any():
            returns = table.column("path_return").to_numpy(zero_copy_only=False).astype(np.float64)[leaves]
            best = float(np.nanmax(returns)) if not np.isnan(returns).all() else None
        calls = int(pa.compute.sum(table.column("llm_calls")).as_py() or 0) if "llm_calls" in columns else None
        return cls(task, table.num_rows, int(success.sum()), best, calls)


def task_rows(forest: Forest) -> list[TaskRow]:
    """A forest's rows of the per-task table, one per tree."""
    starts = forest.starts
    return [TaskRow.of(int(task), forest.table.slice(int(starts[k]), int(starts[k + 1] - starts[k])))
            for k, task in enumerate(forest.tasks)]


def tasks_html(rows: Sequence[TaskRow], sweep_uri: str, tree_pages: Mapping[int, str] | None = None) -> str:
    """The per-task table: a link to each tree's page where one was written beside the report
    (`tree_pages`: task -> relative path), else the command that renders it."""
    esc = html.escape
    if not rows:
        return ""
    pages = tree_pages or {}
    body = []
    for r in rows:
        if r.task in pages:
            tree = f'<a href="{esc(pages[r.task], quote=True)}">tree</a>'
        else:
            tree = f"<code>thicket show {esc(shlex.quote(sweep_uri))} --task {r.task}</code>"
        best = "n/a" if r.best_return is None else f"{r.best_return:g}"
        calls = "n/a" if r.llm_calls is None else str(r.llm_calls)
        body.append(f"<tr><td>{r.task}</td><td>{r.nodes}</td><td>{r.successes}</td><td>{esc(best)}</td>"
                    f"<td>{calls}</td><td>{tree}</td></tr>")
    how = "" if pages else (' <small>(each tree renders to a page with <code>thicket show SWEEP --task N '
                            '-o tree.html</code>)</small>')
    return (f"<h2>Tasks</h2><p>{len(rows)} committed trees{how}</p>"
            '<table class="tasks"><tr><th>task</th><th>nodes</th><th>successes</th><th>best return</th>'
            f"<th>LLM calls</th><th>tree</th></tr>{''.join(body)}</table>")


def report_html(stats: dict[str, Any], sweep: str, tasks: Sequence[TaskRow] = (), sweep_uri: str | None = None,
                tree_pages: Mapping[int, str] | None = None) -> str:
    """The report; `tasks` (task_rows): its per-task table, naming `sweep_uri` (default
    `sweep`) in the commands that render each tree, or linking `tree_pages` (task -> path)."""
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
        ("data", "; ".join(stats.get("data_sources") or {}) or "n/a"),  # generated data says so (the env's words)
        ("trees", trees),
        ("nodes", stats["nodes"]),
        ("success rate", _share(stats["success_rate"])),
        ("generated tokens", stats["generated_tokens"]),
        ("tokens per success", "n/a" if stats["tokens_per_success"] is None else f"{stats['tokens_per_success']:.0f}"),
        ("cached-token share", _share(cached)),
        ("policy pass@1", _estimate(stats.get("policy"), "pass_at_1")),
        ("policy mean return", _estimate(stats.get("policy"), "mean_return")),
        ("empty datasets", ", ".join(sorted(k for k, v in stats["datasets"].items() if v == 0)) or "none"),
    ]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in facts)
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>thicket report: {html.escape(sweep)}</title>"
        "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}"
        "figure{display:inline-block;margin:0.5em}th{text-align:left;padding-right:1em}"
        "table.tasks td{padding-right:1em;text-align:right}table.tasks td:last-child{text-align:left}</style>"
        "</head><body>"
        f"<h1>thicket report: {html.escape(sweep)}</h1><table>{table}</table>{quality_html(stats)}{''.join(charts)}"
        f"{tasks_html(tasks, sweep_uri or sweep, tree_pages)}"
        f"<h2>stats.json</h2><pre>{html.escape(json.dumps(stats, indent=1, sort_keys=True))}</pre></body></html>\n"
    )
