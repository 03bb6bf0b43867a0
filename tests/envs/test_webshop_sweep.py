"""A real uniform-policy sweep of webshop through `thicket run`, in process and with its default
env sidecar: trees and datasets are written and hold the properties the methods define
(tests/support/dataset_checks.py), and buying near misses earns partial rewards."""

from __future__ import annotations

import html
from pathlib import Path

import pytest
import yaml

from tests.support.dataset_checks import run_checked_sweep
from thicket.shards.storage import iter_shards
from thicket.storage.store import LocalStore

SWEEP = Path(__file__).parents[2] / "sweeps" / "webshop-uniform.yaml"


@pytest.mark.parametrize("env_server", ["in_process", "sidecar"])
def test_a_uniform_webshop_sweep_writes_trees_and_datasets(tmp_path, env_server):
    spec = yaml.safe_load(SWEEP.read_text())
    spec["tasks"] |= {"start": 0, "stop": 4}
    spec["search"] |= {"iterations": 20}
    spec["output"] = str(tmp_path / "out")
    if env_server == "in_process":
        spec["tasks"]["env_server"] = {"mode": "in_process"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = tmp_path / "out" / spec["name"]
    stats = run_checked_sweep(path, sweep, timeout=300).stats
    assert stats["trees"] == 4 and set(stats["reward_semantics"]) == {"increment"}
    # the card says the catalogue was generated, not WebShop's (through /describe with the sidecar)
    [(source, trees)] = stats["data_sources"].items()
    assert trees == 4 and source.startswith("webshop: thicket's synthetic WebShop catalogue (1000 products, seed 0, goals auto)")
    assert "NOT WebShop's benchmark" in source and "generated (generator v3)" in source
    assert "success rates and scores on it are not comparable with the papers'" in source
    card = (sweep / "datasets" / "README.md").read_text()
    assert f"## Data\n\n- {source} (4 trees)\n" in card
    report = (sweep / "datasets" / "report.html").read_text()  # beside the success rate
    assert f"<tr><th>data</th><td>{html.escape(source)}</td></tr>" in report
    rewards = [[r["reward"] for r in table.to_pylist()] for _, table in iter_shards(LocalStore(sweep))]
    assert len(rewards) == 4
    assert sum(any(0 < r < 1 for r in tree) for tree in rewards) >= 3  # partial rewards occur
    assert min(r for tree in rewards for r in tree) >= 0  # WebShop's reward is never negative
