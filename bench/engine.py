"""Engine overhead: tree nodes per second with a zero-latency policy on FrozenLake.

Prints nodes/s for the search alone and for search + shard building, on one core
(one event loop). Goal: >= 25,000 nodes/s per core, for every algorithm. Before any timing, each
task's env is reset once: gymnasium's import and each task's map (cached for the process) would
otherwise land on whichever algorithm runs first.
    .venv/bin/python bench/engine.py [--trees 200] [--algorithm mcts]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from thicket.envs import make_env
from thicket.policy.uniform import UniformPolicy
from thicket.search import ALGORITHMS, grow
from thicket.search.expand import Expander
from thicket.shards.table import TreeMeta, tree_table

PARAMS = {
    "mcts": {"iterations": 30, "expansions": 4},
    "mcts_pw": {"iterations": 64},
    "tot": {"branching": 3, "beam": 8},
    "dense": {"width": 3, "run_budget": 40, "target_pairs": 1000},
    "sample": {"samples": 16},
}


async def grow_trees(algorithm: str, trees: int, shards: bool) -> tuple[int, float, float]:
    """(nodes, seconds, seconds spent inside env steps)"""
    params = ALGORITHMS[algorithm].params(**PARAMS[algorithm], max_depth=20)
    policy = UniformPolicy()
    nodes, env_ms = 0, 0.0
    started = time.perf_counter()
    for task in range(trees):
        env = make_env("frozenlake", size=8, is_slippery=True)
        x = await Expander.open(env, task, policy, 0, max_depth=params.max_depth, max_nodes=params.max_nodes, dedupe=params.dedupe)
        await grow(x, params)
        nodes += x.tree.size
        env_ms += sum(n.env_ms for n in x.tree.nodes())
        if shards:
            tree_table(x.tree, TreeMeta("bench", "frozenlake", algorithm, "uniform", 0))
    return nodes, time.perf_counter() - started, env_ms / 1000


async def warm_up(trees: int) -> None:
    for task in range(trees):
        await make_env("frozenlake", size=8, is_slippery=True).reset(task)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--algorithm", default="all", choices=["all", *PARAMS])
    args = parser.parse_args()
    algorithms = list(PARAMS) if args.algorithm == "all" else [args.algorithm]
    asyncio.run(warm_up(args.trees))
    print("FrozenLake 8x8 slippery, uniform policy with zero latency, one core")
    print(f"{'algorithm':10} {'nodes':>8} {'nodes/s':>9} {'+shards':>9} {'env share':>10} {'engine-only nodes/s':>20}")
    for algorithm in algorithms:
        nodes, seconds, env_s = asyncio.run(grow_trees(algorithm, args.trees, shards=False))
        nodes2, seconds2, _ = asyncio.run(grow_trees(algorithm, args.trees, shards=True))
        print(
            f"{algorithm:10} {nodes:8d} {nodes / seconds:9,.0f} {nodes2 / seconds2:9,.0f} "
            f"{env_s / seconds:10.0%} {nodes / (seconds - env_s):20,.0f}"
        )


if __name__ == "__main__":
    main()
