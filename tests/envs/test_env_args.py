"""The env_args table the spec is checked against: in step with each family's factory, every
family refusing an argument it does not take, and the families' distinct task counts."""

from __future__ import annotations

import inspect

import pytest

from thicket.envs import BUILTINS, _REGISTRY, require
from thicket.envs.env_args import FAMILY_ARGS, distinct_tasks, env_args_problems


def test_every_builtin_family_has_an_entry():
    assert set(FAMILY_ARGS) == set(BUILTINS)


@pytest.mark.parametrize("family", sorted(BUILTINS))
def test_the_table_names_the_factorys_arguments_and_accepts_its_defaults(family):
    require(family)  # every family's package is installed in the test environment
    parameters = inspect.signature(_REGISTRY[family]).parameters
    assert list(FAMILY_ARGS[family]) == list(parameters)
    defaults = {name: p.default for name, p in parameters.items()
                if p.default is not None and p.default is not inspect.Parameter.empty}
    assert env_args_problems(family, defaults) == []


@pytest.mark.parametrize("family", sorted(BUILTINS))
def test_the_tables_defaults_are_the_factorys(family):
    """`thicket envs` prints the table's defaults: they are the ones the factory applies."""
    require(family)
    parameters = inspect.signature(_REGISTRY[family]).parameters
    assert {name: arg.default for name, arg in FAMILY_ARGS[family].items()} == {
        name: None if p.default is inspect.Parameter.empty else p.default for name, p in parameters.items()}


@pytest.mark.parametrize("family", sorted(BUILTINS))
def test_every_family_refuses_an_unknown_argument_naming_what_it_takes(family):
    [(name, message)] = env_args_problems(family, {"colour": 1})
    assert name == "colour" and message.startswith("unknown argument; ")
    known = list(FAMILY_ARGS[family])
    assert (f"{family} takes {', '.join(known)}" if known else f"{family} takes no env_args") in message


def test_a_close_name_is_suggested():
    [(_, message)] = env_args_problems("webshop", {"product": 300})
    assert "did you mean 'products'?" in message


def test_values_are_checked_by_type_and_range():
    assert env_args_problems("frozenlake", {"size": 8, "is_slippery": True}) == []
    assert [n for n, _ in env_args_problems("frozenlake", {"size": True, "is_slippery": 1})] == ["size", "is_slippery"]
    assert env_args_problems("sciworld", {"max_valid_actions": None}) == []
    assert env_args_problems("alfworld", {"task_types": [1, "pick_and_place_simple"]}) == []
    assert env_args_problems("nonesuch", {"anything": 1}) == []  # registered elsewhere: its factory checks


def test_distinct_task_counts():
    assert distinct_tasks("textcraft", {}) == 419
    assert distinct_tasks("math", {}) == 360
    assert distinct_tasks("cliffwalking", {}) == 1 and distinct_tasks("cliffwalking", {"is_slippery": True}) is None
    assert distinct_tasks("textarena", {}) == 1 and distinct_tasks("textarena", {"game": "Minesweeper-v0"}) is None
    assert distinct_tasks("frozenlake", {}) is None
