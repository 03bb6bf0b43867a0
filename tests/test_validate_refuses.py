"""`thicket validate` refuses what `thicket run` would refuse on this machine (issue 48): an env's
data folder that is not there or lacks the env's files, a local model folder that is not there
(naming the close one that is), an output that cannot be written. Both commands, through the
installed `thicket`: exit 2, one stderr line naming the field, no traceback, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

THICKET = str(Path(sys.executable).parent / "thicket")
MODEL_POLICY = "{kind: openai, url: 'http://127.0.0.1:9/v1', model: m}"  # run refuses before asking it
TASKS = "{env: textcraft, start: 0, stop: 2}"
COMMANDS = ["validate", "run"]


def thicket(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([THICKET, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def spec_file(tmp_path: Path, tasks: str = TASKS, policy: str = MODEL_POLICY, output: str = "$tmp/out") -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: refused\ntasks: {tasks}\nsearch: {{algorithm: sample, samples: 2, max_depth: 3}}\n"
                    f"policy: {policy}\noutput: {output.replace('$tmp', str(tmp_path))}\nrun: {{progress: false}}\n")
    return path


def refused(tmp_path: Path, command: str, spec: Path, env: dict[str, str] | None = None, as_before: bool = False) -> str:
    """The one error line of `thicket COMMAND SPEC` (exit 2), checking nothing was written
    (`as_before`: refused where it was before issue 48, after the sweep's spec.yaml is written)."""
    args = (command, str(spec)) + (("--no-aggregate", "--no-progress") if command == "run" else ())
    result = thicket(tmp_path, *args, env=env)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == "", result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert as_before or not (tmp_path / "out").exists()  # refused before the store was opened
    return lines[0]


# -- tasks.env_args.data_dir -------------------------------------------------------------------------


def webshop(data_dir: str, goals: str = "") -> str:
    return f"{{env: webshop, start: 0, stop: 2, env_args: {{data_dir: '{data_dir}'{goals}}}}}"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_webshop_data_dir_that_does_not_exist(tmp_path, command):
    line = refused(tmp_path, command, spec_file(tmp_path, webshop("/nonexistent")))
    assert line == ("error: tasks.env_args.data_dir: /nonexistent does not exist; "
                    "expected a folder with WebShop's items_*.json files")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_webshop_data_dir_that_is_a_file(tmp_path, command):
    (tmp_path / "items.json").write_text("[]")
    line = refused(tmp_path, command, spec_file(tmp_path, webshop(f"{tmp_path}/items.json")))
    assert line == (f"error: tasks.env_args.data_dir: {tmp_path}/items.json is a file, not a folder; "
                    "expected a folder with WebShop's items_*.json files")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_webshop_data_dir_without_its_files(tmp_path, command):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "items_shuffle.json").write_text("[]")
    line = refused(tmp_path, command, spec_file(tmp_path, webshop(f"{tmp_path}/data")))
    assert line.startswith(f"error: tasks.env_args.data_dir: {tmp_path}/data has no items_ins_v2*.json; "), line
    (tmp_path / "data" / "items_ins_v2.json").write_text("{}")
    line = refused(tmp_path, command, spec_file(tmp_path, webshop(f"{tmp_path}/data", ", goals: human")))
    assert line.startswith(f"error: tasks.env_args.goals: human needs {tmp_path}/data/items_human_ins.json"), line


@pytest.mark.parametrize("command", COMMANDS)
def test_webshop_data_from_the_environment_is_checked_too(tmp_path, command):
    spec = spec_file(tmp_path, "{env: webshop, start: 0, stop: 2}")
    line = refused(tmp_path, command, spec, env={"WEBSHOP_DATA": "/nonexistent"})
    assert line.startswith("error: tasks.env_args.data_dir (not given: $WEBSHOP_DATA): /nonexistent does not exist"), line


@pytest.mark.parametrize("command", COMMANDS)
def test_an_alfworld_data_dir_without_the_split(tmp_path, command):
    (tmp_path / "alfworld" / "json_2.1.1" / "train").mkdir(parents=True)
    tasks = f"{{env: alfworld, start: 0, stop: 2, env_args: {{data_dir: '{tmp_path}/alfworld', split: valid_seen}}}}"
    line = refused(tmp_path, command, spec_file(tmp_path, tasks))
    assert line == (f"error: tasks.env_args.data_dir: {tmp_path}/alfworld has no json_2.1.1/valid_seen (nor valid_seen) "
                    "folder; expected the folder alfworld-download fills (holding json_2.1.1/)")
    tasks = "{env: alfworld, start: 0, stop: 2, env_args: {data_dir: /nonexistent}}"
    line = refused(tmp_path, command, spec_file(tmp_path, tasks))
    assert line.startswith("error: tasks.env_args.data_dir: /nonexistent does not exist; expected"), line


# -- policy.model --------------------------------------------------------------------------------------


def model_folder(path: Path) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_typod_model_folder_names_the_close_one(tmp_path, command):
    model_folder(tmp_path / "models" / "demo")
    for typo in ("models/dmeo", "./models/deom"):
        line = refused(tmp_path, command, spec_file(tmp_path, policy=f"{{kind: vllm, model: {typo}}}"))
        close = "./models/demo" if typo.startswith("./") else "models/demo"
        assert line == f"error: policy.model: {typo} does not exist; did you mean {close}?"


@pytest.mark.parametrize("command", COMMANDS)
def test_a_model_folder_far_from_any_says_how_to_make_it(tmp_path, command):
    (tmp_path / "models").mkdir()
    model = f"{tmp_path}/models/qwen-tiny"
    line = refused(tmp_path, command, spec_file(tmp_path, policy=f"{{kind: vllm, model: {model}}}"))
    assert line == (f"error: policy.model: {model} does not exist; make it with `thicket make-model {model} --demo` "
                    "(the demo policy), or give policy.url")
    (tmp_path / "models" / "qwen-tiny").mkdir()
    line = refused(tmp_path, command, spec_file(tmp_path, policy=f"{{kind: vllm, model: {model}}}"))
    assert line.startswith(f"error: policy.model: {model} has no config.json, so it is not a model folder; "), line


def test_a_hub_id_in_a_local_sweep_is_still_a_note_in_validate_and_refused_by_run(tmp_path):
    spec = spec_file(tmp_path, policy="{kind: vllm, model: Qwen/Qwen2.5-0.5B-Instruct}")
    result = thicket(tmp_path, "validate", str(spec))
    assert result.returncode == 0, result.stderr
    assert "note: policy.model: the local model folder Qwen/Qwen2.5-0.5B-Instruct does not exist" in result.stderr
    line = refused(tmp_path, "run", spec, as_before=True)
    assert line.startswith("error: policy.model: 'Qwen/Qwen2.5-0.5B-Instruct' is not a local model folder"), line


def test_an_existing_model_folder_and_a_uniform_override_pass(tmp_path):
    model_folder(tmp_path / "models" / "demo")
    result = thicket(tmp_path, "validate", str(spec_file(tmp_path, policy="{kind: vllm, model: models/demo}")))
    assert result.returncode == 0 and "error" not in result.stderr and "config.json" not in result.stderr, result.stderr
    result = thicket(tmp_path, "validate", str(spec_file(tmp_path, policy="{kind: vllm, model: models/dmeo}")),
                     "--policy", "uniform")
    assert result.returncode == 0, result.stderr  # the uniform policy serves no model


# -- output --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_that_cannot_be_created(tmp_path, command):
    line = refused(tmp_path, command, spec_file(tmp_path, output="/proc/nope"))
    assert line == ("error: output: /proc/nope: cannot write there (/proc: No such file or directory); "
                    "expected a folder thicket can create and write")
    assert not Path("/proc/nope").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_an_output_that_is_a_file(tmp_path, command):
    (tmp_path / "afile").write_text("")
    line = refused(tmp_path, command, spec_file(tmp_path, output="$tmp/afile"))
    assert line == f"error: output: {tmp_path}/afile is a file; expected a folder (the sweep's folder refused/ goes in it)"
    line = refused(tmp_path, command, spec_file(tmp_path, output="file://$tmp/afile/sub"))
    assert line == (f"error: output: file://{tmp_path}/afile/sub: {tmp_path}/afile is a file, not a folder; "
                    "expected a folder for the sweep")


def test_run_with_o_is_checked_and_s3_outputs_are_not_checked_here(tmp_path):
    spec = spec_file(tmp_path)
    result = thicket(tmp_path, "run", str(spec), "-o", "/proc/nope", "--no-aggregate", "--no-progress")
    assert result.returncode == 2 and result.stderr.startswith("error: output: /proc/nope: cannot write there"), \
        result.stderr
    # a cluster sweep: its data folder and output are the pods', nothing here is checked
    cluster = spec_file(tmp_path, webshop("/data/webshop"), output="s3://datasets/rollouts")
    result = thicket(tmp_path, "validate", str(cluster))
    assert result.returncode == 0, result.stderr
    assert "data_dir" not in result.stderr and "output" not in result.stderr
