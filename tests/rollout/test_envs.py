"""Where a run's envs come from (thicket.rollout.envs): the spec's env server settings, and
`thicket run` with its env in a sidecar growing the trees it grows in process."""

from __future__ import annotations

import re

import pytest

from thicket.errors import BadInput
from thicket.rollout.sweep import run_tasks
from thicket.shards.storage import iter_shards
from thicket.spec import parse_spec
from thicket.storage.store import LocalStore


# --- wiring: the spec and `thicket run` -----------------------------------------------

SPEC = {
    "name": "sidecar-check",
    "tasks": {"env": "textcraft", "start": 0, "stop": 2},
    "search": {"algorithm": "mcts", "iterations": 3, "expansions": 2, "max_depth": 4},
    "policy": {"kind": "uniform"},
    "run": {"progress": False},
}
TREE_COLUMNS = ["task", "node", "parent", "observation", "action", "reward", "done", "visits", "value", "stop_reason"]


def test_env_server_settings_are_checked():
    assert parse_spec(SPEC | {"output": "o"}).tasks.env_server.mode == "sidecar"  # the default
    remote = {"mode": "remote", "url": "http://agentgym:36001", "adapter": "agentgym"}
    spec = parse_spec(SPEC | {"output": "o", "tasks": SPEC["tasks"] | {"env": "webshop", "env_server": remote}})
    assert spec.tasks.env == "webshop"  # AgentGym's own WebShop server, through its adapter
    for server, message in [
        ({"mode": "remote"}, "mode remote needs `url`"),
        ({"url": "http://h:1"}, "`url` goes with mode remote"),
        ({"adapter": "agentgym"}, "adapter agentgym needs mode remote"),
        ({"mode": "remote", "url": "h:1"}, "expected an http(s) URL"),
        (remote, None),
    ]:
        tasks = SPEC["tasks"] | {"env": "chess" if message is None else "textcraft", "env_server": server}
        with pytest.raises(BadInput, match=re.escape(message or "no AgentGym adapter for env 'chess'")):
            parse_spec(SPEC | {"output": "o", "tasks": tasks})


async def test_thicket_run_in_a_sidecar_grows_the_trees_it_grows_in_process(tmp_path):
    tables = {}
    for mode in ("sidecar", "in_process"):
        tasks = SPEC["tasks"] | {"env_server": {"mode": mode}}
        spec = parse_spec(SPEC | {"tasks": tasks, "output": str(tmp_path / mode)})
        summary = await run_tasks(spec, [0, 1], progress=False)
        assert not summary.report.failed
        trees = iter_shards(LocalStore(tmp_path / mode / spec.name))
        tables[mode] = [table.select(TREE_COLUMNS).to_pylist() for _, table in trees]
    assert len(tables["sidecar"]) == 2 and tables["sidecar"] == tables["in_process"]
