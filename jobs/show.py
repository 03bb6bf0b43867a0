"""`thicket show`: one committed search tree as a standalone HTML page.

The page has no scripts and no external resources: inline CSS, and one `<details>` element
per node, nested as the tree is, so a browser folds and unfolds subtrees. Every text from
the shard is escaped; long texts are cut to MAX_TEXT_CHARS with a note.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import numpy as np

from thicket.aggregate.view import MalformedShard, TreeView
from thicket.errors import BadInput
from thicket.index_sets import format_index_set
from thicket.shards.storage import committed_task_ids, read_marker, read_shard
from thicket.storage import open_store
from thicket.storage.store import Store

MAX_TEXT_CHARS = 2000
NODE_COLUMNS = ("action", "reply", "observation", "stop_reason", "label")

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.3em; }
table.summary td { padding: 0.1em 1em 0.1em 0; }
table.summary td:first-child { color: #666; }
details.node { margin: 0.2em 0 0.2em 1.2em; border-left: 2px solid #ddd; padding-left: 0.6em; }
details.node.win { border-left-color: #2a9d4b; }
summary { cursor: pointer; }
summary code { background: #f3f3f3; padding: 0 0.3em; }
.id { color: #888; } .stop { color: #555; font-style: italic; } .win-mark { color: #2a9d4b; font-weight: bold; }
.success { color: #2a9d4b; font-weight: bold; }
pre { white-space: pre-wrap; background: #fafafa; border: 1px solid #eee; padding: 0.4em; margin: 0.2em 0; }
h4 { margin: 0.4em 0 0 0; font-size: 0.85em; color: #666; font-weight: normal; }
.cut { color: #a33; font-style: italic; }
"""


@dataclass(frozen=True)
class TreeSummary:
    sweep: str
    task: int
    env: str
    algorithm: str
    model: str
    nodes: int
    leaves: int
    max_depth: int
    solved: bool
    best_return: float  # highest return of a root-to-leaf path

    @classmethod
    def of(cls, view: TreeView, sweep_uri: str) -> TreeSummary:
        first = {name: view.table.column(name)[0].as_py() for name in ("env", "algorithm", "model")}
        leaves = view.leaves
        return cls(
            sweep=sweep_uri,
            task=view.task,
            nodes=view.size,
            leaves=len(leaves),
            max_depth=int(view.depth.max()),
            solved=bool(view.success[1:].any()),
            best_return=float(view.returns[leaves].max()) if len(leaves) else 0.0,
            **first,
        )


def load_tree(sweep_uri: str, task: int) -> TreeView:
    """Task's committed tree, every column, checksum verified."""
    return load_tree_in(open_store(sweep_uri), task, sweep_uri)


def load_tree_in(store: Store, task: int, where: str | None = None) -> TreeView:
    """load_tree, from the sweep's open store; `where` names it in errors as the user gave it."""
    marker = read_marker(store, task)
    if marker is None:
        raise BadInput(f"--task {task}: no committed tree in {where or store.uri}; {committed_summary(store)}")
    try:
        return TreeView.of(read_shard(store, marker))
    except MalformedShard as err:
        raise BadInput(f"shard {marker.data_key}: {err}") from None


def committed_summary(store: Store) -> str:
    """Which tasks have a committed tree, as ranges: 'tasks 0-31', 'tasks 0-3,5 (5 tasks)'."""
    tasks = committed_task_ids(store)
    if not tasks:
        return "it holds no committed trees: is it the sweep folder a run wrote?"
    ranges = format_index_set(tasks, limit=12)
    return f"it holds task {ranges}" if len(tasks) == 1 else f"it holds tasks {ranges} ({len(tasks)} tasks)"


def on_success_path(view: TreeView) -> np.ndarray:
    """Per node: it lies on a root-to-node path that ends in a success."""
    on = view.success.copy()
    parent = view.parent
    for node in range(view.size - 1, 0, -1):  # children come after their parents
        if on[node]:
            on[parent[node]] = True
    return on


def clip(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """Escaped text, cut to `limit` characters with a note saying how long it was."""
    if len(text) <= limit:
        return html.escape(text)
    return f'{html.escape(text[:limit])}<span class="cut"> [truncated: {len(text):,} characters in all]</span>'


def show_html(sweep_uri: str, task: int) -> str:
    view = load_tree(sweep_uri, task)
    return page_html(TreeSummary.of(view, sweep_uri), tree_html(view))


def tree_page(store: Store, task: int) -> str:
    """show_html, from the sweep's open store (the pages the aggregate writes beside report.html)."""
    view = load_tree_in(store, task)
    return page_html(TreeSummary.of(view, store.uri), tree_html(view))


def page_html(summary: TreeSummary, tree: str) -> str:
    rows = [
        ("sweep", summary.sweep), ("env", summary.env), ("algorithm", summary.algorithm),
        ("model", summary.model), ("nodes", f"{summary.nodes} ({summary.leaves} leaves, depth {summary.max_depth})"),
        ("solved", "yes" if summary.solved else "no"), ("best return", f"{summary.best_return:g}"),
    ]
    table = "".join(f"<tr><td>{k}</td><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
    title = html.escape(f"task {summary.task} - {summary.sweep}")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{CSS}</style></head><body>\n"
        f"<h1>Task {summary.task}</h1>\n<table class=\"summary\">{table}</table>\n"
        '<p>Per node: id, depth, action, reward, value and visits (where the search keeps them), '
        'why it stopped; <span class="win-mark">&#10003;</span> marks nodes on a successful path '
        "(unfolded).</p>\n"
        f'<div class="tree">\n{tree}</div>\n</body></html>\n'
    )


def tree_html(view: TreeView) -> str:
    """Nested <details>, one per node, children inside their parent (iterative: deep trees)."""
    columns = {name: view.table.column(name).to_pylist() for name in NODE_COLUMNS}
    winning = on_success_path(view)
    parts: list[str] = []
    stack = [0]
    while stack:
        node = stack.pop()
        if node < 0:  # ~child: that node's subtree is done
            parts.append("</div></details>\n")
            continue
        parts.append(_node_open(view, columns, bool(winning[node]), node))
        stack.append(~node)
        stack.extend(reversed(view.children(node)))
    return "".join(parts)


def _node_open(view: TreeView, columns: dict[str, list], winning: bool, node: int) -> str:
    action = columns["action"][node]
    facts = [
        f'<span class="id">#{node}</span>',
        f"depth {int(view.depth[node])}",
        f"<code>{clip(action, 200)}</code>" if node else "<code>(root)</code>",
        f"reward {view.reward[node]:g}",
    ]
    if view.visits[node] > 0:
        facts.append(f"value {view.value[node]:.3g}, {int(view.visits[node])} visits")
    if columns["label"][node] >= 0:
        facts.append(f"label {columns['label'][node]}")
    facts.append(f'<span class="stop">{html.escape(columns["stop_reason"][node])}</span>')
    if view.success[node]:
        facts.append('<span class="success">success</span>')
    if winning:
        facts.append('<span class="win-mark" title="on a successful path">&#10003;</span>')
    texts = [("reply", columns["reply"][node]), ("observation", columns["observation"][node])] if node else [
        ("observation", columns["observation"][node])]
    body = "".join(f"<h4>{name}</h4><pre>{clip(text)}</pre>" for name, text in texts if text)
    attrs = f' class="node{" win" if winning else ""}" data-node="{node}"{" open" if winning or node == 0 else ""}'
    return f"<details{attrs}><summary>{' &middot; '.join(facts)}</summary><div class=\"body\">{body}\n"
