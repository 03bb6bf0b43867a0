"""Shared by the fault suite: real sweeps in child processes, and the checks made after each
fault (every task committed exactly once; datasets as an undisturbed run's; the fault named).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from thicket.shards.storage import COMMITS, committed_tasks, iter_shards
from thicket.storage import open_store
from thicket.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
NAME = "faults"
# Columns that measure the run (time, vLLM's prefix cache, what a checkpoint brought back), not
# what was grown.
MEASURED_COLUMNS = ("llm_ms", "env_ms", "cached_tokens", "resumed_llm_calls", "resumed")
MEASURED_STATS = ("source_shards_sha256", "cached_token_share", "resumed")


def sweep_spec(tmp_path: Path, count: int = 6, **sections: dict[str, Any]) -> Path:
    """A small MCTS sweep on deterministic FrozenLake with the uniform policy (which solves
    some tasks, so every dataset gets rows); `sections` replace or extend the defaults.
    Each finished tree is committed at once, in a data file of its own (trees_per_shard 1),
    so that a fault injected after the first commit strikes mid-run."""
    spec: dict[str, Any] = {
        "name": NAME,
        "tasks": {"env": "frozenlake", "env_args": {"size": 4}, "start": 0, "stop": count, "per_index": count},
        "search": {"algorithm": "mcts", "iterations": 12, "expansions": 3, "max_depth": 10},
        "policy": {"kind": "uniform", "concurrency": 4},
        "output": str(tmp_path / "out"),
        "run": {"trees_in_flight": 2, "progress": False, "trees_per_shard": 1},
        "seed": 7,
    }
    for key, value in sections.items():
        spec[key] = {**spec[key], **value} if isinstance(spec.get(key), dict) and isinstance(value, dict) else value
    path = tmp_path / f"spec-{len(list(tmp_path.glob('spec-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def thicket(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([THICKET, *args], cwd=ROOT, env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def start_thicket(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([THICKET, *args], cwd=ROOT, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until(condition: Callable[[], bool], timeout: float, what: str,
               process: subprocess.Popen[str] | None = None) -> None:
    """Poll `condition`; fail after `timeout`, or at once if `process` exits first."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if process is not None and process.poll() is not None:
            raise AssertionError(f"exited ({process.returncode}) before {what}: {process.stderr.read()[-2000:]}")
        time.sleep(0.05)


def run_with_fault(spec: Path, out: str, fault: Callable[[], None], env: dict[str, str] | None = None,
                   timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`thicket run SPEC --output OUT` in a child process; once its first task is committed,
    `fault()` is injected; then the run is waited for."""
    run = start_thicket("run", str(spec), "--no-aggregate", "--output", out, env=env)
    store = open_store(f"{out.rstrip('/')}/{NAME}")
    try:
        wait_until(lambda: commits(store) >= 1, 300, "a first commit", run)
        fault()
        stdout, stderr = run.communicate(timeout=timeout)
    finally:
        run.kill()
    return subprocess.CompletedProcess(run.args, run.returncode, stdout, stderr)


class TcpRelay:
    """Forwards 127.0.0.1:port to an upstream port, byte for byte; `cut()` closes every
    connection and stops listening: to its clients the upstream is gone for good."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.is_cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            if self.is_cut:
                client.close()
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        self.is_cut = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def trees(sweep_uri: str) -> pa.Table:
    """Every committed tree of the sweep, in one table."""
    return pa.concat_tables(table for _, table in iter_shards(open_store(sweep_uri)))


def commits(store: Store) -> int:
    return sum(1 for key in store.list(COMMITS) if key.endswith(".json"))


def assert_each_task_committed_once(sweep_uri: str, tasks: list[int]) -> None:
    """One commit marker per task, and its shard holds exactly one tree of that task."""
    store = open_store(sweep_uri)
    markers = committed_tasks(store)
    assert sorted(markers) == tasks
    trees: dict[int, int] = {}
    for marker, table in iter_shards(store):
        assert set(table.column("task").to_pylist()) == {marker.task}
        trees[marker.task] = trees.get(marker.task, 0) + len(pc.unique(table.column("tree")))
    assert trees == {task: 1 for task in tasks}


@dataclass(frozen=True, eq=False)
class Fingerprint:
    """A digest of a table's content but its logprobs, and the logprobs: equal where the digests
    are and each logprob is within float noise. vLLM's logprobs (processed_logprobs: a
    log_softmax over the batch's logits after the temperature) differ in their last bits when the
    same request runs in a batch of another composition, as after a server restart; the sampled
    ids, texts and everything else must be equal to the bit."""

    digest: str
    logprobs: tuple[float, ...]

    @classmethod
    def of(cls, tables: list[pa.Table], logprob_columns: tuple[str, ...] = ("logprobs", "rollout_logprobs")) -> Fingerprint:
        digest, logprobs = hashlib.sha256(), []
        for table in tables:
            for name in logprob_columns:
                if name in table.column_names:
                    logprobs += pc.list_flatten(table.column(name)).to_pylist()
                    table = table.drop_columns([name])
            digest.update(json.dumps(table.to_pylist(), sort_keys=True, default=str).encode())
        return cls(digest.hexdigest(), tuple(logprobs))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Fingerprint) and self.digest == other.digest
                and len(self.logprobs) == len(other.logprobs)
                and all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5) for a, b in zip(self.logprobs, other.logprobs)))

    __hash__ = None  # type: ignore[assignment]


def tree_fingerprint(sweep_uri: str) -> Fingerprint:
    """Every committed tree's content (measured columns left out)."""
    tables = [table.drop_columns([c for c in MEASURED_COLUMNS if c in table.column_names])
              for _, table in sorted(iter_shards(open_store(sweep_uri)), key=lambda pair: pair[0].task)]
    return Fingerprint.of(tables)


def dataset_fingerprint(sweep_uri: str, env: dict[str, str] | None = None) -> dict[str, Fingerprint | str]:
    """Aggregate the sweep, then fingerprint each dataset file (stats without the measured figures)."""
    result = thicket("aggregate", sweep_uri, env=env)
    assert result.returncode == 0, result.stderr
    store = open_store(sweep_uri)
    # A part's name carries its bytes' SHA-256, and its bytes the measured figures: keyed without it.
    digests: dict[str, Fingerprint | str] = {
        re.sub(r"-[0-9a-f]{16}\.parquet$", ".parquet", key): Fingerprint.of([pq.read_table(pa.BufferReader(store.get(key)))])
        for key in store.list("datasets/") if key.endswith(".parquet")}
    stats = json.loads(store.get("datasets/stats.json"))
    for key in MEASURED_STATS:
        stats.pop(key, None)
    digests["stats.json"] = hashlib.sha256(json.dumps(stats, sort_keys=True).encode()).hexdigest()
    return digests


def undisturbed(tmp_path: Path, spec: Path) -> tuple[Fingerprint, dict[str, Fingerprint | str]]:
    """The reference: the same spec run once without faults; (tree digest, dataset digests)."""
    out = tmp_path / "undisturbed"
    result = thicket("run", str(spec), "--no-aggregate", "--output", str(out))
    assert result.returncode == 0, result.stderr
    uri = str(out / NAME)
    return tree_fingerprint(uri), dataset_fingerprint(uri)
