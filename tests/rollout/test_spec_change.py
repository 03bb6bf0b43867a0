"""A rerun into a sweep with a spec that grows other trees is refused (exit 2, one line naming what
differs) unless --allow-spec-change, which records it; what does not change the trees (the task
range, output, run settings, storage, cluster, datasets) never blocks a rerun."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from thicket.aggregate.driver import read_spec
from thicket.errors import BadInput
from thicket.rollout.spec_record import record_spec
from thicket.shards.storage import commit_key
from thicket.spec import SweepSpec, parse_spec
from thicket.storage import open_store
from thicket.storage.store import LocalStore, Store

THICKET = str(Path(sys.executable).parent / "thicket")
BASE: dict[str, Any] = {
    "name": "spec-change",
    "tasks": {"env": "frozenlake", "start": 0, "stop": 2, "per_index": 2, "env_server": {"mode": "in_process"}},
    "search": {"algorithm": "mcts", "iterations": 3, "expansions": 2, "max_depth": 4},
    "policy": {"kind": "uniform"},
    "output": "out",
    "run": {"progress": False},
}
ITERATIONS = ("error: spec differs from the sweep's stored spec.yaml at search.iterations (stored 3, now 4): rerun "
              "with --allow-spec-change to add trees grown under the new spec, or use a new name")


def changed(*changes: tuple[str, Any], base: dict[str, Any] = BASE) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for path, value in changes:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def spec(*changes: tuple[str, Any]) -> SweepSpec:
    return parse_spec(changed(*changes))


def thicket(tmp_path: Path, data: dict[str, Any], *args: str, command: str = "run") -> subprocess.CompletedProcess[str]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    extra = ["--no-aggregate", "--no-progress"] if command == "run" else ["--index", "0"]
    return subprocess.run([THICKET, command, str(path), *extra, *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={**os.environ}, stdin=subprocess.DEVNULL)


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- the reproduction, through the command line -----------------------------------------------


def test_a_rerun_with_another_search_exits_2_naming_the_field_and_writes_nothing(tmp_path):
    first = thicket(tmp_path, BASE)
    assert first.returncode == 0, first.stderr
    sweep = tmp_path / "out" / "spec-change"
    before = files(sweep)
    other = thicket(tmp_path, changed(("search.iterations", 4)))
    assert other.returncode == 2
    assert other.stderr.strip().splitlines() == [ITERATIONS]
    assert files(sweep) == before  # no tree, no spec written
    worker = thicket(tmp_path, changed(("search.iterations", 4)), command="worker")  # its index done: still refused
    assert worker.returncode == 2 and worker.stderr.strip().splitlines() == [ITERATIONS]
    assert files(sweep) == before


def test_the_same_spec_reruns_as_a_no_op_and_more_tasks_are_added(tmp_path):
    assert thicket(tmp_path, BASE).returncode == 0
    sweep = tmp_path / "out" / "spec-change"
    before = files(sweep)
    again = thicket(tmp_path, BASE)
    assert again.returncode == 0 and "all 2 trees already committed" in again.stdout, again.stderr
    retried = thicket(tmp_path, BASE, command="worker")  # a retried pod, same spec
    assert retried.returncode == 0 and "already committed" in retried.stdout, retried.stderr
    assert files(sweep) == before
    more = thicket(tmp_path, changed(("tasks.stop", 3), ("run.trees_per_shard", 1), ("policy.latency_s", 0.001)))
    assert more.returncode == 0 and "(1 grown, 2 already committed" in more.stdout, more.stderr
    assert (sweep / "spec.yaml").read_bytes() == before["spec.yaml"]  # the first spec stays


def test_allow_spec_change_grows_the_new_trees_and_records_the_new_spec(tmp_path):
    assert thicket(tmp_path, BASE).returncode == 0
    sweep = tmp_path / "out" / "spec-change"
    first_spec = (sweep / "spec.yaml").read_bytes()
    new = changed(("search.iterations", 4), ("tasks.stop", 3))
    allowed = thicket(tmp_path, new, "--allow-spec-change")
    assert allowed.returncode == 0 and "(1 grown, 2 already committed" in allowed.stdout, allowed.stderr
    assert "WARNING" in allowed.stderr and "search.iterations (stored 3, now 4)" in allowed.stderr
    assert (sweep / "spec.yaml").read_bytes() == first_spec
    [history] = (sweep / "spec-history").iterdir()
    assert yaml.safe_load(history.read_text()) == parse_spec(new).model_dump(mode="json")
    assert thicket(tmp_path, new).returncode == 2  # allowed once is not allowed for good
    assert thicket(tmp_path, new, "--allow-spec-change", command="worker").returncode == 0
    assert len(list((sweep / "spec-history").iterdir())) == 1  # the same change, recorded once
    # a pod takes no flags: the spec it is sent says so (run.allow_spec_change, which blocks nothing itself)
    in_spec = changed(("search.iterations", 4), ("tasks.stop", 3), ("run.allow_spec_change", True))
    pod = thicket(tmp_path, in_spec, command="worker")
    assert pod.returncode == 0, pod.stderr
    assert "WARNING" in pod.stderr and "search.iterations (stored 3, now 4)" in pod.stderr


# -- the rule, field by field -----------------------------------------------------------------

KEEPS_THE_TREES = [
    ("tasks.start", 1), ("tasks.stop", 9), ("tasks.per_index", 1), ("output", "elsewhere"),
    ("tasks.env_server", {"mode": "sidecar", "max_instances": 8}),
    ("run", {"progress": True, "task_timeout_s": 5.0, "trees_per_shard": 1, "index_timeout_s": 60.0}),
    ("policy.concurrency", 4), ("policy.timeout_s", 5.0), ("policy.render_once", False), ("policy.latency_s", 0.01),
    ("policy.max_retries", 1), ("policy.server", {"args": ["--gpu-memory-utilization", "0.5"], "port": 8001}),
    ("storage", {"endpoint_url": "http://127.0.0.1:9000", "retry_deadline_s": 10.0}),
    ("cluster", {"namespace": "other", "parallelism": 9, "vllm_args": ["--max-num-seqs=64"]}),
    ("datasets.dpo.beta", 0.1),
]
GROWS_OTHER_TREES = [
    (("tasks.env", "cliffwalking"), "tasks.env"),
    (("tasks.env_args", {"size": 8}), "tasks.env_args.size (stored absent, now 8)"),
    (("tasks.max_observation_chars", 100), "tasks.max_observation_chars (stored 16384, now 100)"),
    (("search.max_depth", 5), "search.max_depth (stored 4, now 5)"),
    (("search.temperature", 0.3), "search.temperature (stored null, now 0.3)"),
    (("search", {"algorithm": "sample", "samples": 2, "max_depth": 4}),
     "search.algorithm (stored \"mcts\", now \"sample\")"),
    (("policy.kind", "openai"), "policy.kind"), (("policy.model", "m"), "policy.model (stored null, now \"m\")"),
    (("policy.temperature", 0.5), "policy.temperature (stored 1.0, now 0.5)"), (("policy.top_p", 0.9), "policy.top_p"),
    (("policy.max_tokens", 9), "policy.max_tokens"), (("policy.constrain_actions", False), "policy.constrain_actions"),
    (("policy.max_thought_chars", 10), "policy.max_thought_chars"),
    (("policy.show_valid_actions", True), "policy.show_valid_actions"),
    (("seed", 1), "seed (stored 0, now 1)"), (("cluster.model", "org/model"), "cluster.model"),
    (("policy.server.args", ["--dtype", "float16"]), "policy.server.args --dtype (stored absent, now \"float16\")"),
    (("cluster.vllm_args", ["--max-model-len=4096"]), "cluster.vllm_args --max-model-len"),
]


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = LocalStore(tmp_path / "sweep")
    record_spec(store, spec())
    store.put(commit_key(0), b"{}")  # a committed tree: the listing is all the check reads
    return store


@pytest.mark.parametrize("change", KEEPS_THE_TREES, ids=[c[0] for c in KEEPS_THE_TREES])
def test_what_does_not_change_the_trees_never_blocks(store, change):
    record_spec(store, spec(change))
    assert not list(store.list("spec-history/")) and yaml.safe_load(store.get("spec.yaml"))["search"]["iterations"] == 3


@pytest.mark.parametrize("change, named", GROWS_OTHER_TREES, ids=[c[0][0] for c in GROWS_OTHER_TREES])
def test_what_changes_the_trees_is_refused_naming_it(store, change, named):
    data = changed(change)
    if change[0] == "policy.kind":
        data["policy"].update(url="http://127.0.0.1:1/v1", model="m")
    with pytest.raises(BadInput) as refused:
        record_spec(store, parse_spec(data))
    message = str(refused.value)
    assert message.startswith("spec differs from the sweep's stored spec.yaml at ") and named in message
    assert "\n" not in message and message.endswith("--allow-spec-change to add trees grown under the new spec, "
                                                     "or use a new name")


def test_many_differences_show_three_and_name_the_rest(store):
    new = spec(("seed", 3), ("search.iterations", 9), ("policy.temperature", 0.2), ("policy.top_p", 0.5),
               ("tasks.env_args", {"size": 8, "is_slippery": True}))
    shown = (r"at tasks\.env_args\.size \(stored absent, now 8\), tasks\.env_args\.is_slippery \(stored absent, "
             r"now true\), search\.iterations \(stored 3, now 9\) and 3 more "
             r"\(policy\.temperature, policy\.top_p, seed\): rerun")
    with pytest.raises(BadInput, match=shown):
        record_spec(store, new)


def test_a_stored_spec_round_trips_through_yaml_as_a_pod_reads_it(store):
    """A retried pod reads the spec from its ConfigMap (YAML): the stored copy must compare equal."""
    again = parse_spec(yaml.safe_load(store.get("spec.yaml")), "configmap")
    record_spec(store, again)
    full = spec(("search.temperature", 0.25), ("policy.temperature", 0.7), ("tasks.env_args", {"size": 4}),
                ("datasets.sft.min_reward", 0.5), ("cluster.vllm_args", ["--dtype", "bfloat16"]))
    other = LocalStore(store.root.parent / "other")
    record_spec(other, full)
    record_spec(other, parse_spec(yaml.safe_load(yaml.safe_dump(full.model_dump(mode="json"))), "configmap"))


def test_a_stored_spec_of_an_older_thicket_compares_with_defaults_filled(store):
    """A stored spec.yaml without a field this thicket added (its default) is the same spec."""
    stored = yaml.safe_load(store.get("spec.yaml"))
    del stored["search"]["max_llm_calls"], stored["policy"]["show_valid_actions"]
    store.put("spec.yaml", yaml.safe_dump(stored).encode())
    record_spec(store, spec())


def test_a_new_datasets_section_goes_into_spec_yaml_for_aggregation(store):
    record_spec(store, spec(("datasets.dpo.beta", 0.1), ("tasks.stop", 4)))
    stored = read_spec(store)
    assert stored is not None and stored["datasets"]["dpo"]["beta"] == 0.1  # what `thicket aggregate` reads
    assert stored["tasks"]["stop"] == 2  # the rest is the first run's


@pytest.mark.parametrize("text, why", [
    (b"name: [unclosed\n", "is not valid YAML at line 2"),
    (b"- a list\n", "is not a YAML mapping (got list)"),
    (b"", "is not a YAML mapping (got NoneType)"),
])
def test_an_unreadable_stored_spec_is_one_clear_line(store, text, why):
    store.put("spec.yaml", text)
    for allow in (False, True):
        with pytest.raises(BadInput) as refused:
            record_spec(store, spec(), allow)
        message = str(refused.value)
        assert message.startswith(f"{store.uri}/spec.yaml: the sweep's stored spec {why}: repair or delete it")
        assert "\n" not in message


def test_a_sweep_without_committed_trees_takes_the_new_spec(tmp_path):
    """A first run that failed before committing a tree (a wrong model folder) leaves a spec.yaml
    that holds nothing back: the corrected spec replaces it."""
    store = LocalStore(tmp_path / "sweep")
    record_spec(store, spec(("policy.model", "no/such/folder")))
    record_spec(store, spec(("search.iterations", 7)))
    assert yaml.safe_load(store.get("spec.yaml")) == spec(("search.iterations", 7)).model_dump(mode="json")
    assert not list(store.list("spec-history/"))


def test_on_s3_the_same_rule_holds(aws_env, s3_server):
    bucket = s3_server.make_bucket()
    first = spec(("output", f"s3://{bucket}/runs"))
    s3 = open_store(first.sweep_uri, first.storage.settings())
    record_spec(s3, first)
    s3.put(commit_key(0), b"{}")
    record_spec(s3, parse_spec(yaml.safe_load(s3.get("spec.yaml"))))  # a retried pod
    record_spec(s3, spec(("output", f"s3://{bucket}/runs"), ("tasks.stop", 9)))
    other = spec(("output", f"s3://{bucket}/runs"), ("search.iterations", 4))
    with pytest.raises(BadInput, match=r"at search\.iterations \(stored 3, now 4\): rerun"):
        record_spec(s3, other)
    record_spec(s3, other, allow_change=True)
    [history] = list(s3.list("spec-history/"))
    assert yaml.safe_load(s3.get(history)) == other.model_dump(mode="json")
    assert yaml.safe_load(s3.get("spec.yaml")) == first.model_dump(mode="json")
