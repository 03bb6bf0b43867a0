"""Tree-of-Thoughts rollouts: at each node sample thoughts, then an action per
thought (each thought and its action in one sample: one propose of `branching` samples,
the action sampled after its thought as in two requests, with no re-tokenized thought
between them); breadth-first to the depth limit, keeping at most `beam` open nodes per
level, those an evaluator values most (ToT's breadth-first search with a state
evaluator). `beam_score` names the evaluator:
  progress: the env's own progress, the path's return so far (a running score, or the
    rewards earned); ties (on sparse-reward envs, every open node scores 0 until the
    end) are broken by a seeded random choice;
  rollout: a value from a simulation, as LATS values a new node: each open node with no
    ended path below it gets one sampled trajectory from it down to a terminal node (one LLM
    call a step, kept in the tree), and scores the mean of the evaluated leaves below it
    (the tree's own values); a node no simulation ended scores its progress. Ties are
    broken by a seeded random choice;
  random: a seeded random choice, no evaluator.
Pruned nodes stop as PRUNED. Node values are the mean of their children's."""

from __future__ import annotations

import asyncio
import random
from typing import Literal

from pydantic import Field

from thicket.search.expand import Expander, close_open_leaves
from thicket.search.params import SearchParams
from thicket.search.tree import Node, StopReason, average_values


class ToTParams(SearchParams):
    algorithm: Literal["tot"] = "tot"
    branching: int = Field(3, ge=1, le=64, description="thoughts sampled per node")
    beam: int | None = Field(None, ge=1, description="open nodes kept per level (None: all)")
    beam_score: Literal["progress", "rollout", "random"] = Field(
        "progress", description="which open nodes the beam keeps: the most progress (path return so far), the "
        "best value from one simulated trajectory each (LATS-style, one LLM call a step), or random")


async def run(expander: Expander, params: ToTParams) -> None:
    rng = random.Random(expander.seed_for(expander.tree.root, "tot"))
    frontier = [expander.tree.root]
    while frontier and not expander.over_budget():
        await asyncio.gather(*(expander.expand(node, params.branching, temperature=params.temperature)
                               for node in frontier))
        frontier = [c for node in frontier for c in node.children if not c.terminal]
        if params.beam is not None and len(frontier) > params.beam:
            if params.beam_score == "rollout":
                await simulate(expander, frontier, params)
            frontier = keep_beam(frontier, params, rng)
    close_open_leaves(expander.tree, StopReason.BUDGET)
    average_values(expander.tree.root)


async def simulate(expander: Expander, frontier: list[Node], params: ToTParams) -> None:
    """One trajectory from each open node with no evaluated leaf below it, down to a terminal
    node. Together where the budgets pay for every one to its end; else one after another in
    frontier order, so which one the budget cuts does not depend on the server's timing."""
    fresh = [node for node in frontier if simulated_value(node) is None]
    longest = sum(expander.max_depth - node.depth for node in fresh)
    if expander.affordable() >= longest:
        await asyncio.gather(*(rollout(expander, node, params) for node in fresh))
        return
    for node in fresh:
        await rollout(expander, node, params)


async def rollout(expander: Expander, node: Node, params: ToTParams) -> None:
    while not node.terminal and not expander.over_budget():
        children = await expander.expand(node, 1, temperature=params.temperature, salt="rollout")
        if not children:
            return
        node = children[0]


def simulated_value(node: Node) -> float | None:
    """The mean over the evaluated leaves below `node` (the tree's own values), None if none ended."""
    average_values(node)
    return node.value if node.visits else None


def beam_value(node: Node, params: ToTParams) -> float:
    if params.beam_score == "rollout" and (value := simulated_value(node)) is not None:
        return value
    return node.path_return


def keep_beam(frontier: list[Node], params: ToTParams, rng: random.Random) -> list[Node]:
    """The `beam` best open nodes by `beam_score` (in frontier order); the others are pruned."""
    order = list(range(len(frontier)))
    rng.shuffle(order)  # the tie-break (and, for random, the choice)
    if params.beam_score != "random":
        values = [beam_value(node, params) for node in frontier]
        order.sort(key=lambda i: -values[i])  # stable: ties keep their shuffled order
    kept = set(order[: params.beam])
    for i, node in enumerate(frontier):
        if i not in kept and not node.children:  # one a simulation went through stays an inner node
            node.close(StopReason.PRUNED)
    return [node for i, node in enumerate(frontier) if i in kept]
