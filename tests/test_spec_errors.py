"""A first hour with thicket, through the real CLI: a bad spec is one line naming every problem
as the user wrote it (exit 2, no traceback), and `validate` says what a valid spec may not do
as meant (task ranges that wrap, tasks all the same, a hub id where a local model folder is served)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
THICKET = str(Path(sys.executable).parent / "thicket")
MODEL_POLICY = "{kind: openai, url: 'http://127.0.0.1:9/v1', model: m}"  # never asked by validate


def thicket(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=os.environ)


def spec_file(tmp_path: Path, tasks: str, search: str = "{algorithm: sample, samples: 2, max_depth: 3}",
              policy: str = "{kind: uniform}", extra: str = "") -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: first-hour\ntasks: {tasks}\nsearch: {search}\npolicy: {policy}\n"
                    f"output: {tmp_path}/out\nrun: {{progress: false}}\n{extra}")
    return str(path)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


FROZENLAKE = "{{env: frozenlake, start: 0, stop: 4, env_args: {args}, env_server: {{mode: in_process}}}}"


@pytest.mark.parametrize(("env_args", "expected"), [
    ("{size: big}", "tasks.env_args.size: expected an integer from 2 to 64 for frozenlake, got 'big'"),
    ("{size: -2}", "tasks.env_args.size: expected an integer from 2 to 64 for frozenlake, got -2"),
    ("{slippery: true}", "tasks.env_args.slippery: unknown argument; did you mean 'is_slippery'? "
                         "(frozenlake takes size, is_slippery)"),
])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_bad_env_args_are_one_line_before_any_task_runs(tmp_path, command, env_args, expected):
    args = ["--no-aggregate"] if command == "run" else []
    line = one_error_line(thicket(command, spec_file(tmp_path, FROZENLAKE.format(args=env_args)), *args))
    assert expected in line
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_textcraft_refuses_env_args(tmp_path):
    spec = spec_file(tmp_path, "{env: textcraft, start: 0, stop: 2, env_args: {size: 4}}")
    assert "tasks.env_args.size: unknown argument; textcraft takes no env_args" in one_error_line(thicket("validate", spec))


def test_a_level_the_family_refuses_is_one_line_too(tmp_path):
    spec = spec_file(tmp_path, "{env: babyai, start: 0, stop: 2, env_args: {levels: [BabyAI-Nope-v0]}, "
                               "env_server: {mode: in_process}}")
    line = one_error_line(thicket("validate", spec))  # the uniform policy's probe makes the env
    assert "tasks.env_args: babyai refused them: unknown BabyAI levels: ['BabyAI-Nope-v0']" in line


def test_every_problem_is_named_and_a_typo_gets_the_closest_key(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("name: first-hour\ntasks: {env: textcraft, start: 0, stop: 4, per_idx: 2}\n"
                    "serach: {algorithm: mcts}\npolicy: {kind: uniform}\noutput: out\n")
    line = one_error_line(thicket("validate", str(path)))
    assert line == (f"error: {path}: tasks.per_idx: unknown field; did you mean 'per_index'?; "
                    "serach: unknown field; did you mean 'search'?; search: required field is missing")


@pytest.mark.parametrize(("search", "expected"), [
    ("{algorithm: bfs}", "search.algorithm: 'bfs' is not one of tot, mcts, mcts_pw, dense, sample"),
    ("{iterations: 3}", "search.algorithm: required field is missing; expected one of tot, mcts, mcts_pw, dense, sample"),
    ("{algorithm: mcts, max_depth: 0, iteration: 3}",
     "search.iteration: unknown field; did you mean 'iterations'?; "
     "search.max_depth: Input should be greater than or equal to 1 (got 0)"),
])
def test_search_problems_read_as_written(tmp_path, search, expected):
    line = one_error_line(thicket("validate", spec_file(tmp_path, "{env: textcraft, start: 0, stop: 2}", search)))
    assert expected in line
    assert "Input tag" not in line and "search.mcts" not in line and "discriminator" not in line


def test_a_range_past_the_familys_tasks_is_a_note(tmp_path):
    spec = spec_file(tmp_path, "{env: math, start: 0, stop: 1000000}", policy=MODEL_POLICY)
    result = thicket("validate", spec)
    assert result.returncode == 0, result.stderr
    assert "note: tasks 0-999999 wrap: math has 360 distinct tasks, so each is run ~2,778 times" in result.stderr
    spec = spec_file(tmp_path, "{env: textcraft, start: 410, stop: 430}", policy=MODEL_POLICY)
    assert "note: tasks 410-429 go past textcraft's 419 distinct tasks: index i is task i mod 419" \
        in thicket("validate", spec).stderr
    spec = spec_file(tmp_path, "{env: textcraft, start: 0, stop: 419}", policy=MODEL_POLICY)
    assert "note" not in thicket("validate", spec).stderr


def test_tasks_that_are_all_the_same_are_a_note(tmp_path):
    result = thicket("validate", spec_file(tmp_path, "{env: cliffwalking, start: 0, stop: 10}", policy=MODEL_POLICY))
    assert result.returncode == 0, result.stderr
    assert "note: every cliffwalking task index is the same task (with these env_args), so tasks 0-9 run it 10 times" \
        in result.stderr


def test_validate_prints_the_plan_readably_and_uniform_without_model_or_url():
    result = thicket("validate", "sweeps/demo.yaml", "--policy", "uniform")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "policy  uniform" in lines
    [search] = [line for line in lines if line.startswith("search  ")]
    assert search == "search  mcts: max_depth=12 max_nodes=2000 dedupe=true iterations=6 expansions=3 uct_c=0.25"
    assert "models/demo" not in result.stdout and "None" not in result.stdout and "make-model" not in result.stderr


def test_a_missing_model_folder_is_an_error_naming_the_command_in_validate_and_run(tmp_path):
    model = tmp_path / "models" / "demo"
    spec = tmp_path / "demo.yaml"
    spec.write_text((ROOT / "sweeps/demo.yaml").read_text().replace("model: models/demo", f"model: {model}"))
    command = f"`thicket make-model {model} --demo`"
    line = one_error_line(thicket("validate", str(spec)))  # what `run` refuses, `validate` refuses (issue 48)
    assert line == f"error: policy.model: {model} does not exist; make it with {command} (the demo policy), or give policy.url"
    line = one_error_line(thicket("run", str(spec), "--output", str(tmp_path / "out"), "--no-progress"))
    assert command in line and "models/tiny" not in line


def test_a_cluster_sweep_names_a_hub_model_without_a_local_folder_note():
    result = thicket("validate", "sweeps/cluster/textcraft-mcts.yaml")
    assert result.returncode == 0, result.stderr
    assert "local model folder" not in result.stderr and "make-model" not in result.stderr
