"""The CLI's first hour: unwritable outputs, -o always a path, empty --indices, a missing
kubeconfig, help and examples, `thicket envs`, and wording (through the real `thicket`)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
from pathlib import Path

import pytest

from tests.test_cli import ROOT, THICKET, thicket
from thicket.envs import BUILTINS
from thicket.envs.env_args import distinct_tasks

NO_CLUSTER = {"KUBERNETES_SERVICE_HOST": ""}  # never the in-cluster account, even inside a pod


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The demo's six TextCraft trees (200-205) with the uniform policy, not aggregated."""
    out = tmp_path_factory.mktemp("sweep")
    result = thicket("run", "sweeps/demo.yaml", "--policy", "uniform", "-o", str(out), "--no-aggregate")
    assert result.returncode == 0, result.stderr
    return out / "demo-textcraft-mcts"


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- 1. outputs that cannot be written -------------------------------------------------------
@pytest.mark.parametrize(
    "args,needle",
    [
        (["show", "SWEEP", "--task", "200", "-o", "/nonexistent/dir/x.html"],
         "-o /nonexistent/dir/x.html: cannot write it (its folder /nonexistent/dir does not exist)"),
        (["show", "SWEEP", "--task", "200", "-o", "/proc/x.html"], "-o /proc/x.html: cannot write it ("),
        (["export", "SWEEP", "-o", "/nonexistent/dir/x.json"],
         "-o /nonexistent/dir/x.json: cannot write it (its folder /nonexistent/dir does not exist)"),
        (["export", "SWEEP", "-o", "/proc/x.json"], "-o /proc/x.json: cannot write it ("),
        (["pull", "SWEEP", "/proc/nope"], "/proc/nope: cannot write the pulled sweep there ("),
        (["pull", "SWEEP", "/proc/self/status/sub"], "/proc/self/status/sub: cannot write the pulled sweep there ("),
        (["render", "sweeps/cluster/textcraft-mcts.yaml", "-o", "/proc/nope"], "-o /proc/nope: cannot write the objects there ("),
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_naming_it(sweep, args, needle):
    line = one_error_line(thicket(*[str(sweep) if a == "SWEEP" else a for a in args]))
    assert needle in line, line
    assert not Path("/proc/nope").exists()


# -- 2. -o is a path, --format a format; export does not flood a terminal ---------------------
def test_export_on_a_terminal_without_o_asks_for_it_and_writes_nothing(sweep):
    controller, terminal = pty.openpty()
    try:
        result = subprocess.run([THICKET, "export", str(sweep)], cwd=ROOT, stdout=terminal, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    finally:
        os.close(terminal)
    os.close(controller)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "give -o FILE (or -o - to print it on this terminal)" in lines[0], result.stderr


def test_export_writes_to_a_pipe_or_to_o_dash_as_before(sweep, tmp_path):
    piped = thicket("export", str(sweep))  # stdout is a pipe here: the old default still works
    assert piped.returncode == 0, piped.stderr
    dashed = thicket("export", str(sweep), "-o", "-")
    assert dashed.returncode == 0 and json.loads(dashed.stdout) == json.loads(piped.stdout)
    out = tmp_path / "tot.json"
    to_file = thicket("export", str(sweep), "--format", "tot-json", "--output", str(out))
    assert to_file.returncode == 0 and to_file.stdout == "" and json.loads(out.read_text()) == json.loads(piped.stdout)


def test_run_takes_o_for_its_output(sweep):
    assert sweep.name == "demo-textcraft-mcts" and (sweep / "spec.yaml").is_file()  # the fixture ran `run -o`


# -- 3. an empty --indices -------------------------------------------------------------------
@pytest.mark.parametrize("command", ["run", "eval"])
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_indices_is_refused(command, value, tmp_path):
    line = one_error_line(thicket(command, "sweeps/demo.yaml", "--policy", "uniform", "-o", str(tmp_path),
                                  "--indices", value))
    assert "--indices: empty" in line, line
    assert not any(tmp_path.iterdir())  # nothing ran


# -- 4. a missing kubeconfig is the user's mistake -------------------------------------------
@pytest.mark.parametrize("args", [["status", "tc"], ["cancel", "tc"], ["logs", "tc", "--index", "0"],
                                  ["wait-job", "tc"]])
def test_a_missing_kubeconfig_exits_2_naming_it_and_kubeconfig(tmp_path, args):
    missing = tmp_path / "kubeconfig"
    line = one_error_line(thicket(*args, env={**NO_CLUSTER, "KUBECONFIG": str(missing)}))
    assert f"no kubeconfig at {missing} (from KUBECONFIG)" in line, line


def test_no_kubeconfig_at_the_default_path_says_kubeconfig_is_not_set(tmp_path):
    line = one_error_line(thicket("status", "tc", env={**NO_CLUSTER, "KUBECONFIG": "", "HOME": str(tmp_path)}))
    assert f"no kubeconfig at {tmp_path}/.kube/config (the default; KUBECONFIG is not set)" in line, line


# -- 5. help ---------------------------------------------------------------------------------
def test_thicket_alone_prints_the_help_and_exits_0():
    result = thicket()
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Usage: thicket") and "Commands:" in result.stdout


def test_the_command_list_is_whole_on_80_columns():
    result = thicket("--help", env={"COLUMNS": "80"})
    commands = result.stdout.split("Commands:")[1].strip().splitlines()
    assert len(commands) >= 18 and "envs" in result.stdout
    assert not [line for line in commands if line.rstrip().endswith("...")], result.stdout


@pytest.mark.parametrize("command", ["run", "validate", "eval", "show", "export", "pull", "aggregate", "make-model",
                                     "serve-env"])
def test_the_main_commands_have_examples(command):
    result = thicket(command, "--help")
    assert result.returncode == 0
    examples = result.stdout.split("Examples:\n")[1].splitlines()
    assert examples and all(line.startswith("    thicket ") or line.startswith("    curl ") for line in examples if line)


@pytest.mark.parametrize("command,option", [("export", "--format"), ("serve-env", "--port"),
                                            ("serve-env", "--max-action-chars"), ("status", "--format")])
def test_options_say_what_they_are(command, option):
    help_text = thicket(command, "--help").stdout
    line = next(line for line in help_text.splitlines() if line.strip().startswith(option) or f", {option}" in line)
    assert len(line.split()) > 2, line  # more than the option and its metavar


# -- 6. thicket envs; show names the tasks a sweep holds --------------------------------------
def test_envs_lists_every_family_with_its_tasks_splits_and_extra():
    result = thicket("envs", timeout=30)
    assert result.returncode == 0, result.stderr
    table = result.stdout.split("\n\n")[0]  # the table, before its footer and the env_args
    rows = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert set(BUILTINS) <= set(rows)
    assert f"{distinct_tasks('textcraft', {})} goals" in rows["textcraft"]
    assert f"{distinct_tasks('math', {})} shipped problems" in rows["math"]
    assert "train, valid_seen, valid_unseen" in rows["alfworld"] and "thicket[alfworld]" in rows["alfworld"]
    assert "train, dev, test, all" in rows["sciworld"] and "Java 17" in rows["sciworld"]
    assert "generated" in rows["frozenlake"] and "thicket[envs]" in rows["frozenlake"]


def test_show_of_a_task_not_in_the_sweep_names_the_tasks_it_holds(sweep, tmp_path):
    line = one_error_line(thicket("show", str(sweep), "--task", "999", "-o", str(tmp_path / "t.html")))
    assert line == f"error: --task 999: no committed tree in {sweep}; it holds tasks 200-205 (6 tasks)"
    assert not (tmp_path / "t.html").exists()
    empty = one_error_line(thicket("show", str(tmp_path), "--task", "1", "-o", str(tmp_path / "t.html")))
    assert "it holds no committed trees" in empty


# -- 7. wording ------------------------------------------------------------------------------
def test_pull_counts_agree_in_number(sweep, tmp_path):
    result = thicket("pull", str(sweep), str(tmp_path / "copy"), "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "1 committed shard verified" in result.stdout, result.stdout  # the demo's six trees are one batch file
