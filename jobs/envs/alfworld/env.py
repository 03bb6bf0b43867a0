"""The `alfworld` env family: ALFWorld's household text games on TextWorld's PDDL engine.

Games come from one of two sources (env_args):
- generated (the default): task i is thicket's generated game i (`tasks`, `cache`) in
  wording "2.1.1" (default; ALFWorld's json_2.1.1 games, as ReAct, ETO and AgentGym show
  them) or "2.1.2"; cached under `cache_dir` (default ~/.cache/thicket/alfworld, or
  $THICKET_ALFWORLD_CACHE). These are NOT ALFWorld's benchmark games.
- official: `data_dir` (or $ALFWORLD_DATA) with `split` train / valid_seen / valid_unseen:
  task i is the i-th game in ALFWorld's order (`official`), as its files say (their own
  grammar and wording).

Valid actions are the game's admissible commands; any other text answers "Nothing
happens." and still takes a turn. A command is matched as ALFWorld's engine matches it:
leading and trailing whitespace dropped, nothing else forgiven ("go  to cabinet 1", two
spaces, is not a command). `presentation` (module `presentation`) picks ALFWorld's raw text (the
default) or AgentGym's edited text. Reward 1 and done when the goal holds (INCREMENT);
`max_steps` (default none) ends an episode unsolved after that many turns. Snapshots are
exact (`engine`): ~0.05 ms a snapshot + restore, against a replay's reset (~1 ms once the
game is loaded, 0.6 s for its first load) plus ~32 ms (median; up to ~100 ms) a replayed
step, so trees branch by snapshot.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thicket.envs import register
from thicket.envs.env_args import int_arg, path_arg
from thicket.envs.alfworld import cache, official, tasks
from thicket.envs.alfworld.engine import Engine, EngineSnapshot
from thicket.envs.alfworld.presentation import Presentation, lists_actions_at_the_end, opening, step_text
from thicket.envs.alfworld.wording import Wording
from thicket.envs.protocol import ActionFailed, Observation, RewardSemantics, SyncEnv, Transition
from thicket.errors import BadInput

INSTRUCTIONS = """\
You are in a household (ALFWorld). Complete the task you are given by interacting with the
room. Commands: "go to <receptacle>", "open <receptacle>", "close <receptacle>",
"take <object> from <receptacle>", "put <object> in/on <receptacle>", "clean <object> with
<receptacle>", "heat <object> with <receptacle>", "cool <object> with <receptacle>",
"use <object>", "examine <something>", "inventory", "look". Name things exactly as the game
does ("cabinet 1"). The episode ends with success when the task is done."""

OVER = "The episode is over."


@dataclass(frozen=True)
class Generated:
    wording: Wording
    cache_dir: Path

    def game_dir(self, task: int) -> Path:
        if task < 0:
            raise BadInput(f"task {task}: expected a task index >= 0")
        return cache.game_dir(task, self.wording, self.cache_dir)

    def describe(self) -> str:
        return (f"thicket's generated ALFWorld games (generator v{tasks.GENERATOR_VERSION}, {self.wording.value} "
                "wording): NOT ALFWorld's benchmark, figures on them are not comparable with the papers'")


@dataclass(frozen=True)
class Official:
    folder: Path
    task_types: tuple[str, ...]
    order: str

    def game_dir(self, task: int) -> Path:
        return official.official_game_dir(self.folder, self.task_types, self.order, task)

    def game_list(self) -> tuple[Path, ...]:
        return official.game_list(self.folder, self.task_types, self.order)

    def describe(self) -> str:
        return f"ALFWorld's own games in {self.folder} (task types {', '.join(self.task_types)}; {self.order} order)"


@dataclass(frozen=True)
class AlfWorldSnapshot:
    task: int
    engine_id: int  # the engine whose planner state `engine` names
    engine: EngineSnapshot
    commands: tuple[str, ...]  # since the reset: to replay into another engine
    steps: int
    done: bool


class AlfWorldEnv(SyncEnv):
    family = "alfworld"
    can_snapshot = True
    reward_semantics = RewardSemantics.INCREMENT

    def __init__(self, source: Generated | Official, max_steps: int | None = None,
                 presentation: Presentation = Presentation.ALFWORLD) -> None:
        self.source = source
        self.data_source = source.describe()
        self.max_steps = max_steps
        self.presentation = presentation
        self._engine: Engine | None = None
        self._game: Path | None = None
        self._task: int | None = None
        self._steps = 0
        self._done = False
        self._commands: tuple[str, ...] = ()
        self._walkthrough: tuple[str, ...] = ()
        self._traj: dict[str, Any] = {}

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def walkthrough(self) -> tuple[str, ...]:
        """The game file's winning commands (for generated games: the gold path)."""
        return self._walkthrough

    @property
    def traj_data(self) -> dict[str, Any]:
        """The current game's traj_data.json (task type, pddl_params)."""
        return self._traj

    @property
    def game_folder(self) -> Path | None:
        """The folder of the loaded game (its game.tw-pddl and traj_data.json)."""
        return self._game

    def reset_sync(self, task: int) -> Observation:
        self._load(task)
        assert self._engine is not None
        result = self._engine.reset()
        self._task, self._steps, self._done, self._commands = task, 0, False, ()
        return Observation(opening(result.feedback, self.presentation), result.admissible)

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation(OVER, ()), 0.0, True)
        if self._engine is None:
            raise RuntimeError("reset the env before stepping it")
        command = action.strip()  # as ALFWorld's engine (PddlEnv.step) reads it
        result = self._engine.step(command)
        self._commands += (command,)
        self._steps += 1
        truncated = not result.won and self.max_steps is not None and self._steps >= self.max_steps
        self._done = result.won or truncated
        info = {"steps": self._steps, "truncated": truncated}
        listed = result.admissible if not self._done or lists_actions_at_the_end(self.presentation) else ()
        observation = Observation(step_text(result.feedback, self.presentation), listed)
        return Transition(observation, 1.0 if result.won else 0.0, self._done, result.won, info)

    def _load(self, task: int) -> None:
        game = self.source.game_dir(task)
        if self._engine is not None and self._game == game:
            return
        data = official.load_game_data(game)
        self.close_sync()
        try:
            self._engine = Engine(data)
        except Exception as err:  # the engine cannot load this game: this tree fails, not the sweep
            raise ActionFailed(f"alfworld: {game} does not load: {type(err).__name__}: {err}") from err
        self._game = game
        self._walkthrough = tuple(data.get("walkthrough") or ())
        traj = game / official.TRAJ_FILE
        self._traj = json.loads(traj.read_text()) if traj.exists() else {}

    def snapshot_sync(self) -> AlfWorldSnapshot:
        if self._engine is None or self._task is None:
            raise RuntimeError("reset the env before snapshotting it")
        return AlfWorldSnapshot(self._task, self._engine.serial, self._engine.snapshot(), self._commands,
                                self._steps, self._done)

    def restore_sync(self, state: Any) -> None:
        """Exact, through the planner's state registry; a snapshot of another engine (another
        env instance, or a game loaded again since) is replayed from a reset instead."""
        assert isinstance(state, AlfWorldSnapshot)
        if self._engine is None or self._task != state.task or self._engine.serial != state.engine_id:
            self.reset_sync(state.task)
            assert self._engine is not None
            for command in state.commands:
                self._engine.step(command)
        else:
            self._engine.restore(state.engine)
        self._steps, self._done, self._commands = state.steps, state.done, state.commands

    def close_sync(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine, self._game, self._task = None, None, None

    # Loading a game takes ~0.6 s and a step 20-100 ms (TextWorld's text generation): both
    # run in a thread, so that the event loop keeps serving the other trees.

    async def reset(self, task: int) -> Observation:
        return await asyncio.to_thread(self.reset_sync, task)

    async def step(self, action: str) -> Transition:
        return await asyncio.to_thread(self._step_or_fail, action)

    def _step_or_fail(self, action: str) -> Transition:
        try:
            return self.step_sync(action)
        except Exception as err:
            raise ActionFailed(f"{self.family} raised {type(err).__name__}: {err}") from err

    async def restore(self, state: Any) -> None:
        if self._engine is None or self._engine.serial != getattr(state, "engine_id", None):
            try:
                await asyncio.to_thread(self.restore_sync, state)  # it loads the game first
            except (ActionFailed, BadInput):
                raise
            except Exception as err:
                raise ActionFailed(f"{self.family} could not restore: {type(err).__name__}: {err}") from err
        else:
            self.restore_sync(state)

    async def close(self) -> None:
        self.close_sync()


def _presentation(value: str) -> Presentation:
    try:
        return Presentation(value)
    except ValueError:
        raise BadInput(f"env_args.presentation: {value!r} is not one of "
                       f"{', '.join(p.value for p in Presentation)}") from None


def _wording(value: str) -> Wording:
    try:
        return Wording(value)
    except ValueError:
        raise BadInput(f"env_args.wording: {value!r} is not one of {', '.join(w.value for w in Wording)}") from None


@register("alfworld")
def make_alfworld(
    wording: str = "2.1.1",
    cache_dir: str | None = None,
    data_dir: str | None = None,
    split: str | None = None,
    task_types: list[Any] | None = None,
    order: str = "sorted",
    max_steps: int | None = None,
    presentation: str = "alfworld",
) -> AlfWorldEnv:
    if max_steps is not None:
        max_steps = int_arg("alfworld", "max_steps", max_steps, 1)
    if order not in official.ORDERS:
        raise BadInput(f"env_args.order: {order!r} is not one of {', '.join(official.ORDERS)}")
    folder = path_arg("alfworld", "data_dir", data_dir)
    if folder is None and split is None and task_types is None:
        games = path_arg("alfworld", "cache_dir", cache_dir) or cache.default_cache_dir()
        return AlfWorldEnv(Generated(_wording(wording), games), max_steps, _presentation(presentation))
    types = official.task_types_arg(task_types)
    source = Official(official.split_dir(folder, split or "train"), types, order)
    return AlfWorldEnv(source, max_steps, _presentation(presentation))
