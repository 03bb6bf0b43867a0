"""The datasets folder as HF `datasets` meets it: every non-empty dataset loads by config name in
one line (also from a sweep pulled from S3), and empty ones are said so everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

from tests.support.random_trees import synthetic_sweep
from thicket.aggregate.driver import aggregate
from thicket.storage import open_store
from thicket.storage.store import LocalStore

THICKET = str(Path(sys.executable).parent / "thicket")
NO_SFT = {"sft": {"min_reward": 5.0}}  # no path returns 5: sft and sft_fastchat are empty


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_every_non_empty_dataset_loads_by_name_and_empty_ones_are_said_so(tmp_path):
    sweep = synthetic_sweep(tmp_path, datasets=NO_SFT)
    result = aggregate(str(sweep), workers=0)
    out = sweep / "datasets"
    manifest = json.loads((out / "_SUCCESS.json").read_text())
    assert manifest["empty"] == ["sft", "sft_fastchat"] and manifest["datasets"]["sft"] == 0
    full = sorted(name for name, rows in manifest["datasets"].items() if rows)
    assert full == ["dpo", "dpo_first_turn", "revision", "tokens"]
    card = (out / "README.md").read_text()
    assert [c["config_name"] for c in front_matter(card)["configs"]] == full
    for name in full:
        ds = datasets.load_dataset(str(out), name, split="train", cache_dir=str(tmp_path / "hf"))
        assert len(ds) == manifest["datasets"][name] == result.rows[name]
        assert f"| `{name}` | {manifest['datasets'][name]} |" in card
    dpo = datasets.load_dataset(str(out), "dpo", split="train", cache_dir=str(tmp_path / "hf"))
    assert {"prompt", "chosen", "rejected", "kind"} <= set(dpo.column_names)
    assert "| `chosen` | list of {role, content, loss} |" in card  # each config's columns documented
    with pytest.raises(ValueError, match="sft"):  # no config for an empty dataset: HF names the ones there are
        datasets.load_dataset(str(out), "sft", split="train", cache_dir=str(tmp_path / "hf"))
    assert "**Empty**: this sweep gave no `sft` rows" in card and "| `sft` | 0 | empty |" in card
    assert "<th>empty datasets</th><td>sft, sft_fastchat</td>" in (out / "report.html").read_text()
    assert "  sft            0 rows (empty: no files)" in result.lines()


def test_a_sweep_pulled_from_s3_loads_by_name_and_pull_says_which_are_empty(s3_server, aws_env, tmp_path):
    local = LocalStore(synthetic_sweep(tmp_path, datasets=NO_SFT))
    uri = f"s3://{s3_server.make_bucket()}/sweeps/synthetic"
    remote = open_store(uri)
    for key in local.list():
        remote.put(key, local.get(key))
    aggregate(uri, workers=0)
    dest = tmp_path / "pulled"
    pulled = subprocess.run([THICKET, "pull", uri, str(dest), "--no-progress"], capture_output=True, text=True,
                            env={**os.environ, **aws_env}, timeout=120)
    assert pulled.returncode == 0, pulled.stderr
    rows = json.loads((dest / "datasets" / "_SUCCESS.json").read_text())["datasets"]
    assert f"dpo {rows['dpo']}, dpo_first_turn {rows['dpo_first_turn']}" in pulled.stdout
    assert "empty (no rows, no files): sft, sft_fastchat" in pulled.stdout
    ds = datasets.load_dataset(str(dest / "datasets"), "dpo", split="train", cache_dir=str(tmp_path / "hf"))
    assert len(ds) == rows["dpo"] > 0


FROZENLAKE = """\
name: card-default
tasks: {env: frozenlake, env_args: {size: 4, is_slippery: false}, start: 0, stop: 2}
search: {algorithm: mcts, iterations: 12, max_depth: 12}
policy: {kind: uniform}
output: out
seed: 0
"""


def test_a_run_s_datasets_load_without_a_config_name_as_sft(tmp_path):
    (tmp_path / "spec.yaml").write_text(FROZENLAKE)
    run = subprocess.run([THICKET, "run", "spec.yaml", "--no-progress"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = tmp_path / "out" / "card-default" / "datasets"
    rows = json.loads((out / "_SUCCESS.json").read_text())["datasets"]
    assert rows["sft"] > 0 and rows["dpo"] > 0
    cache = str(tmp_path / "hf")
    default = datasets.load_dataset(str(out), split="train", cache_dir=cache)  # no config name
    assert len(default) == rows["sft"] and "messages" in default.column_names
    card = (out / "README.md").read_text()
    marked = [c["config_name"] for c in front_matter(card)["configs"] if c.get("default")]
    assert marked == ["sft"] and "The default config is `sft`: `datasets.load_dataset(FOLDER" in card
    dpo = datasets.load_dataset(str(out), "dpo", split="train", cache_dir=cache)
    assert len(dpo) == rows["dpo"] and {"prompt", "chosen", "rejected"} <= set(dpo.column_names)


def test_without_sft_rows_the_first_non_empty_dataset_is_the_default(tmp_path):
    sweep = synthetic_sweep(tmp_path, datasets=NO_SFT)
    aggregate(str(sweep), workers=0)
    out = sweep / "datasets"
    rows = json.loads((out / "_SUCCESS.json").read_text())["datasets"]
    default = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "hf"))
    assert len(default) == rows["dpo"] > 0 and "chosen" in default.column_names
    card = (out / "README.md").read_text()
    assert [c["config_name"] for c in front_matter(card)["configs"] if c.get("default")] == ["dpo"]
    assert "The default config is `dpo` (`sft` is empty: the first non-empty dataset)" in card


def test_every_table_row_of_the_card_has_as_many_cells_as_its_header(tmp_path):
    """GFM splits a cell at every unescaped `|`, code spans included, and a renderer drops the cells past
    the header's count without a word: the `kind` row ("trajectory | step") lost its meaning so. The
    parser (markdown-it, GFM tables) finds the tables and their rows; each row's source line is counted."""
    import re

    from markdown_it import MarkdownIt

    sweep = synthetic_sweep(tmp_path)
    aggregate(str(sweep), workers=0)
    card = (sweep / "datasets" / "README.md").read_text()
    body = card.split("---\n", 2)[2]
    lines = body.splitlines()
    tokens = MarkdownIt("commonmark").enable("table").parse(body)
    rows = [lines[t.map[0]] for t in tokens if t.type == "tr_open"]
    tables = sum(t.type == "table_open" for t in tokens)
    assert tables >= 7 and len(rows) > 60  # the summary table and one column table per dataset

    def cells(line: str) -> int:
        return len(re.split(r"(?<!\\)\|", line.strip().strip("|")))

    header = 0
    for token in tokens:
        if token.type == "thead_open":
            header = 0
        if token.type == "tr_open":
            count = cells(lines[token.map[0]])
            header = header or count
            assert count == header, f"{lines[token.map[0]]!r}: {count} cells under a header of {header}"
    kind = next(line for line in rows if line.startswith("| `kind` |"))
    assert cells(kind) == 3 and "trajectory" in kind and "step" in kind
