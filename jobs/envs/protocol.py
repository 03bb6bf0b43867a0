"""The one environment protocol every search algorithm talks to.

An env is reset to a task index, stepped with text actions, and (where it can)
snapshotted and restored so a tree can branch without replaying its prefix.
Envs that cannot snapshot are branched by reset + replay of the action prefix
(see `thicket.search.cursor`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar


@dataclass(frozen=True)
class Observation:
    text: str
    # The actions the env accepts now, or None when the env has no finite list.
    valid_actions: tuple[str, ...] | None = None


class RewardSemantics(StrEnum):
    """What a step's `reward` means, declared by each env family.

    INCREMENT: the score this step earned; a path's return is the sum along it.
    RUNNING: the episode's score so far (ScienceWorld's and TextWorld's running score); a
    path's return is its last step's reward, never a sum."""

    INCREMENT = "increment"
    RUNNING = "running"

    def path_return(self, parent_return: float, reward: float) -> float:
        """The return of a path that extends a path of return `parent_return` by a step
        of `reward`: the one definition every consumer of returns uses."""
        return reward if self is RewardSemantics.RUNNING else parent_return + reward


@dataclass(frozen=True)
class Transition:
    observation: Observation
    # The step's reward, normalised to [-1, 1] (1 = task solved), read by the family's
    # RewardSemantics. A negative score marks a disaster (the env broke or the agent did harm).
    reward: float
    done: bool
    success: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class ActionFailed(Exception):
    """The env refused or failed one action (an error answer, an exception in env code).
    The episode's state after it is unknown; the search records the action as an error leaf."""


class Env(ABC):
    """An async text environment holding one episode at a time."""

    family: ClassVar[str]
    can_snapshot: ClassVar[bool] = False
    reward_semantics: ClassVar[RewardSemantics] = RewardSemantics.INCREMENT
    # Where the tasks come from, for families that play other data than one fixed set of their own
    # (WebShop's files or a generated catalogue...): the dataset card says it. None: the family's own.
    data_source: str | None = None
    # Whether a state and an action fix the next state, reward and observation (no slippery ice, no
    # sampled outcomes): two replies with the same action then reach the same state. False: stochastic,
    # or not declared. Instances may set it from their args (FrozenLake's is_slippery).
    deterministic: bool = False

    @property
    @abstractmethod
    def instructions(self) -> str:
        """What the agent is told about this env family (goes into the system prompt)."""

    @abstractmethod
    async def reset(self, task: int) -> Observation:
        """Start the episode of task `task` (deterministic for a given index)."""

    @abstractmethod
    async def step(self, action: str) -> Transition: ...

    async def snapshot(self) -> Any:
        raise NotImplementedError(f"{self.family} cannot snapshot; branch by replay")

    async def restore(self, state: Any) -> None:
        raise NotImplementedError(f"{self.family} cannot restore; branch by replay")

    async def close(self) -> None:
        return None


class SyncEnv(Env):
    """Base for in-process envs: fast, CPU-bound steps run inline on the event loop."""

    @abstractmethod
    def reset_sync(self, task: int) -> Observation: ...

    @abstractmethod
    def step_sync(self, action: str) -> Transition: ...

    def snapshot_sync(self) -> Any:
        raise NotImplementedError(f"{self.family} cannot snapshot")

    def restore_sync(self, state: Any) -> None:
        raise NotImplementedError(f"{self.family} cannot restore")

    async def reset(self, task: int) -> Observation:
        return self.reset_sync(task)

    async def step(self, action: str) -> Transition:
        try:
            return self.step_sync(action)
        except Exception as err:
            raise ActionFailed(f"{self.family} raised {type(err).__name__}: {err}") from err

    async def snapshot(self) -> Any:
        return self.snapshot_sync()

    async def restore(self, state: Any) -> None:
        self.restore_sync(state)
