"""`thicket envs` lists each family's env_args (name, what it takes, default) from the table a
spec is checked against (thicket.envs.env_args.FAMILY_ARGS), so the list cannot drift from it;
`thicket envs FAMILY...` shows only those families; an unknown one is one line, exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from thicket.cli import cli
from thicket.env_list import shown
from thicket.envs.env_args import FAMILY_ARGS


def envs(*families: str):
    return CliRunner().invoke(cli, ["envs", *families], terminal_width=300)


def args_section(output: str) -> dict[str, list[str]]:
    """family -> its env_args lines, from the part after 'env_args'."""
    lines = output.split("env_args (tasks.env_args)", 1)[1].splitlines()[1:]
    sections: dict[str, list[str]] = {}
    for line in lines:
        if line and not line.startswith(" "):
            sections[line] = []
        elif line:
            sections[list(sections)[-1]].append(line.strip())
    return sections


@pytest.mark.parametrize("family", sorted(FAMILY_ARGS))
def test_every_familys_args_are_listed_with_what_they_take_and_their_default(family):
    result = envs()
    assert result.exit_code == 0, result.output
    listed = {line.split()[0]: line for line in args_section(result.output)[family]}
    assert list(listed) == (list(FAMILY_ARGS[family]) or ["none"])
    for name, arg in FAMILY_ARGS[family].items():
        assert arg.expected in listed[name], listed[name]
        assert listed[name].endswith(f"  {shown(arg.default)}"), listed[name]


def test_a_default_is_shown_as_a_spec_writes_it():
    assert [shown(v) for v in (None, True, False, "", 4, "auto")] == ["not set", "true", "false", '""', "4", "auto"]
    frozenlake = args_section(envs("frozenlake").output)["frozenlake"]
    assert frozenlake == ["size         an integer from 2 to 64  4", "is_slippery  true or false            false"]


def test_named_families_alone():
    result = envs("webshop", "taxi")
    assert result.exit_code == 0, result.output
    assert list(args_section(result.output)) == ["taxi", "webshop"]
    assert [line.split()[0] for line in result.output.split("\n\n")[0].splitlines()[1:]] == ["taxi", "webshop"]


def test_an_unknown_family_is_one_line():
    thicket = Path(sys.executable).parent / "thicket"
    result = subprocess.run([str(thicket), "envs", "webshopp"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: unknown env family 'webshopp'; known: alfworld,")
    assert len(result.stderr.splitlines()) == 1
