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
        ("search.algorithm", "bfs", "search.algorithm: 'bfs' is not one of tot, mcts, mcts_pw, dense, sample"),
        ("search.algorithm", DELETE, "search.algorithm: required field is missing; expected one of tot, mcts"),
        ("search.iterations", 0, "search.iterations: Input should be greater than or equal to 1 (got 0)"),
        ("search.bogus", 1, "search.bogus: unknown field; expected one of max_depth,"),
        ("search.iteration", 3, "search.iteration: unknown field; did you mean 'iterations'?"),
        ("policy.concurrency", "x", "policy.concurrency: Input should be a valid integer or 'auto' (got 'x')"),
        ("tasks.env_args", {"size": 4}, "tasks.env_args.size: unknown argument; textcraft takes no env_args"),
        ("policy.kind", "gpt", "policy.kind: Input should be 'vllm', 'openai' or 'uniform'"),
        ("policy.url", "localhost:8000", "policy.url: expected an http(s) URL"),
        ("output", "gs://bucket/x", "output: unsupported URI scheme 'gs'"),
        ("output", "s3://Bad_Bucket/x", "output: 'Bad_Bucket' is not a valid S3 bucket name"),
        ("seed", 1.5, "seed: Input should be a valid integer"),
        ("color", "red", "color: unknown field"),
        ("sede", 3, "sede: unknown field; did you mean 'seed'?"),
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


def test_every_problem_is_named_on_one_line_and_a_typo_comes_first():
    data = with_change("search", DELETE)
    data["serach"] = {"algorithm": "mcts"}
    data["tasks"]["per_idx"] = 3
    data["policy"]["kind"] = "gpt"
    with pytest.raises(BadInput) as err:
        parse_spec(data, "s.yaml")
    message = str(err.value)
    assert "\n" not in message and "more problem" not in message
    assert "tasks.per_idx: unknown field; did you mean 'per_index'?" in message
    assert "serach: unknown field; did you mean 'search'?" in message
    assert "search: required field is missing" in message
    assert "policy.kind: Input should be 'vllm', 'openai' or 'uniform' (got 'gpt')" in message
    assert message.index("serach") < message.index("search: required")  # the typo explains the missing field


@pytest.mark.parametrize(
    "env,env_args,expected",
    [
        ("frozenlake", {"size": "big"}, "tasks.env_args.size: expected an integer from 2 to 64 for frozenlake, got 'big'"),
        ("frozenlake", {"size": -2}, "tasks.env_args.size: expected an integer from 2 to 64 for frozenlake, got -2"),
        ("frozenlake", {"slippery": True}, "tasks.env_args.slippery: unknown argument; did you mean 'is_slippery'? "
                                           "(frozenlake takes size, is_slippery)"),
        ("taxi", {"is_rainy": "yes"}, "tasks.env_args.is_rainy: expected true or false for taxi, got 'yes'"),
        ("math", {"cpu_s": 0}, "tasks.env_args.cpu_s: expected a number > 0 for math, got 0"),
        ("webshop", {"goals": "robot"}, "tasks.env_args.goals: expected one of auto, human, synthetic for webshop"),
    ],
)
def test_env_args_are_checked_against_the_family(env, env_args, expected):
    with pytest.raises(BadInput) as err:
        parse_spec(with_change("tasks", {"env": env, "env_args": env_args, "stop": 4}), "s.yaml")
    assert expected in str(err.value)


def test_env_args_of_a_remote_server_are_its_own_to_check():
    tasks = {"env": "frozenlake", "env_args": {"colour": 1}, "stop": 4,
             "env_server": {"mode": "remote", "url": "http://127.0.0.1:9"}}
    assert parse_spec(with_change("tasks", tasks)).tasks.env_args == {"colour": 1}
