"""Fingerprints of the trees each search grows: a check that a speedup changed no tree.

Grows `--trees` trees per algorithm (as bench/engine.py does, plus other suites that reach
budgets and other envs) and prints one sha256 per (suite, algorithm) over:
  - every node in canonical order (tree.freeze()): key, depth, stop, visits, value,
    value_sum, reward, path_return, done, success, label, llm_calls, llm_tokens,
    observation, reply text / seed / temperature;
  - the order nodes were created in (their keys);
  - every policy call: its messages, n, valid actions, seed and temperature;
  - the expander's counters and the guard's faults.
Run it before and after a change: every line must be the same.
    .venv/bin/python bench/tree_fingerprint.py [--trees 30]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from typing import Any

from thicket.envs import make_env
from thicket.policy.uniform import UniformPolicy
from thicket.search import ALGORITHMS, grow
from thicket.search.expand import Expander
from thicket.search.tree import Node, Tree

ALGORITHM_NAMES = ("mcts", "mcts_pw", "tot", "dense", "sample")
BENCH = {  # bench/engine.py's, with mcts_pw's defaults
    "mcts": {"iterations": 30, "expansions": 4},
    "mcts_pw": {},
    "tot": {"branching": 3, "beam": 8},
    "dense": {"width": 3, "run_budget": 40, "target_pairs": 1000},
    "sample": {"samples": 16},
}
SMALL = {  # tight node budgets and few pairs: the early stops
    "mcts": {"iterations": 50, "expansions": 3, "max_nodes": 40},
    "mcts_pw": {"iterations": 80, "max_nodes": 50},
    "tot": {"branching": 4, "max_nodes": 45},
    "dense": {"width": 4, "run_budget": 100, "target_pairs": 6, "max_nodes": 70},
    "sample": {"samples": 8, "max_nodes": 30, "dedupe": True},
}
SUITES: dict[str, tuple[str, dict[str, Any], dict[str, dict[str, Any]], int]] = {
    # name: (env, env args, params per algorithm, max_depth)
    "frozenlake8": ("frozenlake", {"size": 8, "is_slippery": True}, BENCH, 20),
    "frozenlake4-small": ("frozenlake", {"size": 4, "is_slippery": False}, SMALL, 8),
    "taxi": ("taxi", {"is_rainy": True}, BENCH, 12),
}


class RecordingPolicy(UniformPolicy):
    """The uniform policy, hashing every call it gets."""

    def __init__(self, digest: Any) -> None:
        super().__init__()
        self.digest = digest

    async def propose(self, messages, n, *, valid_actions, seed, temperature=None):
        self.digest.update(json.dumps(["propose", messages, n, valid_actions, seed, temperature]).encode())
        return await super().propose(messages, n, valid_actions=valid_actions, seed=seed, temperature=temperature)


def record_creation_order() -> None:
    """Wrap Tree.add_child so each tree keeps the keys of its nodes in creation order."""
    add_child = Tree.add_child

    def recording(self: Tree, parent: Node, *args: Any, **kwargs: Any) -> Node:
        child = add_child(self, parent, *args, **kwargs)
        self.__dict__.setdefault("created", []).append(child.key)
        return child

    Tree.add_child = recording  # type: ignore[method-assign]


def node_row(node: Node) -> list[Any]:
    reply = node.reply
    return [
        list(node.key), node.depth, str(node.stop), node.visits, repr(node.value), repr(node.value_sum),
        repr(node.reward), repr(node.path_return), node.done, node.success, node.terminal, node.label,
        node.llm_calls, node.llm_tokens, node.observation.text, node.observation.valid_actions,
        None if reply is None else [reply.text, reply.seed, repr(reply.temperature)],
    ]


async def fingerprint(suite: str, algorithm: str, trees: int) -> tuple[str, int]:
    env_name, env_args, table, max_depth = SUITES[suite]
    params = ALGORITHMS[algorithm].params(**{"max_depth": max_depth, **table[algorithm]})
    digest = hashlib.sha256()
    policy = RecordingPolicy(digest)
    nodes = 0
    for task in range(trees):
        env = make_env(env_name, **env_args)
        x = await Expander.open(env, task, policy, 7, max_depth=params.max_depth, max_nodes=params.max_nodes,
                                dedupe=params.dedupe, max_llm_calls=params.max_llm_calls)
        await grow(x, params)
        rows = [node_row(n) for n in x.tree.freeze()]
        counters = [x.tree.size, x.llm_requests, x.llm_calls, x.unstepped, x.cursor.replayed_steps,
                    sorted((str(k), v) for k, v in x.cursor.guard.faults.items())]
        digest.update(json.dumps([task, rows, x.tree.__dict__.get("created"), counters]).encode())
        nodes += x.tree.size
    return digest.hexdigest(), nodes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", type=int, default=30)
    parser.add_argument("--suite", default="all", choices=["all", *SUITES])
    parser.add_argument("--algorithm", default="all", choices=["all", *ALGORITHM_NAMES])
    args = parser.parse_args()
    record_creation_order()
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    algorithms = ALGORITHM_NAMES if args.algorithm == "all" else (args.algorithm,)
    for suite in suites:
        for algorithm in algorithms:
            digest, nodes = asyncio.run(fingerprint(suite, algorithm, args.trees))
            print(f"{suite:18} {algorithm:8} {nodes:7d} nodes  {digest}")


if __name__ == "__main__":
    main()
