"""The sweep spec: defaults, planning, and one-line errors naming the field."""

from __future__ import annotations

import copy
import re

import pytest

from thicket.errors import BadInput
from thicket.spec import load_spec, parse_indices, parse_spec

GOOD = {
    "name": "ok-sweep",
    "tasks": {"env": "textcraft", "start": 0, "stop": 25, "per_index": 10},
    "search": {"algorithm": "mcts", "iterations": 5},
    "policy": {"kind": "uniform"},
    "output": "out",
}


def with_change(path: str, value):
    data = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()


def test_good_spec_plans_pod_ranges_and_sweep_uri():
    spec = parse_spec(GOOD)
    assert [list(r) for r in spec.tasks.index_ranges()] == [list(range(0, 10)), list(range(10, 20)), list(range(20, 25))]
    assert spec.sweep_uri == "out/ok-sweep"
    assert spec.search.expansions == 4 and spec.search.uct_c == 0.25  # Agent-R defaults


@pytest.mark.parametrize(
    "path,value,expected",
    [
        ("name", "Bad_Name", "name: 'Bad_Name' is not a DNS-1123 label"),
        ("name", "x" * 64, "is not a DNS-1123 label"),
        ("tasks.env", "nethack", "tasks.env: unknown env 'nethack'; expected one of"),
        ("tasks.stop", 0, "tasks: stop (0) must be greater than start (0)"),
        ("tasks.start", -1, "tasks.start: Input should be greater than or equal to 0 (got -1)"),
        ("tasks.per_index", "ten", "tasks.per_index: Input should be a valid integer"),
        ("tasks.stop", DELETE, "tasks.stop: required field is missing"),
        ("search.algorithm", "bfs", "search: Input tag 'bfs' found using 'algorithm' does not match"),
        ("search.iterations", 0, "search.mcts.iterations: Input should be greater than or equal to 1 (got 0)"),
        ("search.bogus", 1, "search.mcts.bogus: unknown field"),
        ("policy.kind", "gpt", "policy.kind: Input should be 'vllm', 'openai' or 'uniform'"),
        ("policy.url", "localhost:8000", "policy.url: expected an http(s) URL"),
        ("output", "gs://bucket/x", "output: unsupported URI scheme 'gs'"),
        ("output", "s3://Bad_Bucket/x", "output: 'Bad_Bucket' is not a valid S3 bucket name"),
        ("seed", 1.5, "seed: Input should be a valid integer"),
        ("color", "red", "color: unknown field"),
    ],
)
def test_bad_specs_name_the_field(path, value, expected):
    with pytest.raises(BadInput) as err:
        parse_spec(with_change(path, value), "s.yaml")
    message = str(err.value)
    assert message.startswith("s.yaml: ") and expected in message
    assert "\n" not in message


def test_s3_output_and_storage_section():
    spec = parse_spec({**GOOD, "output": "s3://my-bucket/runs", "storage": {"endpoint_url": "http://minio:9000",
                       "addressing_style": "path", "access_key_id_env": "KEY", "secret_access_key_env": "SECRET"}})
    assert spec.sweep_uri == "s3://my-bucket/runs/ok-sweep"
    assert spec.storage.settings().access_key_id_env == "KEY" and spec.storage.settings().addressing_style == "path"
    for storage, expected in [
        ({"endpoint_url": "minio:9000"}, "storage.endpoint_url: expected an http(s) URL"),
        ({"access_key_id_env": "AKIAIOSFODNN7EXAMPLE", "secret_access_key_env": "S"},
         "storage.access_key_id_env: expected the NAME"),
        ({"secret_access_key_env": "MY_SECRET"}, "storage: set both access_key_id_env and secret_access_key_env"),
        ({"bucket": "x"}, "storage.bucket: unknown field"),
    ]:
        with pytest.raises(BadInput, match=re.escape(expected)):
            parse_spec({**GOOD, "storage": storage})


def test_policy_endpoint_rules():
    with pytest.raises(BadInput, match="kind openai needs both `url` and `model`"):
        parse_spec(with_change("policy", {"kind": "openai", "url": "http://h:1/v1"}))
    with pytest.raises(BadInput, match="kind vllm needs `model`"):
        parse_spec(with_change("policy", {"kind": "vllm"}))


def test_yaml_and_file_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(BadInput, match=r"bad.yaml: not valid YAML at line \d"):
        load_spec(bad)
    bad.write_text("- a list\n")
    with pytest.raises(BadInput, match="expected a YAML mapping"):
        load_spec(bad)
    with pytest.raises(BadInput, match="cannot read the spec"):
        load_spec(tmp_path / "missing.yaml")


def test_indices_parse_and_check_bounds():
    tasks = parse_spec(GOOD).tasks
    assert parse_indices("0-2,5,7-8", tasks) == [0, 1, 2, 5, 7, 8]
    for text, message in [
        ("3-1", "reversed"),
        ("20-30", "outside the spec's tasks 0-24"),
        ("a-b", "expected task indices"),
        ("", "expected task indices"),
    ]:
        with pytest.raises(BadInput, match=message):
            parse_indices(text, tasks)


def test_example_sweeps_are_valid():
    from tests.support.manifests import SWEEPS

    assert len(SWEEPS) >= 6 and any("cluster" in path.parts for path in SWEEPS)
    for path in SWEEPS:
        load_spec(path)
