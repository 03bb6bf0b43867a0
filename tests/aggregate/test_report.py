"""report.html's per-task table: a row per committed tree (nodes, successes, best return, LLM
calls), with a link to the tree's page where one is written beside it, else the command that
renders it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml

from thicket.aggregate.report import TaskRow, report_html
from thicket.storage import open_store

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")


class Tables(HTMLParser):
    """The rows (cell texts) of the table of class `tasks`, and every link and source."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.links: list[str] = []
        self._in, self._cell = False, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and attrs.get("class") == "tasks":
            self._in = True
        elif self._in and tag == "tr":
            self.rows.append([])
        elif self._in and tag in ("td", "th"):
            self._cell = ""
        for name in ("href", "src"):
            if name in attrs:
                self.links.append(attrs[name])

    def handle_endtag(self, tag):
        if tag == "table":
            self._in = False
        elif self._in and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    data = yaml.safe_load((ROOT / "sweeps/demo.yaml").read_text())
    data["policy"] = {"kind": "uniform", "concurrency": 8}
    data["tasks"]["stop"] = 203
    data["output"] = str(tmp / "out")
    spec = tmp / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    result = subprocess.run([THICKET, "run", str(spec), "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                            timeout=180, env={**os.environ, "THICKET_LOG_FORMAT": ""})
    assert result.returncode == 0, result.stderr
    return tmp / "out" / "demo-textcraft-mcts"


def _rows_of(sweep: Path) -> list[TaskRow]:
    tables = [pq.read_table(p) for p in sorted((sweep / "trees" / "data").glob("*.parquet"))]
    table = pa.concat_tables(tables)
    return [TaskRow.of(task, table.filter(pc.equal(table.column("task"), task))) for task in (200, 201, 202)]


def test_the_written_report_counts_each_committed_tree(sweep: Path) -> None:
    parsed = Tables()
    parsed.feed((sweep / "datasets" / "report.html").read_text())
    body = parsed.rows[1:]
    assert [int(r[0]) for r in body] == [200, 201, 202]
    tables = [pq.read_table(p) for p in (sweep / "trees" / "data").glob("*.parquet")]
    for row in body:
        task = int(row[0])
        nodes = sum(t.filter(t.column("task").to_numpy() == task).num_rows for t in tables)
        calls = sum(pc.sum(t.filter(t.column("task").to_numpy() == task).column("llm_calls")).as_py() or 0
                    for t in tables)
        assert int(row[1]) == nodes > 1
        assert int(row[2]) >= 0 and int(row[4]) == calls > 0  # the uniform policy's picks
        assert row[3] != "n/a"


def test_the_report_has_a_row_per_task_naming_the_command_that_renders_its_tree(sweep: Path) -> None:
    store = open_store(str(sweep))
    stats = json.loads((sweep / "datasets" / "stats.json").read_text())
    rows = _rows_of(sweep)
    page = report_html(stats, "demo", rows, store.uri)
    parsed = Tables()
    parsed.feed(page)
    assert parsed.rows[0] == ["task", "nodes", "successes", "best return", "LLM calls", "tree"]
    body = parsed.rows[1:]
    assert [int(r[0]) for r in body] == [200, 201, 202]
    assert [int(r[1]) for r in body] == [r.nodes for r in rows]
    assert body[0][5] == f"thicket show {store.uri} --task 200"
    assert parsed.links == []  # one file: nothing to fetch
    linked = Tables()
    linked.feed(report_html(stats, "demo", rows, store.uri, tree_pages={200: "trees/task-200.html"}))
    assert linked.links == ["trees/task-200.html"] and linked.rows[1][5] == "tree"
    assert linked.rows[2][5] == f"thicket show {store.uri} --task 201"


def test_a_report_without_task_rows_has_no_task_table(sweep: Path) -> None:
    stats = json.loads((sweep / "datasets" / "stats.json").read_text())
    assert "<h2>Tasks" not in report_html(stats, "x")


def test_unknown_figures_read_n_a() -> None:
    from thicket.aggregate.report import tasks_html

    page = tasks_html([TaskRow(7, 1, 0, None, None)], "s3://b/p <x>")
    assert re.search(r"<td>7</td><td>1</td><td>0</td><td>n/a</td><td>n/a</td>", page)
    assert "s3://b/p &lt;x&gt;" in page or "&#x27;s3://b/p &lt;x&gt;&#x27;" in page
