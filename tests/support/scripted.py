"""Narrow in-process fakes for unit tests of search semantics only (a word env and scripted
policies), and trees grown on them."""

from __future__ import annotations

import random

from thicket.envs.protocol import Observation, RewardSemantics, SyncEnv, Transition
from thicket.policy import prompts
from thicket.policy.base import Messages, Policy, Reply
from thicket.search import grow
from thicket.search.expand import Expander
from thicket.search.mcts import MCTSParams
from thicket.shards.table import TreeMeta


class WordEnv(SyncEnv):
    """Spell a word of `length` letters from `letters`; success iff it is `target`.
    Spelling `bomb` (if set) is a disaster: reward -1."""

    family = "word"
    can_snapshot = True

    def __init__(self, target: str = "aba", letters: str = "ab", bomb: str | None = None) -> None:
        self.target, self.letters, self.bomb = target, letters, bomb
        self.word = ""
        self.steps = 0

    @property
    def instructions(self) -> str:
        return "Spell the word."

    def _obs(self) -> Observation:
        return Observation(f"word so far: {self.word!r}", tuple(self.letters))

    def reset_sync(self, task: int) -> Observation:
        self.word = ""
        return self._obs()

    def step_sync(self, action: str) -> Transition:
        self.steps += 1
        self.word += action
        if self.bomb is not None and self.word == self.bomb:
            return Transition(self._obs(), -1.0, True)
        done = len(self.word) >= len(self.target)
        success = done and self.word == self.target
        return Transition(self._obs(), 1.0 if success else 0.0, done, success)

    def snapshot_sync(self) -> str:
        return self.word

    def restore_sync(self, state: str) -> None:
        self.word = state


class ReplayOnlyWordEnv(WordEnv):
    can_snapshot = False


class RunningWordEnv(WordEnv):
    """WordEnv with a running score, as ScienceWorld's and TextWorld's: every step's reward is the
    share of `target` spelled correctly so far (its common prefix), 1.0 when it is spelled."""

    reward_semantics = RewardSemantics.RUNNING

    def step_sync(self, action: str) -> Transition:
        self.steps += 1
        self.word += action
        matched = next((i for i, (a, b) in enumerate(zip(self.word, self.target)) if a != b), min(len(self.word), len(self.target)))
        done = len(self.word) >= len(self.target)
        success = self.word == self.target
        return Transition(self._obs(), matched / len(self.target), done, success)


class FaultyWordEnv(WordEnv):
    """WordEnv whose simulator raises on `broken` (the env's fault, not the policy's)."""

    def __init__(self, broken: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.broken = broken

    def step_sync(self, action: str) -> Transition:
        if self.word + action == self.broken:
            raise RuntimeError("the simulator crashed")
        return super().step_sync(action)


def reply(thought: str, action: str, seed: int = 0) -> Reply:
    return Reply(text=prompts.turn(thought, action), thought=thought, action=action, seed=seed)


class CyclingPolicy(Policy):
    """Sample i of a request takes valid action i (mod the number of actions)."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, int]] = []  # (history length, n)

    async def propose(self, messages: Messages, n: int, *, valid_actions, seed: int, temperature=None) -> list[Reply]:
        self.requests.append((len(messages), n))
        assert valid_actions
        return [reply(f"option {i}", valid_actions[i % len(valid_actions)], seed + i) for i in range(n)]

    async def act(self, messages: Messages, thought: Reply, *, valid_actions, seed: int, temperature=None) -> Reply:
        raise AssertionError("propose's replies are whole turns: act() is not needed")


class RepeatingPolicy(CyclingPolicy):
    """Every sample is the same reply: dedupe must keep one."""

    async def propose(self, messages: Messages, n: int, *, valid_actions, seed: int, temperature=None) -> list[Reply]:
        return [reply("same", valid_actions[0], seed) for _ in range(n)]


class SeededPolicy(CyclingPolicy):
    """Sample i of a request takes the valid action its seed (seed + i) picks at random."""

    async def propose(self, messages: Messages, n: int, *, valid_actions, seed: int, temperature=None) -> list[Reply]:
        self.requests.append((len(messages), n))
        picks = [random.Random(seed + i).choice(valid_actions) for i in range(n)]
        return [reply(f"pick {a}", a, seed + i) for i, a in enumerate(picks)]


class TemperaturePolicy(CyclingPolicy):
    """Greedy (T=0) takes the first valid action, any sampling temperature the second."""

    async def propose(self, messages: Messages, n: int, *, valid_actions, seed: int, temperature=None) -> list[Reply]:
        action = valid_actions[0] if temperature == 0.0 else valid_actions[1]
        return [reply(f"at T={temperature}", action, seed + i) for i in range(n)]


# -- trees grown on them ----------------------------------------------------------


async def grown(params, env=None, policy=None, seed=0) -> Expander:
    x = await Expander.open(
        env or WordEnv(),
        0,
        policy or CyclingPolicy(),
        seed,
        max_depth=params.max_depth,
        max_nodes=params.max_nodes,
        dedupe=params.dedupe,
        max_llm_calls=params.max_llm_calls,
    )
    await grow(x, params)
    return x


META = TreeMeta(sweep="s", env="word", algorithm="mcts", model="m", seed=0)


async def small_tree(task: int = 0):
    x = await Expander.open(WordEnv(), task, CyclingPolicy(), 0, max_depth=10, max_nodes=100)
    await grow(x, MCTSParams(iterations=50, expansions=2, max_depth=10))
    return x.tree
