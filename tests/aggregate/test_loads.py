"""A sweep's datasets load as that sweep's rows, through every documented path (issue 48).

The defect, reproduced through the CLI: two sweeps whose datasets have the same configs but other
rows. HF `datasets` keys its cache on the dataset card (the folder's base name, always `datasets`,
the config name and the data-file patterns), so with `sft/*.parquet` in both cards the second load
returned the first sweep's rows. The oracle is each sweep's own Parquet files, read directly.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow.parquet as pq
import pytest
import yaml

import thicket
from tests.support.random_trees import synthetic_sweep
from thicket.aggregate.driver import aggregate
from thicket.errors import BadInput
from thicket.storage import open_store
from thicket.storage.store import LocalStore
from thicket.sweep_datasets import DatasetMismatch

THICKET = str(Path(sys.executable).parent / "thicket")


def run_sweep(tmp_path: Path, name: str, start: int, stop: int, seed: int, indices: str | None = None) -> Path:
    """A uniform MCTS sweep on FrozenLake through the CLI, like the issue's reproduction."""
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump({
        "name": name, "tasks": {"env": "frozenlake", "start": start, "stop": stop, "per_index": stop - start},
        "search": {"algorithm": "mcts", "iterations": 10, "expansions": 3, "max_depth": 10},
        "policy": {"kind": "uniform"}, "output": str(tmp_path / "out"), "seed": seed,
    }))
    args = [THICKET, "run", str(spec), "--no-progress"] + (["--indices", indices] if indices else [])
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp_path / "out" / name


def ids_in_files(sweep: Path, name: str) -> list[str]:
    """The oracle: the `id` column of the dataset's files as _SUCCESS.json lists them."""
    listed = json.loads((sweep / "datasets" / "_SUCCESS.json").read_text())["files"]
    paths = sorted(f["path"] for f in listed if f["path"].startswith(f"{name}/"))
    return [i for p in paths for i in pq.read_table(sweep / "datasets" / p, columns=["id"]).column("id").to_pylist()]


def hf_ids(sweep: Path, name: str | None) -> list[str]:
    args = (str(sweep / "datasets"), name) if name else (str(sweep / "datasets"),)
    return datasets.load_dataset(*args, split="train")["id"]


@pytest.fixture
def two_sweeps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    one = run_sweep(tmp_path, "loads-1", 10, 13, seed=1)
    two = run_sweep(tmp_path, "loads-2", 20, 24, seed=2)
    configs = [[c["config_name"] for c in yaml.safe_load((s / "datasets" / "README.md").read_text().split("---\n")[1])["configs"]]
               for s in (one, two)]
    assert configs[0] == configs[1] and "sft" in configs[0]  # the same configs: the collision's condition
    assert set(ids_in_files(one, "sft")).isdisjoint(ids_in_files(two, "sft"))  # and different rows
    return one, two


def test_two_sweeps_with_the_same_configs_load_their_own_rows_in_one_process(two_sweeps):
    one, two = two_sweeps
    for sweep in (one, two, one):  # one after the other, and back: nothing served from the other's cache
        for name in ("sft", "dpo", None):  # None: the card's default config (sft)
            assert hf_ids(sweep, name) == ids_in_files(sweep, name or "sft")
        assert thicket.load(str(sweep), "sft")["id"] == ids_in_files(sweep, "sft")


LOAD_IN_A_PROCESS = """
import sys, datasets
print(len(datasets.load_dataset(sys.argv[1], "sft", split="train")))
"""


def test_two_processes_sharing_one_hf_home_each_load_their_sweeps_rows(two_sweeps, tmp_path):
    env = {**os.environ, "HF_HOME": str(tmp_path / "shared-hf")}
    for sweep in two_sweeps:
        done = subprocess.run([sys.executable, "-c", LOAD_IN_A_PROCESS, str(sweep / "datasets")],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        assert int(done.stdout.split()[-1]) == len(ids_in_files(sweep, "sft"))


def test_a_sweep_aggregated_again_after_more_trees_committed_is_not_served_stale(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    sweep = run_sweep(tmp_path, "grows", 0, 8, seed=3, indices="0-3")
    before = hf_ids(sweep, "dpo")
    assert before == ids_in_files(sweep, "dpo")
    run_sweep(tmp_path, "grows", 0, 8, seed=3)  # the other tasks, then aggregation again
    after = ids_in_files(sweep, "dpo")
    assert len(after) > len(before)
    assert hf_ids(sweep, "dpo") == after  # this process's cache held the first aggregation's rows
    assert thicket.load(str(sweep), "dpo")["id"] == after


def test_thicket_load_verifies_the_rows_against_success_json(tmp_path):
    sweep = synthetic_sweep(tmp_path)
    aggregate(str(sweep), workers=0)
    manifest_path = sweep / "datasets" / "_SUCCESS.json"
    manifest = json.loads(manifest_path.read_text())
    dpo = thicket.load(str(sweep), "dpo")
    assert isinstance(dpo, datasets.Dataset) and len(dpo) == manifest["datasets"]["dpo"]
    table = thicket.load(f"file://{sweep}/datasets", "tokens", format="arrow")
    assert table.num_rows == manifest["datasets"]["tokens"] and "response_ids" in table.column_names
    assert len(thicket.load(str(sweep))) == manifest["datasets"]["sft"]  # the default: sft

    with pytest.raises(BadInput, match=r"'nope': not a dataset of .* \(it has: dpo, dpo_first_turn"):
        thicket.load(str(sweep), "nope")
    listed = next(f for f in manifest["files"] if f["path"].startswith("dpo/"))
    part = sweep / "datasets" / listed["path"]
    original = part.read_bytes()
    part.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # one bit of the part changed
    with pytest.raises(DatasetMismatch, match="its bytes differ"):
        thicket.load(str(sweep), "dpo")
    part.write_bytes(original)
    manifest["datasets"]["dpo"] += 1  # a manifest that promises a row the files lack
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DatasetMismatch, match=r"dataset 'dpo' has \d+ rows in its files, \d+ in _SUCCESS.json"):
        thicket.load(str(sweep), "dpo")
    manifest_path.unlink()  # an aggregation under way (it deletes the manifest first) or never run
    with pytest.raises(BadInput, match="no datasets/_SUCCESS.json there"):
        thicket.load(str(sweep), "dpo")


def test_an_empty_dataset_loads_as_no_rows_with_its_columns(tmp_path):
    sweep = synthetic_sweep(tmp_path, datasets={"sft": {"min_reward": 5.0}})
    aggregate(str(sweep), workers=0)
    sft = thicket.load(str(sweep), "sft")
    assert len(sft) == 0 and "messages" in sft.column_names


def test_thicket_load_reads_a_sweep_on_s3_verified(s3_server, aws_env, tmp_path):
    local = LocalStore(synthetic_sweep(tmp_path))
    uri = f"s3://{s3_server.make_bucket()}/sweeps/synthetic"
    remote = open_store(uri)
    for key in local.list():
        remote.put(key, local.get(key))
    aggregate(uri, workers=0)
    rows = json.loads(remote.get("datasets/_SUCCESS.json"))["datasets"]
    assert len(thicket.load(uri, "dpo_first_turn")) == rows["dpo_first_turn"] > 0


def test_part_names_follow_their_content(tmp_path):
    """The cache key changes with the data because a part's name does: its SHA-256's prefix."""
    sweep = synthetic_sweep(tmp_path)
    aggregate(str(sweep), workers=0)
    for entry in json.loads((sweep / "datasets" / "_SUCCESS.json").read_text())["files"]:
        if entry["path"].endswith(".parquet"):
            data = (sweep / "datasets" / entry["path"]).read_bytes()
            assert entry["path"].endswith(f"-{hashlib.sha256(data).hexdigest()[:16]}.parquet")


def test_export_hf_writes_a_hub_ready_folder_that_loads_by_config(tmp_path, monkeypatch):
    """`thicket export --format hf`: the folder a Hub dataset repository holds. The Hub's loader reads
    the same card metadata (`configs:`) as a local load, so each config must load from the folder
    alone, with the rows _SUCCESS.json lists; the card's metadata must parse as huggingface_hub reads it."""
    from huggingface_hub import DatasetCard

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    sweep = synthetic_sweep(tmp_path)
    aggregate(str(sweep), workers=0)
    hub = tmp_path / "hub"
    done = subprocess.run([THICKET, "export", str(sweep), "--format", "hf", "-o", str(hub)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "hf upload REPO" in done.stderr
    rows = json.loads((hub / "_SUCCESS.json").read_text())["datasets"]
    card = DatasetCard.load(hub / "README.md")
    configs = {c["config_name"]: c for c in card.data.to_dict()["configs"]}
    assert sorted(configs) == sorted(name for name, count in rows.items() if count)
    for name in configs:
        for path in configs[name]["data_files"][0]["path"]:
            assert (hub / path).is_file()
        assert len(datasets.load_dataset(str(hub), name, split="train")) == rows[name]
        assert len(thicket.load(str(hub), name)) == rows[name]
    again = subprocess.run([THICKET, "export", str(sweep), "--format", "hf", "-o", str(hub)], capture_output=True, text=True)
    assert again.returncode == 2 and again.stderr.strip().splitlines() == [
        f"error: -o {hub}: not an empty folder (an export goes to a new or empty one)"]
    bare = subprocess.run([THICKET, "export", str(sweep), "--format", "hf"], capture_output=True, text=True)
    assert bare.returncode == 2 and "give -o FOLDER" in bare.stderr and "Traceback" not in bare.stderr
