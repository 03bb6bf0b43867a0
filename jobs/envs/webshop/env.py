"""The `webshop` env family: WebShop's shop in process, with exact snapshots.

env_args:
  data_dir        a folder with WebShop's data files (items_shuffle*.json, items_ins_v2*.json and,
                  for human goals, items_human_ins.json); default: $WEBSHOP_DATA, else the
                  generated synthetic catalogue (thicket.envs.webshop.generate)
  goals           "human" (items_human_ins.json), "synthetic" (from the attribute file's
                  instructions, one goal per option combination) or "auto" (human where the file is)
  products, seed  the synthetic catalogue's size (100-20000) and generator seed
  cache_dir       where the synthetic catalogue is written
  search_actions  how many `search[...]` actions the search page lists (default 3; 0: none,
                  valid_actions None there: free text only)

Task i is goal i of the catalogue (see thicket.envs.webshop.catalog); rules: docs/envs/webshop.md.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from thicket.envs import register
from thicket.envs.env_args import int_arg, path_arg
from thicket.envs.protocol import Observation, SyncEnv, Transition
from thicket.envs.webshop.catalog import Catalog, DataFiles, load
from thicket.envs.webshop.generate import GENERATOR_VERSION, synthetic_files
from thicket.envs.webshop.gold import gold_path
from thicket.envs.webshop.pages import Page, Shop, ShopState
from thicket.envs.webshop.queries import search_actions
from thicket.envs.webshop.search import SearchIndex
from thicket.errors import BadInput

INSTRUCTIONS = """\
WebShop: buy the product that best matches the instruction (its attributes, options and price).
Actions (one per turn):
- search[keywords]   on the search page: search the shop
- click[value]       click a value shown on the page: a product id, an option value,
                     "Back to Search", "Next >", "< Prev", "Description", "Features",
                     "Reviews" or "Buy Now"
Choose the product's options on its page before "Buy Now"; buying ends the episode and
scores the purchase from 0 to 1."""

GOAL_MODES = ("auto", "human", "synthetic")


@dataclass(frozen=True)
class WebShopSnapshot:
    task: int
    state: ShopState
    steps: int


def _one(folder: Path, pattern: str, preferred: str) -> Path:
    found = sorted(folder.glob(pattern))
    if (folder / preferred).exists():
        return folder / preferred
    if len(found) != 1:
        what = "none" if not found else ", ".join(p.name for p in found)
        raise BadInput(f"webshop: data_dir {folder} must hold exactly one {pattern} (found {what}) or {preferred}")
    return found[0]


def data_files(data_dir: str | Path, goals: str) -> DataFiles:
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise BadInput(f"webshop: data_dir {folder} is not a folder; expected one with WebShop's items_*.json files")
    human = folder / "items_human_ins.json"
    if goals == "human" and not human.exists():
        raise BadInput(f"webshop: goals 'human' needs {human}; use goals: synthetic, or add the file")
    return DataFiles(
        _one(folder, "items_shuffle*.json", "items_shuffle.json"),
        _one(folder, "items_ins_v2*.json", "items_ins_v2.json"),
        human if goals != "synthetic" and human.exists() else None,
    )


@functools.lru_cache(maxsize=8)
def shop_data(files: DataFiles) -> tuple[Catalog, SearchIndex]:
    """The catalogue and its index, once per process per set of files."""
    catalog = load(files)
    return catalog, SearchIndex(catalog.products)


def resolve_files(data_dir: Path | None, goals: str, products: int, seed: int, cache_dir: Path | None) -> DataFiles:
    if goals not in GOAL_MODES:
        raise BadInput(f"webshop: env_args.goals must be one of {', '.join(GOAL_MODES)}, got {goals!r}")
    if data_dir:
        return data_files(data_dir, goals)
    files = synthetic_files(products, seed, cache_dir)
    return files if goals != "synthetic" else replace(files, human_goals=None)


class WebShopEnv(SyncEnv):
    family = "webshop"
    can_snapshot = True

    def __init__(self, files: DataFiles, search_actions: int = 3, data_source: str | None = None) -> None:
        self.catalog, self.index = shop_data(files)
        self.search_actions = search_actions
        goals = "human" if files.human_goals is not None else "synthetic"
        self.data_source = data_source or f"WebShop data files in {files.products.parent} ({goals} goals)"
        self._shop: Shop | None = None
        self._task = 0
        self._state = ShopState()
        self._steps = 0

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def shop(self) -> Shop:
        if self._shop is None:
            raise RuntimeError("reset the env before stepping it")
        return self._shop

    @property
    def state(self) -> ShopState:
        return self._state

    def reset_sync(self, task: int) -> Observation:
        self._set_task(task)
        self._state, self._steps = ShopState(), 0
        return self.observation()

    def step_sync(self, action: str) -> Transition:
        if self._state.page is Page.DONE:
            return Transition(self.observation(), 0.0, True, False, {"page": Page.DONE.value})
        self._steps += 1
        self._state = self.shop.act(self._state, action)
        done = self._state.page is Page.DONE
        reward = self._state.reward if done else 0.0
        info: dict[str, Any] = {"page": self._state.page.value, "steps": self._steps}
        if done:
            info |= {"asin": self._state.asin, "options": dict(self._state.options)}
        return Transition(self.observation(), reward, done, done and reward >= 1.0, info)

    def observation(self) -> Observation:
        return Observation(self.shop.text(self._state), self.valid_actions())

    def valid_actions(self) -> tuple[str, ...] | None:
        if self._state.page is Page.SEARCH:
            return self.listed_searches()
        return tuple(f"click[{value}]" for value in self.shop.clickables(self._state))

    @property
    def walkthrough(self) -> tuple[str, ...]:
        """A gold path's actions for the current task, empty if none (thicket.envs.webshop.gold)."""
        goal = self.shop.goal
        steps = gold_path(goal, self.catalog.by_asin[goal.asin], self.index, self.listed_searches())
        return () if steps is None else tuple(step.action for step in steps)

    def listed_searches(self) -> tuple[str, ...] | None:
        """The search page's listed search actions (None: free text only)."""
        n = self.search_actions
        return search_actions(self.shop.goal.instruction, n) if n else None

    def snapshot_sync(self) -> WebShopSnapshot:
        return WebShopSnapshot(self._task, self._state, self._steps)

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, WebShopSnapshot)
        self._set_task(state.task)
        self._state, self._steps = state.state, state.steps

    def _set_task(self, task: int) -> None:
        if isinstance(task, bool) or not isinstance(task, int):
            raise BadInput(f"webshop: task must be an integer, got {task!r}")
        self._shop = Shop(self.catalog, self.index, self.catalog.goal(task))
        self._task = task


@register("webshop")
def make_webshop(
    data_dir: str | None = None,
    goals: str = "auto",
    products: int = 1000,
    seed: int = 0,
    cache_dir: str | None = None,
    search_actions: int = 3,
) -> WebShopEnv:
    products, seed = int_arg("webshop", "products", products, 100, 20000), int_arg("webshop", "seed", seed, 0, 2**31)
    folder = path_arg("webshop", "data_dir", data_dir or os.environ.get("WEBSHOP_DATA"))
    files = resolve_files(folder, goals, products, seed, path_arg("webshop", "cache_dir", cache_dir))
    source = None if folder else (
        f"thicket's synthetic WebShop catalogue ({products} products, seed {seed}, goals {goals}), "
        f"generated (generator v{GENERATOR_VERSION}): NOT WebShop's benchmark, success rates and scores on it "
        "are not comparable with the papers'")
    return WebShopEnv(files, int_arg("webshop", "search_actions", search_actions, 0, 20), source)
