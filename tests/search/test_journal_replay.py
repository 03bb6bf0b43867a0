"""A tree regrown with the first k proposes of an earlier run served from a journal (what a
checkpoint holds after a kill) is the tree the earlier run grew, for every search and every k,
and the served proposes reach the policy no more. The oracle is the uninterrupted run."""

from __future__ import annotations

import pytest

from thicket.envs import make_env
from thicket.policy.base import Reply
from thicket.policy.uniform import UniformPolicy
from thicket.search import ALGORITHMS, grow
from thicket.search.expand import Expander

SEARCHES = {
    "mcts": {"iterations": 10, "expansions": 3},
    "mcts_pw": {"iterations": 30},
    "tot": {"branching": 2, "beam": 3},
    "dense": {"width": 3, "run_budget": 12, "target_pairs": 1000},
    "sample": {"samples": 6},
}


class Journal:
    """In memory: records every propose, serves the first `keep` recorded ones."""

    def __init__(self, recorded: list[tuple[str, list[Reply]]] | None = None) -> None:
        self.recorded: list[tuple[str, list[Reply]]] = []
        self.served: dict[str, list[list[Reply]]] = {}
        for key, replies in recorded or []:
            self.served.setdefault(key, []).append(replies)

    def take(self, key: str) -> list[Reply] | None:
        queue = self.served.get(key)
        return queue.pop(0) if queue else None

    async def record(self, key: str, replies: list[Reply]) -> None:
        self.recorded.append((key, replies))


class CountingPolicy(UniformPolicy):
    def __init__(self) -> None:
        super().__init__(latency_s=0.001)
        self.calls = 0

    async def propose(self, messages, n, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += n
        return await super().propose(messages, n, **kwargs)


async def grown(algorithm: str, journal: Journal, policy: CountingPolicy) -> Expander:
    params = ALGORITHMS[algorithm].params(**SEARCHES[algorithm], max_depth=8)
    expander = await Expander.open(make_env("frozenlake", size=4), 3, policy, 11, max_depth=params.max_depth,
                                   max_nodes=params.max_nodes, dedupe=params.dedupe, journal=journal)
    await grow(expander, params)
    return expander


def shape(expander: Expander) -> list[tuple]:
    return [(n.key, n.stop, n.visits, round(n.value, 9), n.reply.text if n.reply else "", n.llm_calls)
            for n in expander.tree.freeze()]


@pytest.mark.parametrize("algorithm", list(SEARCHES))
async def test_every_prefix_of_a_journal_regrows_the_same_tree(algorithm):
    full = Journal()
    whole = await grown(algorithm, full, CountingPolicy())
    proposes = len(full.recorded)
    assert proposes >= 6
    for keep in sorted({1, 2, proposes // 3, proposes // 2, proposes - 1, proposes}):
        policy = CountingPolicy()
        resumed = await grown(algorithm, Journal(full.recorded[:keep]), policy)
        assert shape(resumed) == shape(whole), f"{algorithm}: {keep} of {proposes} proposes served"
        served = sum(len(replies) for _, replies in full.recorded[:keep])
        assert resumed.resumed_calls == served
        assert policy.calls == resumed.llm_calls - served  # the served ones were not asked again
        assert resumed.resumed_nodes == sum(n.resumed for n in resumed.tree.nodes()) > 0
