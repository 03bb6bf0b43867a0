"""Observability: JSON logs, the Prometheus endpoint, `thicket show` (uniform policy, real envs)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
import yaml
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.protocol import Observation, Transition
from thicket.errors import BadInput, Unavailable
from thicket.logs import JsonFormatter
from thicket.metrics import serve_metrics
from thicket.policy.base import Reply
from thicket.policy.openai import OpenAIConfig, OpenAIPolicy
from thicket.rollout.sweep import run_tasks
from thicket.search.tree import StopReason, Tree, backpropagate
from thicket.shards.storage import read_marker, read_shard, write_shard
from thicket.shards.table import TreeMeta, tree_table
from thicket.show import MAX_TEXT_CHARS, load_tree, show_html
from thicket.spec import parse_spec
from thicket.storage.s3 import S3Store
from thicket.storage.store import LocalStore, StorageSettings, StoreUnavailable
from thicket.transport import free_port

ROOT = Path(__file__).resolve().parent.parent
THICKET = str(Path(sys.executable).parent / "thicket")
SWEEP = "demo-textcraft-mcts"


def thicket(*args: str, env: dict | None = None, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([THICKET, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def uniform_spec(tmp_path: Path, latency_s: float = 0.0, **tasks: object) -> Path:
    """sweeps/demo.yaml with the uniform policy (simulated request latency `latency_s`)."""
    data = yaml.safe_load((ROOT / "sweeps/demo.yaml").read_text())
    data["policy"] = {"kind": "uniform", "latency_s": latency_s, "concurrency": 32}
    data["tasks"] |= tasks
    path = tmp_path / "uniform.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def shard_rows(sweep: Path) -> dict[int, int]:
    """Rows per task in the sweep's data files (a file may hold several trees)."""
    tasks = [t for p in (sweep / "trees" / "data").glob("*.parquet")
             for t in pq.read_table(p, columns=["task"]).column("task").to_pylist()]
    return {task: tasks.count(task) for task in sorted(set(tasks))}


@pytest.fixture(scope="module")
def json_run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The demo sweep with the uniform policy and JSON logs: (sweep folder, stderr records)."""
    out = tmp_path_factory.mktemp("json-run")
    result = thicket("--log-format", "json", "run", "sweeps/demo.yaml", "--policy", "uniform", "--output", str(out),
                     "--no-aggregate", "--no-progress")
    assert result.returncode == 0, result.stderr
    return out / SWEEP, [json.loads(line) for line in result.stderr.splitlines() if line.strip()]


# -- logs -----------------------------------------------------------------------------------------

def test_json_logs_are_one_object_per_line_with_the_task_fields(json_run):
    sweep, records = json_run
    rows = shard_rows(sweep)
    assert sorted(rows) == list(range(200, 206))
    for record in records:
        assert {"time", "level", "logger", "message"} <= set(record)
        datetime.fromisoformat(record["time"])
    worker = [r for r in records if r["logger"] == "thicket.worker"]
    started = {r["task"] for r in worker if r.get("status") == "started"}
    committed = {r["task"]: r for r in worker if r.get("commit") == "committed"}
    finished = {r["task"]: r for r in worker if r["message"].startswith(f"task {r.get('task')} finished")}
    assert started == set(committed) == set(finished) == set(rows)
    for task, record in finished.items():
        assert record["level"] == "INFO" and record["tree"] == task
        assert record["status"] == "committed" and record["nodes"] == rows[task] == committed[task]["nodes"]
        assert record["llm_requests"] > 0 and record["seconds"] > 0
        solved = any(success for p in (sweep / "trees" / "data").glob("*.parquet")
                     for success in pq.read_table(p, filters=[("task", "=", task)], columns=["success"]).column(0).to_pylist())
        assert record["solved"] is solved  # the log says what the tree holds


def test_log_format_comes_from_the_environment_and_is_text_by_default(tmp_path):
    args = ("run", "sweeps/demo.yaml", "--policy", "uniform", "--indices", "200", "--no-aggregate", "--no-progress")
    as_json = thicket(*args, "--output", str(tmp_path / "a"), env={"THICKET_LOG_FORMAT": "json"})
    assert as_json.returncode == 0, as_json.stderr
    messages = [json.loads(line)["message"] for line in as_json.stderr.splitlines()]
    assert "task 200 started" in messages
    as_text = thicket(*args, "--output", str(tmp_path / "b"), env={"THICKET_LOG_FORMAT": ""})
    assert as_text.returncode == 0, as_text.stderr
    assert " INFO thicket.worker: task 200 started" in as_text.stderr
    assert not any(line.startswith("{") for line in as_text.stderr.splitlines())
    bad = thicket("--log-format", "xml", "validate", "sweeps/demo.yaml")
    assert bad.returncode == 2 and "--log-format" in bad.stderr


def test_json_formatter_keeps_extras_exceptions_and_values_json_cannot_hold():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("thicket.test-json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            logger.error("task %d failed", 3, exc_info=True, extra={"task": 3, "path": Path("/x"), "node": 7})
    finally:
        logger.removeHandler(handler)
    (line,) = stream.getvalue().splitlines()
    record = json.loads(line)
    assert record["message"] == "task 3 failed" and record["level"] == "ERROR"
    assert record["task"] == 3 and record["node"] == 7 and record["path"] == "/x"
    assert "ValueError: boom" in record["exception"]
    assert "args" not in record and "msg" not in record  # LogRecord internals stay out


# -- metrics --------------------------------------------------------------------------------------

def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """GET /metrics over HTTP: {(sample name, sorted labels): value}."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


COUNTS = {
    "committed": ("thicket_tasks_total", {"status": "committed"}),
    "failed": ("thicket_tasks_total", {"status": "failed"}),
    "nodes": ("thicket_nodes_total", {}),
    "llm": ("thicket_llm_request_seconds_count", {}),
    "env": ("thicket_env_step_seconds_count", {}),
}


def test_a_run_counts_tasks_nodes_llm_requests_and_env_steps_on_the_endpoint(tmp_path):
    spec = parse_spec(yaml.safe_load(uniform_spec(tmp_path, latency_s=0.001, env_server={"mode": "in_process"})
                                     .read_text()) | {"output": str(tmp_path)}, "uniform.yaml")
    before = {key: sample(name, **labels) for key, (name, labels) in COUNTS.items()}
    endpoint = serve_metrics(0, "127.0.0.1")
    try:
        summary = asyncio.run(run_tasks(spec, [0, 1, 2], progress=False))
        scraped = scrape(endpoint.port)
    finally:
        endpoint.close()
    delta = {key: scraped[(name, tuple(sorted(labels.items())))] - before[key] for key, (name, labels) in COUNTS.items()}
    rows = shard_rows(tmp_path / SWEEP)
    assert delta["committed"] == 3 and delta["failed"] == 0
    assert delta["nodes"] == sum(rows.values()) > 3
    assert delta["llm"] == sum(o.llm_requests for o in summary.report.outcomes) > 0
    assert delta["env"] >= sum(rows.values()) - 3  # a step per node below a root, replays aside
    assert scraped[("thicket_llm_requests_in_flight", ())] == 0
    for target in ("llm", "env", "storage"):
        assert ("thicket_retries_total", (("target", target),)) in scraped
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{endpoint.port}/metrics", timeout=2)


def test_the_worker_serves_metrics_over_http_while_it_runs(tmp_path):
    spec = uniform_spec(tmp_path, latency_s=0.1)
    port = free_port()
    proc = subprocess.Popen([THICKET, "worker", str(spec), "--index", "0", "--output", str(tmp_path),
                             "--metrics-port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: dict = {}
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            seen = scrape(port)
        except httpx.TransportError:
            pass  # not listening yet
        if seen.get(("thicket_llm_request_seconds_count", ()), 0) > 0 and seen.get(("thicket_env_step_seconds_count", ()), 0) > 0:
            break
        time.sleep(0.05)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr.decode()
    assert seen.get(("thicket_llm_request_seconds_count", ()), 0) > 0, "no LLM request seen while the worker ran"
    assert seen[("thicket_env_step_seconds_count", ())] > 0
    names = {name for name, _ in seen}
    assert {"thicket_tasks_total", "thicket_nodes_total", "thicket_llm_requests_in_flight",
            "thicket_retries_total", "thicket_prefix_cache_hit_ratio"} <= names
    assert ("thicket_tasks_total", (("status", "timed_out"),)) in seen


def test_a_busy_metrics_port_is_a_one_line_bad_input(tmp_path):
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        result = thicket("worker", str(uniform_spec(tmp_path)), "--index", "0", "--output", str(tmp_path),
                         "--metrics-port", str(busy.getsockname()[1]))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--metrics-port" in result.stderr


async def test_retries_are_counted_by_target(monkeypatch):
    closed = f"http://127.0.0.1:{free_port()}"
    before = {t: sample("thicket_retries_total", target=t) for t in ("llm", "env", "storage")}
    async with EnvClient(ClientConfig(closed, retry_deadline_s=0.3)) as client:
        with pytest.raises(Unavailable):
            await client.call("GET", "/health")
    policy = OpenAIPolicy(OpenAIConfig(f"{closed}/v1", "m", retry_deadline_s=0.3, retry_backoff_s=0.01))
    with pytest.raises(Unavailable):
        await policy.propose([{"role": "user", "content": "hi"}], 1, valid_actions=None, seed=0)
    await policy.close()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    store = S3Store("s3://bucket/prefix", StorageSettings(endpoint_url=closed, region="us-east-1", retry_deadline_s=0.5))
    with pytest.raises(StoreUnavailable):
        await asyncio.to_thread(store.exists, "key")
    for target in ("llm", "env", "storage"):
        assert sample("thicket_retries_total", target=target) - before[target] >= 1, target


# -- thicket show ---------------------------------------------------------------------------------

class Outline(HTMLParser):
    """The nesting of <details data-node> elements, and every start tag seen."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[int | None] = []  # node of each open <details> (None: other details)
        self.parent: dict[int, int] = {}
        self.opened: dict[int, bool] = {}
        self.classes: dict[int, str] = {}
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        if tag != "details":
            return
        a = dict(attrs)
        node = int(a["data-node"]) if a.get("data-node") is not None else None
        if node is not None:
            enclosing = [n for n in self.open if n is not None]
            self.parent[node] = enclosing[-1] if enclosing else -1
            self.opened[node] = "open" in a
            self.classes[node] = a.get("class") or ""
        self.open.append(node)

    def handle_endtag(self, tag: str) -> None:
        if tag == "details":
            self.open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def outline(page: str) -> Outline:
    parser = Outline()
    parser.feed(page)
    parser.close()
    assert parser.open == [], "unclosed <details>"
    return parser


def reply(action: str) -> Reply:
    return Reply(text=f"Thought: try it.\nAction: {action}", thought="try it.", action=action)


def handmade_tree(task: int) -> Tree:
    """root -> a (-> c success, d) and b; a script in the root's observation, a long one in c's."""
    tree = Tree.start(task, Observation("<script>alert('x')</script> You are in a room.", ("go north", "go south")), 0)
    a = tree.add_child(tree.root, reply("go north"), Transition(Observation("A dark hall."), 0.0, False))
    b = tree.add_child(tree.root, reply("go south"), Transition(Observation("A wall."), 0.0, False))
    c = tree.add_child(a, reply("take <key>"), Transition(Observation("gold " * 1000), 1.0, True, success=True))
    d = tree.add_child(a, reply("wait"), Transition(Observation("Nothing happens."), 0.0, True))
    b.close(StopReason.DEPTH_LIMIT)
    c.close(StopReason.DONE)
    d.close(StopReason.DONE)
    for leaf, value in ((c, 1.0), (d, 0.0), (b, 0.0)):
        backpropagate(leaf, value)
    return tree


def test_show_renders_a_tree_nested_as_it_is_with_every_text_escaped(tmp_path):
    tree = handmade_tree(7)
    meta = TreeMeta(sweep="hand", env="textcraft", algorithm="mcts", model="m<1>", seed=0)
    write_shard(LocalStore(tmp_path / "hand"), 7, tree_table(tree, meta), "w")
    page = show_html(str(tmp_path / "hand"), 7)
    parsed = outline(page)
    assert parsed.parent == {0: -1, 1: 0, 2: 0, 3: 1, 4: 1}
    assert "script" not in parsed.tags and "<script>" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)" in page
    text = "".join(parsed.text)
    for action in ("go north", "go south", "take <key>", "wait"):
        assert action in text
    assert "m<1>" in text and "&lt;key&gt;" in page
    assert f"truncated: {len('gold ' * 1000):,} characters in all" in text
    assert ("gold " * 1000)[: MAX_TEXT_CHARS + 5] not in text  # the long observation is cut
    on_path = {n for n, cls in parsed.classes.items() if "win" in cls.split()}
    assert on_path == {0, 1, 3} and all(parsed.opened[n] for n in on_path) and not parsed.opened[4]
    assert "solvedyes" in text and "best return1" in text


def test_show_a_real_tree_from_the_cli(json_run, tmp_path):
    sweep, _ = json_run
    result = thicket("show", str(sweep), "--task", "202", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "wrote tree-task-202.html"
    page = (tmp_path / "tree-task-202.html").read_text()
    parsed = outline(page)
    table = read_shard(LocalStore(sweep), read_marker(LocalStore(sweep), 202))
    assert parsed.parent == dict(enumerate(table.column("parent").to_pylist()))
    text = "".join(parsed.text)
    assert all(action in text for action in set(table.column("action").to_pylist()))
    assert f"{table.num_rows} (" in text and "textcraft" in text and "mcts" in text
    assert not {"script", "link", "img", "iframe"} & parsed.tags  # standalone: nothing to fetch or run
    assert thicket("show", str(sweep), "--task", "202", "-o", "-").stdout == page
    missing = thicket("show", str(sweep), "--task", "99")
    assert missing.returncode == 2
    assert missing.stderr.count("\n") == 1 and "task 99" in missing.stderr and str(sweep) in missing.stderr


def test_load_tree_names_the_task_and_the_sweep(tmp_path):
    with pytest.raises(BadInput, match=f"task 5: no committed tree in {tmp_path}"):
        load_tree(str(tmp_path), 5)
