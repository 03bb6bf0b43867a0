"""Every `thicket` command's --help shows how it is called: an example line starting with
`thicket COMMAND`, kept on its own line (click's \\b paragraph). The commands are read from the
group, so a command added without examples fails here."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from thicket.cli import cli


def example_lines(command: str) -> list[str]:
    """The help's lines that call `thicket COMMAND`, stripped."""
    result = CliRunner().invoke(cli, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return [line.strip() for line in result.output.splitlines()
            if line.strip() == f"thicket {command}" or line.strip().startswith(f"thicket {command} ")]


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_command_help_has_an_example(command):
    assert example_lines(command), f"`thicket {command} --help` shows no example line `thicket {command} ...`"


def test_the_group_lists_the_cluster_commands_too():
    assert {"render", "submit", "status", "rehearse", "worker", "logs", "cancel", "wait-job", "envs"} <= set(cli.commands)


def test_examples_keep_their_line_breaks():
    """Two examples on two lines, not rewrapped into one paragraph."""
    assert len(example_lines("submit")) >= 2
