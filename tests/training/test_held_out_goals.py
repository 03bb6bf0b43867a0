"""A recipe can hold goals out of its expert tasks, so a policy is evaluated on goals it never
trained on (TextCraft's task i is goal i mod 419: holding out indices would not do)."""

from __future__ import annotations

import pytest

from thicket.envs.textcraft import goals
from thicket.errors import BadInput
from thicket.training.demo_model import Recipe


def test_held_out_goals_leave_every_task_of_those_goals_out():
    n = len(goals())
    recipe = Recipe(tasks_start=1000, tasks_stop=3500, held_out_goals=(200, 264))
    kept = recipe.expert_tasks()
    left_out = [t for t in range(1000, 3500) if t not in set(kept)]
    assert {t % n for t in left_out} == set(range(200, 264))
    assert all(not 200 <= t % n < 264 for t in kept)
    assert len(kept) + len(left_out) == 2500 and len(left_out) >= 5 * 64  # each goal recurs ~6 times


def test_without_held_out_goals_every_task_is_kept():
    assert Recipe(tasks_start=10, tasks_stop=20).expert_tasks() == tuple(range(10, 20))


def test_a_family_without_wrapping_goals_cannot_hold_goals_out():
    with pytest.raises(BadInput, match="held_out_goals"):
        Recipe(env="webshop", held_out_goals=(0, 10)).expert_tasks()
