"""TextCraft: the observation, crafting and getting, gold paths, invalid actions, the shared
crafting tree."""

from __future__ import annotations

import dataclasses

from tests.support.env_cases import make
from tests.support.env_steps import rollout
from thicket.envs.textcraft import TextCraftEnv, TextCraftSnapshot, goals, gold_path, make_task


def test_textcraft_observation_format() -> None:
    obs = make("textcraft", {}).reset_sync(0)
    head, goal = obs.text.split("\n\nGoal: craft ")
    assert head.startswith("Crafting commands:\n") and goal.endswith(".")
    assert all(line.startswith("craft ") for line in head.splitlines()[1:])
    assert obs.valid_actions == tuple(sorted(set(obs.valid_actions or ())))
    assert "inventory" in (obs.valid_actions or ())


def test_textcraft_valid_actions_succeed_when_possible() -> None:
    env = make("textcraft", {})
    assert isinstance(env, TextCraftEnv)
    for index in range(0, len(goals()), 23):
        task = make_task(index)
        for craft in task.crafts:
            env.restore_sync(TextCraftSnapshot(task, craft.inputs, False, 0))
            text = env.step_sync(craft.command).observation.text
            assert text.startswith(f"Crafted {craft.count} "), (craft.command, text)
        for item, n in task.gets:
            env.restore_sync(TextCraftSnapshot(task, (), False, 0))
            action = f"get {n} {item.removeprefix('minecraft:').replace('_', ' ')}"
            assert action in task.valid_actions
            assert env.step_sync(action).observation.text == f"Got {n} {action[len(f'get {n} '):]}"


def test_textcraft_gold_paths_reach_the_goal() -> None:
    tasks = [make_task(i) for i in range(len(goals()))]
    plans = [gold_path(task) for task in tasks]
    assert all(plan is not None for plan in plans)  # every goal of this data set is craftable
    env = make("textcraft", {})
    for task, plan in zip(tasks[::7], plans[::7], strict=True):
        env.reset_sync(task.index)
        assert plan and set(plan) <= set(task.valid_actions)
        steps = rollout(env, plan)
        assert not any(done for *_, done, _ in steps[:-1])
        assert steps[-1][2:] == (1.0, True, True), (task.goal, steps[-1])


def test_textcraft_invalid_and_malformed_actions() -> None:
    env = make("textcraft", {})
    env.reset_sync(0)
    env.step_sync("get 1 oak logs")
    env.step_sync("craft 4 oak planks using 1 oak logs")
    before = env.snapshot_sync()
    for action in ("dance", "get 1 stick", "craft 1 cyan banner using 6 cyan wool, 1 stick",
                   "craft 4 stick using 2 oak planks, 2 oak planks", "craft 4 stick using oak"):
        step = env.step_sync(action)
        assert (step.reward, step.done, step.success) == (0.0, False, False), action
        assert dataclasses.replace(env.snapshot_sync(), steps=before.steps) == before, action
    inventory = env.step_sync("inventory").observation.text
    assert inventory.startswith("Inventory: [oak planks] (4)")


def test_textcraft_leaves_the_package_tree_untouched() -> None:
    tree = TextCraftEnv()._game.crafting_tree
    sizes = {k: len(v) for k, v in tree.itemid_recipes.items()}
    for index in range(0, 400, 40):
        make_task.__wrapped__(index)
    assert sizes == {k: len(v) for k, v in tree.itemid_recipes.items()}


def test_textcraft_instances_share_the_tree() -> None:
    assert TextCraftEnv()._game.crafting_tree is TextCraftEnv()._game.crafting_tree
    task = make_task(len(goals()) + 3)
    assert task.goal == make_task(3).goal and task.index == len(goals()) + 3
