"""BabyAI grid-world levels (the `minigrid` package) as a text environment.

Task index `i` plays level `levels[i % L]` (level number `i % L + 1`, as AgentGym counts)
with `reset(seed=i // L)`, over the sorted BabyAI env ids (the `*Debug*` variants left
out) or the `levels` env_arg. The agent sees a text rendering of its 7x7 egocentric view:
the mission, every visible object with its position relative to the agent, how far it
can go straight ahead / left / right, what is right in front of it and what it carries.
Actions are minigrid's seven primitives as words.

Snapshots are the pickled unwrapped minigrid env (grid, agent, instructions and their
verifier, step count, `np_random`; 5-10 KB, about twice as fast as a deepcopy), so a
restored env - in this instance or a fresh one - continues exactly as the original.
"""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from thicket.envs import register
from thicket.envs.protocol import Observation, SyncEnv, Transition

if TYPE_CHECKING:
    from minigrid.core.world_object import WorldObj

# minigrid's encoding tables (minigrid.core.constants), fixed here so that importing
# this module does not import minigrid (~1 s); `_minigrid()` checks they still agree.
IDX_TO_OBJECT = ("unseen", "empty", "wall", "floor", "door", "key", "ball", "box", "goal", "lava", "agent")
IDX_TO_COLOR = ("red", "green", "blue", "purple", "yellow", "grey")

ACTIONS = ("turn left", "turn right", "go forward", "pick up", "drop", "toggle", "done")
_ALIASES = {
    "left": "turn left",
    "right": "turn right",
    "forward": "go forward",
    "move forward": "go forward",
    "pickup": "pick up",
    "pick": "pick up",
    "open": "toggle",
}
_DOOR_STATES = ("open", "closed", "locked")

INSTRUCTIONS = """\
BabyAI is a grid world. You are an agent in one or more rooms with objects (keys, balls,
boxes) and doors of several colours, and you are given a mission such as "pick up the
red ball" or "open the blue door". You see a 7x7 area in front of you (not behind you,
not through walls); positions are given relative to you ("2 steps ahead, 1 step left").
Actions (one per turn):
- turn left / turn right    turn 90 degrees in place
- go forward                move one cell ahead (blocked by walls, closed doors, objects)
- pick up                   pick up the object right in front of you (you carry one at most)
- drop                      drop what you carry onto the free cell in front of you
- toggle                    open/close the door in front of you (a locked door needs the key
                            of its colour in your hands), or open the box in front of you
- done                      does nothing
The episode ends with success as soon as the mission is accomplished."""


@functools.cache
def _minigrid() -> None:
    import minigrid  # noqa: F401  (registers the BabyAI ids with gymnasium)
    from minigrid.core import constants

    assert tuple(constants.OBJECT_TO_IDX) == IDX_TO_OBJECT
    assert tuple(constants.COLOR_TO_IDX) == IDX_TO_COLOR
    assert tuple(constants.STATE_TO_IDX) == _DOOR_STATES


@functools.cache
def default_levels() -> tuple[str, ...]:
    _minigrid()
    return tuple(sorted(k for k in gym.registry if k.startswith("BabyAI-") and "Debug" not in k))


@dataclass(frozen=True)
class BabyAISnapshot:
    task: int
    level: str
    game: bytes  # the pickled unwrapped minigrid env
    steps: int
    done: bool


def _name(code: np.ndarray) -> str:
    """'grey key', 'closed red door' from one (object, colour, state) cell code."""
    kind, colour, state = (int(v) for v in code)
    obj = IDX_TO_OBJECT[kind]
    if obj == "door":
        return f"{_DOOR_STATES[state]} {IDX_TO_COLOR[colour]} door"
    if obj in ("goal", "lava", "wall", "floor"):
        return obj
    return f"{IDX_TO_COLOR[colour]} {obj}"


def _a(name: str) -> str:
    return ("an " if name[0] in "aeiou" else "a ") + name


def _thing(obj: WorldObj | None) -> str:
    if obj is None:
        return "nothing"
    if obj.type == "door":
        state = "locked" if obj.is_locked else "open" if obj.is_open else "closed"
        return f"the {state} {obj.color} door"
    if obj.type in ("wall", "goal", "lava"):
        return f"a {obj.type}"
    return f"the {obj.color} {obj.type}"


def _steps(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


def describe_view(image: np.ndarray, mission: str, carrying: WorldObj | None) -> str:
    """Text for minigrid's egocentric view: image[x][y], agent at (size//2, size-1) facing -y."""
    size = image.shape[0]
    ax, ay = size // 2, size - 1
    seen = []
    for x in range(size):
        for y in range(size):
            obj = IDX_TO_OBJECT[int(image[x][y][0])]
            if obj in ("unseen", "empty", "wall", "floor", "agent") or (x, y) == (ax, ay):
                continue
            ahead, side = ay - y, x - ax
            where = []
            if ahead:
                where.append(_steps(ahead, "ahead"))
            if side:
                where.append(_steps(abs(side), "right" if side > 0 else "left"))
            seen.append((ahead + abs(side), ahead, side, f"- {_name(image[x][y])}: {', '.join(where)}"))
    lines = [f"Mission: {mission}."]
    if seen:
        lines.append("You see:")
        lines.extend(text for *_, text in sorted(seen))
    else:
        lines.append("You see no objects.")

    def run(cells: list[tuple[int, int]], label: str) -> str:
        free = 0
        for x, y in cells:
            obj = IDX_TO_OBJECT[int(image[x][y][0])]
            if obj in ("empty", "floor") or (obj == "door" and int(image[x][y][2]) == 0):
                free += 1
                continue
            what = "unseen cells" if obj == "unseen" else _a(_name(image[x][y]))
            return f"{label}: {free} free cell{'s' if free != 1 else ''}, then {what}."
        return f"{label}: {free} free cells, then the edge of your view."

    lines.append(run([(ax, y) for y in range(ay - 1, -1, -1)], "Straight ahead"))
    lines.append(run([(x, ay) for x in range(ax - 1, -1, -1)], "To your left"))
    lines.append(run([(x, ay) for x in range(ax + 1, size)], "To your right"))
    front = image[ax][ay - 1]
    front_obj = IDX_TO_OBJECT[int(front[0])]
    lines.append(
        "In front of you: "
        + ("a free cell." if front_obj in ("empty", "floor") else f"{_a(_name(front))}.")
    )
    lines.append(f"You are carrying {_thing(carrying)}.")
    return "\n".join(lines)


class BabyAIEnv(SyncEnv):
    family = "babyai"
    can_snapshot = True
    deterministic = True  # the levels' randomness is all in reset(seed)

    def __init__(self, levels: list[str] | tuple[str, ...] | None = None) -> None:
        _minigrid()
        self.levels = tuple(levels) if levels else default_levels()
        unknown = [lvl for lvl in self.levels if lvl not in gym.registry]
        if unknown:
            raise ValueError(f"unknown BabyAI levels: {unknown}")
        self._prototypes: dict[str, Any] = {}
        self._game: Any = None
        self._level: str | None = None
        self._task: int | None = None
        self._steps = 0
        self._done = False

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    def level_of(self, task: int) -> tuple[str, int]:
        """(env id, seed) of task `task`."""
        return self.levels[task % len(self.levels)], task // len(self.levels)

    @property
    def game(self) -> Any:
        """The unwrapped minigrid env of the current episode."""
        if self._game is None:
            raise RuntimeError("reset the env before stepping it")
        return self._game

    def reset_sync(self, task: int) -> Observation:
        level, seed = self.level_of(task)
        if level not in self._prototypes:
            self._prototypes[level] = gym.make(level).unwrapped
        self._game = self._prototypes[level]
        with contextlib.redirect_stdout(io.StringIO()):  # "Sampling rejected: ..." chatter
            obs, _ = self._game.reset(seed=seed)
        self._level, self._task, self._steps, self._done = level, task, 0, False
        return self._observation(obs["image"])

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", ()), 0.0, True)
        name = " ".join(action.strip().lower().rstrip(".").split())
        name = _ALIASES.get(name, name)
        game = self.game
        if name not in ACTIONS:
            text = f"Invalid action {action!r}; choose one of: {', '.join(ACTIONS)}."
            return Transition(self._observation(game.gen_obs()["image"], text), 0.0, False)
        front_before = game.grid.get(*game.front_pos)
        front_text = _thing(front_before)  # doors change in place: describe them now
        carrying_before = game.carrying
        pos_before = tuple(int(v) for v in game.agent_pos)
        obs, raw, terminated, truncated, _ = game.step(ACTIONS.index(name))
        self._steps += 1
        success = bool(terminated and raw > 0)
        self._done = bool(terminated or truncated)
        feedback = self._feedback(name, front_before, front_text, carrying_before, pos_before)
        info = {"raw_reward": float(raw), "truncated": bool(truncated), "steps": self._steps}
        if self._done and not success:
            feedback += " The episode is over: " + (
                "the step limit was reached." if truncated and not terminated else "the mission failed."
            )
        observation = self._observation(obs["image"], feedback)
        return Transition(observation, float(success), self._done, success, info)

    def _feedback(
        self,
        name: str,
        front_before: WorldObj | None,
        front_text: str,
        carrying_before: WorldObj | None,
        pos_before: tuple[int, int],
    ) -> str:
        game = self.game
        if name in ("turn left", "turn right"):
            return f"You turn {name.split()[1]}."
        if name == "go forward":
            if tuple(int(v) for v in game.agent_pos) != pos_before:
                return "You move forward."
            return f"You cannot move forward: {front_text} is in the way."
        if name == "pick up":
            if game.carrying is not None and carrying_before is None:
                return f"You pick up {_thing(game.carrying)}."
            if carrying_before is not None:
                return "You cannot pick anything up: your hands are full."
            return f"You cannot pick up {front_text}."
        if name == "drop":
            if carrying_before is not None and game.carrying is None:
                return f"You drop {_thing(carrying_before)}."
            if carrying_before is None:
                return "You are not carrying anything."
            return f"You cannot drop {_thing(carrying_before)} here: {front_text} is in the way."
        if name == "toggle":
            front_after = game.grid.get(*game.front_pos)
            after_text = _thing(front_after)
            if front_before is not None and front_before.type == "box":
                return f"You open the box; in its place is {after_text}."
            if after_text != front_text:
                return f"You toggle {front_text}: it is now {after_text}."
            if front_before is not None and front_before.type == "door":
                return f"Nothing happens: {front_text} stays shut (it needs the {front_before.color} key)."
            return f"Nothing happens: there is {front_text} to toggle."
        return "You do nothing."

    def _observation(self, image: np.ndarray, feedback: str = "") -> Observation:
        game = self.game
        text = describe_view(image, game.mission, game.carrying)
        if feedback:
            text = f"{feedback}\n{text}"
        return Observation(text, () if self._done else ACTIONS)

    def solution(self) -> list[str]:
        """Actions of minigrid's BabyAIBot from the start of the current task (it solves
        every level but KeyInBox and the PutNext*Carrying ones; [] where it fails)."""
        from minigrid.utils.baby_ai_bot import BabyAIBot

        assert self._task is not None, "reset the env first"
        saved = self.snapshot_sync()
        actions: list[str] = []
        try:
            self.reset_sync(self._task)
            bot = BabyAIBot(self.game)
            for _ in range(self.game.max_steps):
                actions.append(ACTIONS[int(bot.replan())])
                t = self.step_sync(actions[-1])
                if t.done:
                    return actions if t.success else []
            return []
        except (AssertionError, IndexError):  # the bot's own dead ends
            return []
        finally:
            self.restore_sync(saved)

    def snapshot_sync(self) -> BabyAISnapshot:
        assert self._task is not None and self._level is not None, "reset before snapshotting"
        game = pickle.dumps(self.game, protocol=pickle.HIGHEST_PROTOCOL)
        return BabyAISnapshot(self._task, self._level, game, self._steps, self._done)

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, BabyAISnapshot)
        self._game = pickle.loads(state.game)
        self._task, self._level = state.task, state.level
        self._steps, self._done = state.steps, state.done


@register("babyai")
def make_babyai(levels: list[str] | None = None) -> BabyAIEnv:
    return BabyAIEnv(levels)
