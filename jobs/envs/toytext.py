"""Gymnasium toy-text games (FrozenLake, CliffWalking, Taxi) as text environments.

Task index `i` is the episode gymnasium produces after `reset(seed=i)` (FrozenLake also
draws its map with `generate_random_map(size, seed=i)`). Snapshots copy the complete
dynamic state, including the generator that slippery or rainy transitions sample from,
so a restored env replays exactly what the original would have done.
"""

from __future__ import annotations

import functools
from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium.envs.toy_text.frozen_lake import generate_random_map
from gymnasium.wrappers import TimeLimit

from thicket.envs import register
from thicket.envs.protocol import Observation, SyncEnv, Transition

_STOPS = ("Red", "Green", "Yellow", "Blue")  # Taxi's locs, in index order


@dataclass(frozen=True)
class ToyTextSnapshot:
    task: int
    s: int
    lastaction: int | None
    rng_state: dict[str, Any]
    elapsed_steps: int | None  # None when the game has no time limit
    steps: int
    done: bool
    last_raw_reward: float
    extra: tuple[Any, ...]  # game-specific fields, see ToyTextEnv.extra_fields


def _where(row: int, col: int) -> str:
    return f"row {row}, column {col}"


def _find_time_limit(env: gym.Env[Any, Any]) -> TimeLimit[Any, Any] | None:
    while isinstance(env, gym.Wrapper):
        if isinstance(env, TimeLimit):
            return env
        env = env.env
    return None


class ToyTextEnv(SyncEnv):
    """One gymnasium toy-text game; subclasses name the game, its actions and its text."""

    gym_id: ClassVar[str]
    action_names: ClassVar[tuple[str, ...]]  # indexed by gymnasium's action number
    extra_fields: ClassVar[tuple[str, ...]] = ()  # further state on the unwrapped env

    def __init__(self, **make_kwargs: Any) -> None:
        self._make_kwargs = make_kwargs
        self._gym: gym.Env[Any, Any] | None = None
        self._game: Any = None  # the unwrapped env, cached
        self._gym_key: Any = None
        self._limit: TimeLimit[Any, Any] | None = None
        self._task: int | None = None
        self._done = False
        self._steps = 0
        self._last_raw_reward = 0.0

    # --- game-specific hooks ---

    def gym_key(self, task: int) -> Any:
        """What the gym env is built from beyond the constructor args (FrozenLake's map)."""
        return None

    def make_args(self, key: Any) -> dict[str, Any]:
        return {}

    @abstractmethod
    def describe(self) -> str:
        """The board and one sentence on where things stand."""

    @abstractmethod
    def is_success(self, raw_reward: float, terminated: bool) -> bool: ...

    # --- protocol ---

    def reset_sync(self, task: int) -> Observation:
        self._ensure_gym(task)
        self._env.reset(seed=task)
        self._task, self._done, self._steps, self._last_raw_reward = task, False, 0, 0.0
        return self._observation(self.describe())

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", ()), 0.0, True)
        name = action.strip().lower()
        if name not in self.action_names:
            text = f"Invalid action {action!r}; choose one of: {', '.join(self.action_names)}."
            return Transition(self._observation(f"{text}\n{self.describe()}"), 0.0, False)
        _, raw, terminated, truncated, _ = self._env.step(self.action_names.index(name))
        self._last_raw_reward = float(raw)
        self._steps += 1
        success = self.is_success(float(raw), terminated)
        self._done = terminated or truncated
        info = {"raw_reward": float(raw), "truncated": truncated, "steps": self._steps}
        observation = self._observation(self.describe())
        return Transition(observation, float(success), self._done, success, info)

    def snapshot_sync(self) -> ToyTextSnapshot:
        game, limit = self.game, self._limit
        assert self._task is not None, "reset the env before snapshotting it"
        return ToyTextSnapshot(
            task=self._task,
            s=int(game.s),
            lastaction=None if game.lastaction is None else int(game.lastaction),
            rng_state=game.np_random.bit_generator.state,
            elapsed_steps=None if limit is None else limit._elapsed_steps,
            steps=self._steps,
            done=self._done,
            last_raw_reward=self._last_raw_reward,
            extra=tuple(getattr(game, f) for f in self.extra_fields),
        )

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, ToyTextSnapshot)
        if self._ensure_gym(state.task):
            self._env.reset(seed=state.task)  # satisfies gymnasium's reset-before-step check
        game = self.game
        game.s, game.lastaction = state.s, state.lastaction
        game.np_random.bit_generator.state = state.rng_state
        for name, value in zip(self.extra_fields, state.extra, strict=True):
            setattr(game, name, value)
        if self._limit is not None:
            self._limit._elapsed_steps = state.elapsed_steps
        self._task, self._done, self._steps = state.task, state.done, state.steps
        self._last_raw_reward = state.last_raw_reward

    # --- plumbing ---

    @property
    def _env(self) -> gym.Env[Any, Any]:
        if self._gym is None:
            raise RuntimeError("reset the env before stepping it")
        return self._gym

    @property
    def game(self) -> Any:
        """The unwrapped gymnasium env (its state is what snapshots capture)."""
        if self._game is None:
            self._game = self._env.unwrapped
        return self._game

    def _ensure_gym(self, task: int) -> bool:
        """Build the gym env this task needs unless it is already there; True if built."""
        key = self.gym_key(task)
        if self._gym is not None and key == self._gym_key:
            return False
        kwargs = self._make_kwargs | self.make_args(key)
        self._gym = gym.make(self.gym_id, disable_env_checker=True, **kwargs)
        self._gym_key, self._limit = key, _find_time_limit(self._gym)
        self._game = None
        return True

    def _observation(self, text: str) -> Observation:
        return Observation(text, () if self._done else self.action_names)


# --- FrozenLake ---------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def frozenlake_map(size: int, task: int) -> tuple[str, ...]:
    return tuple(generate_random_map(size=size, seed=task))


@functools.lru_cache(maxsize=4096)
def frozenlake_goal(size: int, task: int) -> tuple[int, int]:
    grid = frozenlake_map(size, task)
    return next((r, line.index("G")) for r, line in enumerate(grid) if "G" in line)


class FrozenLakeText(ToyTextEnv):
    family = "frozenlake"
    can_snapshot = True
    gym_id = "FrozenLake-v1"
    action_names = ("left", "down", "right", "up")

    def __init__(self, size: int = 4, is_slippery: bool = False) -> None:
        # gymnasium registers a 100-step limit for its 4x4 lake and 200 for 8x8.
        limit = 100 if size <= 4 else 200
        super().__init__(is_slippery=is_slippery, max_episode_steps=limit)
        self.size = size
        self.is_slippery = is_slippery
        self.deterministic = not is_slippery

    @property
    def instructions(self) -> str:
        slip = (
            " The ice is slippery: a move may instead go to either side of the intended direction."
            if self.is_slippery
            else ""
        )
        return (
            "FrozenLake: walk across a frozen lake from the start S to the goal G without "
            "falling into a hole H. Row 0 is the top row, column 0 the left column. "
            f"Actions: {', '.join(self.action_names)} (one square per move).{slip} "
            "Falling into a hole ends the episode in failure."
        )

    def gym_key(self, task: int) -> tuple[str, ...]:
        return frozenlake_map(self.size, task)

    def make_args(self, key: Any) -> dict[str, Any]:
        return {"desc": list(key)}

    def describe(self) -> str:
        grid = frozenlake_map(self.size, self._task) if self._task is not None else ()
        ncol = len(grid[0])
        row, col = divmod(int(self.game.s), ncol)
        tile = grid[row][col]
        board = "\n".join(line if r != row else line[:col] + "X" + line[col + 1 :] for r, line in enumerate(grid))
        if tile == "H":
            where = f"You fell into the hole at {_where(row, col)}."
        elif tile == "G":
            where = f"You reached the goal at {_where(row, col)}."
        else:
            where = f"You are at {_where(row, col)}; the goal is at {_where(*frozenlake_goal(self.size, self._task))}."
        return f"Map (S start, F frozen ice, H hole, G goal, X you):\n{board}\n{where}"

    def is_success(self, raw_reward: float, terminated: bool) -> bool:
        grid = frozenlake_map(self.size, self._task)
        row, col = divmod(int(self.game.s), len(grid[0]))
        return terminated and grid[row][col] == "G"


# --- CliffWalking -------------------------------------------------------------------


class CliffWalkingText(ToyTextEnv):
    family = "cliffwalking"
    can_snapshot = True
    gym_id = "CliffWalking-v1"
    action_names = ("up", "right", "down", "left")

    def __init__(self, is_slippery: bool = False) -> None:
        # gymnasium registers CliffWalking-v1 without a time limit; search bounds depth.
        super().__init__(is_slippery=is_slippery)
        self.is_slippery = is_slippery
        self.deterministic = not is_slippery

    @property
    def instructions(self) -> str:
        slip = (
            " The ground is slippery: a move may instead go to either side of the intended "
            "direction."
            if self.is_slippery
            else ""
        )
        return (
            "CliffWalking: walk on a 4x12 grid from the start S (bottom left) to the goal G "
            "(bottom right). The cells C between them are a cliff: stepping onto one sends you "
            "back to the start. Row 0 is the top row, column 0 the left column. "
            f"Actions: {', '.join(self.action_names)} (one square per move).{slip}"
        )

    def describe(self) -> str:
        game = self.game
        nrow, ncol = game.shape
        grid = [["." for _ in range(ncol)] for _ in range(nrow)]
        for row, col in zip(*np.nonzero(game._cliff), strict=True):
            grid[row][col] = "C"
        grid[nrow - 1][0], grid[nrow - 1][ncol - 1] = "S", "G"
        row, col = divmod(int(game.s), ncol)
        grid[row][col] = "X"
        if (row, col) == (nrow - 1, ncol - 1):
            where = f"You reached the goal at {_where(row, col)}."
        else:
            where = f"You are at {_where(row, col)}; the goal is at {_where(nrow - 1, ncol - 1)}."
            if self._last_raw_reward <= -100:
                where = f"You fell off the cliff and are back at the start. {where}"
        board = "\n".join("".join(line) for line in grid)
        return f"Map (S start, G goal, C cliff, . ground, X you):\n{board}\n{where}"

    def is_success(self, raw_reward: float, terminated: bool) -> bool:
        return terminated


# --- Taxi ---------------------------------------------------------------------------


class TaxiText(ToyTextEnv):
    family = "taxi"
    can_snapshot = True
    gym_id = "Taxi-v4"
    action_names = ("south", "north", "east", "west", "pickup", "dropoff")
    extra_fields = ("fickle_step", "taxi_orientation")

    def __init__(self, is_rainy: bool = False, fickle_passenger: bool = False) -> None:
        super().__init__(is_rainy=is_rainy, fickle_passenger=fickle_passenger)
        self.is_rainy = is_rainy
        self.fickle_passenger = fickle_passenger
        self.deterministic = not (is_rainy or fickle_passenger)

    @property
    def instructions(self) -> str:
        extras = []
        if self.is_rainy:
            extras.append("It is raining: a move sometimes drifts sideways instead.")
        if self.fickle_passenger:
            extras.append("The passenger may change their destination once after the ride starts.")
        return (
            "Taxi: drive a taxi on a 5x5 grid, pick up the passenger at their stop and drop "
            "them off at their destination. The four stops are R (Red), G (Green), Y (Yellow) "
            "and B (Blue); | marks a wall that blocks east/west moves. Row 0 is the top row "
            "(north), column 0 the left column (west). "
            f"Actions: {', '.join(self.action_names)}. Picking up or dropping off in the wrong "
            "place is penalised; the episode ends with success at the right drop-off. "
            + " ".join(extras)
        ).rstrip()

    def describe(self) -> str:
        game = self.game
        taxi_row, taxi_col, passenger, destination = game.decode(int(game.s))
        grid = [[c.decode() for c in line] for line in game.desc.tolist()]
        grid[1 + taxi_row][2 * taxi_col + 1] = "T"
        board = "\n".join("".join(line) for line in grid)
        goal = self._stop(destination)
        if passenger == 4:
            rider = f"The passenger is in the taxi and wants to go to {goal}."
        elif passenger == destination:
            rider = f"The passenger has arrived at {goal}."
        else:
            rider = f"The passenger waits at {self._stop(passenger)} and wants to go to {goal}."
        taxi = f"The taxi T is at {_where(taxi_row, taxi_col)}."
        if self._last_raw_reward <= -10:
            taxi = f"That {self.action_names[game.lastaction]} was not possible here. {taxi}"
        return f"Map (R, G, Y, B stops; | wall; T taxi):\n{board}\n{taxi} {rider}"

    def _stop(self, index: int) -> str:
        return f"{_STOPS[index]} ({_where(*self.game.locs[index])})"

    def is_success(self, raw_reward: float, terminated: bool) -> bool:
        return terminated


@register("frozenlake")
def make_frozenlake(size: int = 4, is_slippery: bool = False) -> FrozenLakeText:
    return FrozenLakeText(size=size, is_slippery=is_slippery)


@register("cliffwalking")
def make_cliffwalking(is_slippery: bool = False) -> CliffWalkingText:
    return CliffWalkingText(is_slippery=is_slippery)


@register("taxi")
def make_taxi(is_rainy: bool = False, fickle_passenger: bool = False) -> TaxiText:
    return TaxiText(is_rainy=is_rainy, fickle_passenger=fickle_passenger)
