"""TextWorld text adventures as text environments (their games: textworld_generate.py).

Valid actions are TextWorld's admissible commands (sorted); any other text goes to the
parser as well. reward = score / max_score (the game's running score, so the last step
of a path carries the path's score); success = the game is won.

Snapshots are exact: the Z-machine state (jericho get_state: RAM, stack, registers and
the interpreter's RNG; ~40 KB) plus TextWorld's own per-episode bookkeeping (quest
progression, winning policy, move count, last game states). Restoring into a fresh
instance of the same settings works too. A snapshot + restore pair costs ~3 ms (the
quest-progression copy dominates); a step ~2.5 ms (TextWorld's logic engine computing
the admissible commands dominates).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thicket.envs import register
from thicket.envs.protocol import Observation, RewardSemantics, SyncEnv, Transition
from thicket.envs.textworld_generate import JERICHO_SEED, GameSettings, default_cache_dir, game_file, start_game

INSTRUCTIONS = """\
You are playing a TextWorld text adventure. The game describes where you are and gives
you a task (an objective). Act with short imperative commands such as "go north",
"open chest", "take key from chest", "unlock door with key", "put apple on table",
"insert pillow into box", "eat apple", "look", "inventory", "examine X".
The episode ends with success when the objective is completed."""

# Keys of a wrapper layer's __dict__ that point at fixed game data or at the next layer.
_FIXED = frozenset(
    {"_wrapped_env", "_jericho", "_game", "_inform7", "_gamefile", "gamefile", "request_infos", "_seed"}
)


_BANNER_JUNK = re.compile(r"^\s*>|Would you like to RESTART")


def clean_feedback(text: str) -> str:
    """Drop the ASCII-art banner, the prompt/status line and the restart question."""
    lines = [
        line.rstrip()
        for line in text.splitlines()
        if not _BANNER_JUNK.search(line) and (any(c.isalnum() for c in line) or not line.strip())
    ]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _copy_value(value: Any) -> Any:
    from textworld.core import GameState
    from textworld.generator.game import GameProgression

    if isinstance(value, GameState):
        # Shallow: its values are replaced, never mutated, once the step that made it is
        # over (GameState.copy() would deepcopy the whole Game each time: seconds).
        return GameState(value)
    if isinstance(value, GameProgression):
        return value.copy()
    if isinstance(value, list):
        return list(value)
    return value


@dataclass(frozen=True)
class TextWorldSnapshot:
    task: int
    zmachine: Any  # jericho get_state(): (ram, stack, pc, sp, fp, frames, opcode, rng, narrative)
    layers: tuple[dict[str, Any], ...]  # per wrapper layer, its per-episode fields
    steps: int
    done: bool
    score: float


class TextWorldEnv(SyncEnv):
    family = "textworld"
    can_snapshot = True
    reward_semantics = RewardSemantics.RUNNING  # score / max_score so far, at every step

    def __init__(self, settings: GameSettings | None = None, cache_dir: str | Path | None = None) -> None:
        self.settings = settings or GameSettings()
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._tw: Any = None
        self._loaded: Path | None = None
        self._task: int | None = None
        self._steps = 0
        self._done = False
        self._score = 0.0
        self._max_score = 1.0
        self._walkthrough: tuple[str, ...] = ()

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def walkthrough(self) -> tuple[str, ...]:
        """The generator's winning command sequence for the current task."""
        return self._walkthrough

    def reset_sync(self, task: int) -> Observation:
        self._load(task)
        state = self._tw.reset()
        self._task, self._steps, self._done, self._score = task, 0, False, 0.0
        self._max_score = float(state["max_score"] or 1)
        self._walkthrough = tuple(state.get("extra.walkthrough") or ())
        return self._observation(state)

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", ()), 0.0, True)
        if self._tw is None:
            raise RuntimeError("reset the env before stepping it")
        command = " ".join(action.strip().split())
        state, _, _ = self._tw.step(command)
        self._steps += 1
        won, lost = bool(state["won"]), bool(state["lost"])
        self._done = won or lost
        self._score = float(state["score"] or 0)
        reward = min(max(self._score / self._max_score, 0.0), 1.0)
        info = {"steps": self._steps, "score": self._score, "max_score": self._max_score, "lost": lost}
        return Transition(self._observation(state), reward, self._done, won, info)

    def _observation(self, state: Any) -> Observation:
        text = clean_feedback(state.feedback or "")
        if self._done:
            return Observation(text, ())
        return Observation(text or "Nothing happens.", tuple(state["admissible_commands"] or ()))

    def _load(self, task: int) -> None:
        path = game_file(self.settings, task, self.cache_dir)
        if self._tw is not None and self._loaded == path:
            return
        from textworld import EnvInfos

        self.close_sync()
        infos = EnvInfos(
            admissible_commands=True, won=True, lost=True, score=True, max_score=True,
            moves=True, extras=["walkthrough"],
        )
        self._tw = start_game(path, infos)
        self._tw.seed(JERICHO_SEED)
        self._loaded = path

    def _layers(self) -> list[Any]:
        layers, layer = [], self._tw
        while layer is not None:
            layers.append(layer)
            layer = layer.__dict__.get("_wrapped_env")
        return layers

    def snapshot_sync(self) -> TextWorldSnapshot:
        if self._tw is None or self._task is None:
            raise RuntimeError("reset the env before snapshotting it")
        layers = tuple(
            {k: _copy_value(v) for k, v in vars(layer).items() if k not in _FIXED}
            for layer in self._layers()
        )
        zmachine = self._tw.unwrapped._jericho.get_state()
        return TextWorldSnapshot(self._task, zmachine, layers, self._steps, self._done, self._score)

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, TextWorldSnapshot)
        if self._tw is None or self._task is None or self._task != state.task:
            self.reset_sync(state.task)  # loads the game and sets up the wrappers
        for layer, fields in zip(self._layers(), state.layers, strict=True):
            for key, value in fields.items():
                setattr(layer, key, _copy_value(value))
        ram, stack, *rest = state.zmachine
        self._tw.unwrapped._jericho.set_state((ram.copy(), stack.copy(), *rest))
        self._steps, self._done, self._score = state.steps, state.done, state.score

    def close_sync(self) -> None:
        if self._tw is not None:
            self._tw.close()
        self._tw, self._loaded = None, None

    async def reset(self, task: int) -> Observation:
        # The first reset of a task may generate its game (seconds), and loading a game
        # may wait for another env's generation: off the event loop.
        return await asyncio.to_thread(self.reset_sync, task)

    async def restore(self, state: Any) -> None:
        if self._tw is None or self._task is None or self._task != getattr(state, "task", None):
            await asyncio.to_thread(self.restore_sync, state)  # it resets first: as reset
        else:
            self.restore_sync(state)

    async def close(self) -> None:
        self.close_sync()


@register("textworld")
def make_textworld(
    challenge: str = "custom",
    world_size: int = 5,
    nb_objects: int = 10,
    quest_length: int = 5,
    settings: dict[str, Any] | None = None,
    seed_offset: int = 0,
    cache_dir: str | None = None,
) -> TextWorldEnv:
    game = GameSettings(
        challenge=challenge,
        world_size=world_size,
        nb_objects=nb_objects,
        quest_length=quest_length,
        settings=tuple(sorted((settings or {}).items())),
        seed_offset=seed_offset,
    )
    return TextWorldEnv(game, cache_dir)


