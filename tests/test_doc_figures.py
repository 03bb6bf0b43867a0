"""The figures the docs state about files thicket ships (the demo sweep, the demo model, the
images `make images` builds, the env families' task lists) are read out of the docs' own
sentences and compared with those files, so a changed file with a stale sentence fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def prose(path: str) -> str:
    """A doc's text with its line breaks folded into spaces."""
    return " ".join((ROOT / path).read_text().split())


def stated(path: str, pattern: str) -> str:
    """The one figure `pattern`'s group 1 matches in the doc (the test fails when the sentence is gone)."""
    found = re.findall(pattern, prose(path))
    assert len(found) == 1, f"{path}: expected one match of {pattern!r}, found {found}"
    return found[0]


def number(text: str) -> float:
    """'six' -> 6, '1,326' -> 1326, '0.1' -> 0.1."""
    return WORDS[text] if text in WORDS else float(text.replace(",", ""))


def demo_spec() -> dict:
    return yaml.safe_load((ROOT / "sweeps" / "demo.yaml").read_text())


def demo_config() -> dict:
    return json.loads((ROOT / "models" / "demo" / "config.json").read_text())


def demo_training() -> dict:
    return json.loads((ROOT / "models" / "demo" / "training.json").read_text())


def test_spec_doc_states_the_demos_thought_bound_and_vocabulary():
    bound = stated("docs/spec.md", r"the demo uses (\d+); with its [\d,]+-token vocabulary")
    vocab = stated("docs/spec.md", r"the demo uses \d+; with its ([\d,]+)-token vocabulary")
    assert number(bound) == demo_spec()["policy"]["max_thought_chars"]
    assert number(vocab) == demo_config()["vocab_size"] == demo_training()["vocab"]
    tokenizer = json.loads((ROOT / "models" / "demo" / "tokenizer.json").read_text())
    assert number(vocab) == len(tokenizer["model"]["vocab"])


def test_readme_states_the_demos_tasks_model_size_and_weights():
    tasks = demo_spec()["tasks"]
    assert number(stated("README.md", r"`make demo` runs MCTS on (\w+) TextCraft tasks")) == tasks["stop"] - tasks["start"]
    assert demo_spec()["search"]["algorithm"] == "mcts" and tasks["env"] == "textcraft"
    millions = number(stated("README.md", r"a ~(\d+)M-parameter Llama"))
    assert round(demo_training()["parameters"] / 1e6) == millions
    megabytes = number(stated("README.md", r"its weights \((\d+) MB\)"))
    assert round((ROOT / "models" / "demo" / "model.safetensors").stat().st_size / 1e6) == megabytes


def test_the_demo_models_readme_states_its_config_and_training():
    doc, config, training = "models/demo/README.md", demo_config(), demo_training()
    assert number(stated(doc, r"a ([\d,]+)-parameter Llama")) == training["parameters"]
    assert number(stated(doc, r"\(hidden (\d+),")) == config["hidden_size"]
    assert number(stated(doc, r", (\d+) layers,")) == config["num_hidden_layers"]
    assert number(stated(doc, r"vocab ([\d,]+)\)")) == config["vocab_size"]
    assert number(stated(doc, r"for (\d+) steps")) == training["settings"]["steps"]
    assert number(stated(doc, r"scripted play: ([\d,]+) textcraft tasks")) == training["conversations"]
    recipe = training["recipe"]
    first, last = stated(doc, r"textcraft tasks \((\d+ to \d+),").split(" to ")
    assert (int(first), int(last) + 1) == (recipe["tasks_start"], recipe["tasks_stop"])
    assert number(stated(doc, r"plans of at most (\d+) steps")) == recipe["max_steps"]
    assert number(stated(doc, r"before (\d+)% of the planned ones")) / 100 == recipe["noise"]


def test_readme_counts_the_images_make_images_builds():
    images = re.search(r"^IMAGES \?= (.+)$", (ROOT / "Makefile").read_text(), re.M)
    assert images is not None
    assert number(stated("docs/kubernetes.md", r"`make images` builds (\w+) images")) == len(images[1].split())


def test_docs_state_textcrafts_goal_count():
    from thicket.envs.env_args import distinct_tasks

    assert number(stated("docs/env-server.md", r"crafts goal N mod (\d+) ")) == distinct_tasks("textcraft", {})


def test_the_env_table_states_babyais_level_count():
    pytest.importorskip("minigrid")
    from thicket.envs.babyai import default_levels

    assert number(stated("docs/envs.md", r"\| `babyai` \| [^|]+ \| (\d+) levels")) == len(default_levels())


def test_the_walkthrough_shows_the_fault_price_validate_prints():
    """docs/kubernetes-walkthrough.md's table for textcraft-mcts.yaml is what `thicket validate` prints."""
    from thicket.k8s.fault_price import echo_fault_table
    from thicket.k8s.render import render
    from thicket.spec import load_spec

    spec = load_spec(ROOT / "sweeps" / "cluster" / "textcraft-mcts.yaml")
    printed: list[str] = []
    echo_fault_table(spec, render(spec), canary=True, echo=lambda line="", **_: printed.extend(str(line).splitlines()))
    doc = (ROOT / "docs" / "kubernetes-walkthrough.md").read_text().splitlines()
    start = doc.index("    " + printed[0])
    shown = [line.removeprefix("    ") for line in doc[start:start + len(printed)]]
    table = [line for line in printed if not line.startswith("warning")]
    assert shown[:len(table)] == table
    pods = re.findall(r"then all (\d+) pods", prose("docs/kubernetes-walkthrough.md"))  # the canary, then all N
    assert pods and {number(n) for n in pods} == {spec.cluster.parallelism}
