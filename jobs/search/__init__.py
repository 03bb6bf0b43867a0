"""Search algorithms: name -> (parameters model, coroutine growing one tree)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field

from thicket.search import dense, mcts, mcts_pw, sample, tot
from thicket.search.expand import Expander, close_open_leaves
from thicket.search.params import SearchParams
from thicket.search.tree import StopReason, average_values


@dataclass(frozen=True)
class Algorithm:
    params: type[SearchParams]
    run: Callable[[Expander, Any], Awaitable[None]]
    averages: bool  # node value = mean of children's (else MCTS's sum / visits)


ALGORITHMS: dict[str, Algorithm] = {
    "tot": Algorithm(tot.ToTParams, tot.run, averages=True),
    "mcts": Algorithm(mcts.MCTSParams, mcts.run, averages=False),
    "mcts_pw": Algorithm(mcts_pw.MCTSPWParams, mcts_pw.run, averages=False),
    "dense": Algorithm(dense.DenseParams, dense.run, averages=True),
    "sample": Algorithm(sample.SampleParams, sample.run, averages=True),
}

AnySearch = Annotated[
    tot.ToTParams | mcts.MCTSParams | mcts_pw.MCTSPWParams | dense.DenseParams | sample.SampleParams,
    Field(discriminator="algorithm"),
]


async def grow(expander: Expander, params: SearchParams) -> None:
    await ALGORITHMS[params.algorithm].run(expander, params)  # type: ignore[attr-defined]


def settle(expander: Expander, params: SearchParams, stop: StopReason) -> None:
    """After an interrupted search: close what is open with `stop`, recompute values."""
    close_open_leaves(expander.tree, stop)
    if ALGORITHMS[params.algorithm].averages:  # type: ignore[attr-defined]
        average_values(expander.tree.root)
