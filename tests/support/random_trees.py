"""Random trees written directly in TREE_SCHEMA, with what their generator knows (Truth) and
reference helpers independent of the code under test (Rows); a synthetic sweep of such trees on
disk, and its datasets read back."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import strategies as st

from thicket.policy import prompts
from thicket.shards.storage import TREE_SCHEMA, write_shard
from thicket.storage.store import LocalStore

VALUES = (0.0, 0.25, 0.5, 0.75, 1.0)
LEAF_STOPS = ("done", "done", "depth_limit", "budget", "disaster", "error", "timeout")


@dataclass
class Truth:
    """What the generator knows: each node's full context, and per context token whether it
    is a sampled reply token (mask), its logprob and its sampling temperature; per node, its
    reply's mask (a prefilled span is not sampled)."""

    ctx: dict[int, list[int]] = field(default_factory=dict)
    mask: dict[int, list[int]] = field(default_factory=dict)
    logprobs: dict[int, list[float]] = field(default_factory=dict)
    temperatures: dict[int, list[float]] = field(default_factory=dict)
    reply_mask: dict[int, list[int]] = field(default_factory=dict)


def f32(x: float) -> float:
    return float(np.float32(x))


def random_tree(seed: int, max_nodes: int = 40, task: int = 0, token_ids: bool = True,
                semantics: str | None = None) -> tuple[pa.Table, Truth]:
    """A random tree; `semantics` (increment | running, else drawn): how its rewards add up.
    Increment trees earn small rewards on the way (so that a sum and a last value differ);
    running trees carry a score that grows along each path."""
    rng = random.Random(seed)
    semantics = semantics or rng.choice(("increment", "running"))
    parents, depths = [-1], [0]
    frontier = [0]
    while frontier and len(parents) < max_nodes:
        nxt = []
        for p in frontier:
            for _ in range(rng.choice((0, 1, 2, 3, 3)) if depths[p] < 6 else 0):
                if len(parents) >= max_nodes:
                    break
                parents.append(p)
                depths.append(depths[p] + 1)
                nxt.append(len(parents) - 1)
        frontier = nxt
    n = len(parents)
    has_children = set(parents[1:])
    truth = Truth()
    rows = []
    score = [0.0] * n  # running trees: the score so far
    for v in range(n):
        leaf = v not in has_children and v > 0
        action = rng.choice("abc")
        reply_ids = [rng.randrange(1000) for _ in range(rng.randint(1, 4))] if token_ids and v else []
        if token_ids and v and rng.random() < 0.03:
            reply_ids = []  # a node without sampled ids: its paths yield no token rows
        logprobs = [f32(-rng.random() * 5) for _ in reply_ids]
        temperature = rng.choice((0.0, 0.5, 1.0, 1.0))
        prefill_start, prefill_len = -1, 0
        if len(reply_ids) >= 3 and rng.random() < 0.3:  # act(): an action mark prefilled mid-reply
            prefill_start = rng.randrange(1, len(reply_ids) - 1)
            prefill_len = 1 if rng.random() < 0.9 else -1  # -1: its ids are not known
            for i in range(prefill_start, prefill_start + max(prefill_len, 1)):
                logprobs[i] = 0.0
        sampled = [0 if prefill_start >= 0 and prefill_start <= i < prefill_start + max(prefill_len, 1) else 1
                   for i in range(len(reply_ids))]
        truth.reply_mask[v] = sampled
        temps = [f32(temperature) if s else 0.0 for s in sampled]
        prefix_len, suffix = -1, []
        if not leaf and token_ids:
            suffix = [rng.randrange(1000, 2000) for _ in range(rng.randint(1, 4))]
            if v == 0:
                prefix_len, kept = 0, 0
                truth.ctx[v], truth.mask[v], truth.logprobs[v] = list(suffix), [0] * len(suffix), [0.0] * len(suffix)
                truth.temperatures[v] = [0.0] * len(suffix)
            else:
                p = parents[v]
                base = truth.ctx[p]
                if rng.random() < 0.05:  # the prompt was truncated: not append-only
                    prefix_len = rng.randrange(len(base))
                    truth.ctx[v] = base[:prefix_len] + suffix
                else:
                    kept = len(reply_ids) - (1 if reply_ids and rng.random() < 0.3 else 0)  # cut by a token
                    prefix_len = len(base) + kept
                    truth.ctx[v] = base + reply_ids[:kept] + suffix
                    if p in truth.mask:  # only along append-only paths
                        truth.mask[v] = truth.mask[p] + sampled[:kept] + [0] * len(suffix)
                        truth.logprobs[v] = truth.logprobs[p] + logprobs[:kept] + [0.0] * len(suffix)
                        truth.temperatures[v] = truth.temperatures[p] + temps[:kept] + [0.0] * len(suffix)
        stop = rng.choice(LEAF_STOPS) if leaf else ("expanded" if v in has_children else "open")
        if semantics == "running":
            score[v] = 0.0 if v == 0 else min(score[parents[v]] + rng.choice((0.0, 0.0, 0.25)), 0.75)
            reward = score[v]
            if stop == "done":
                reward = rng.choice((score[v], 1.0, 1.0))
            elif stop == "disaster":
                reward = -1.0
        else:
            reward = rng.choice((0.0, 0.0, 0.25)) if v else 0.0
            if stop == "done":
                reward = rng.choice((0.0, 0.0, 1.0, 1.0, 0.5))
            elif stop == "disaster":
                reward = -1.0
        rows.append(
            {
                "sweep": "s", "env": "word", "algorithm": "mcts", "model": "m", "seed": 0,
                "task": task, "tree": task, "node": v, "parent": parents[v], "depth": depths[v],
                "child_index": 0, "label": -1,
                "system_prompt": "You spell words.", "observation": f"o{v}", "user_message": f"Observation: o{v}",
                "num_valid_actions": 3, "thought": f"t{v}", "action": action,
                "reply": prompts.turn("go", action) if v else "",
                "token_ids": reply_ids, "logprobs": logprobs, "action_token_start": -1,
                "prefill_start": prefill_start, "prefill_len": prefill_len,
                "context_prefix_len": prefix_len, "context_suffix_ids": suffix,
                "prompt_tokens": 10, "cached_tokens": rng.choice((None, 0, 5)),
                "finish_reason": "stop", "constrained": rng.random() < 0.2, "temperature": temperature, "sample_seed": 0,
                "reward": reward, "path_return": reward_return(rows, parents[v], reward, semantics),
                "reward_semantics": semantics,
                "done": stop in ("done", "disaster"), "success": stop == "done" and reward == 1.0,
                "terminal": leaf and stop != "open", "stop_reason": stop,
                "value": rng.choice(VALUES), "visits": rng.choice((0, 1, 1, 2, 3)),
                "llm_ms": 0.0, "env_ms": 0.0,
            }
        )
    return pa.Table.from_pylist(rows, schema=TREE_SCHEMA), truth


def reward_return(rows: list[dict], parent: int, reward: float, semantics: str) -> float:
    """A node's path return by its tree's semantics (the definition: a sum, or the last score)."""
    if semantics == "running" or parent < 0:
        return reward if parent >= 0 else 0.0
    return rows[parent]["path_return"] + reward


class Rows:
    """Reference helpers over a table's python rows, independent of the code under test."""

    def __init__(self, table: pa.Table) -> None:
        self.rows = table.to_pylist()
        self.children: dict[int, list[int]] = {}
        for r in self.rows[1:]:
            self.children.setdefault(r["parent"], []).append(r["node"])

    def path(self, node: int) -> list[int]:
        out = [node]
        while self.rows[out[-1]]["parent"] >= 0:
            out.append(self.rows[out[-1]]["parent"])
        return out[::-1]

    def chat(self, node: int) -> list[dict]:
        row = self.rows[node]
        if row["parent"] < 0:
            return [{"role": "system", "content": row["system_prompt"]}, {"role": "user", "content": row["user_message"]}]
        return self.chat(row["parent"]) + [
            {"role": "assistant", "content": row["reply"]},
            {"role": "user", "content": row["user_message"]},
        ]

    def path_chat(self, leaf: int) -> list[dict]:
        """The chat at `leaf` without its final observation: ends on the leaf's reply."""
        return self.chat(leaf)[:-1]

    def leaves(self) -> list[int]:
        return [r["node"] for r in self.rows[1:] if r["node"] not in self.children]

    def ret(self, node: int) -> float:
        """The path's return, from the rewards alone: their sum, or (running) the last one."""
        if self.rows[node]["reward_semantics"] == "running":
            return f32(self.rows[node]["reward"]) if node else 0.0
        return sum(f32(self.rows[v]["reward"]) for v in self.path(node)[1:])


def rows_of(table: pa.Table | None) -> list[dict]:
    return table.to_pylist() if table is not None else []


trees = st.builds(random_tree, st.integers(0, 2**32 - 1), st.integers(1, 40))


def synthetic_sweep(root: Path, tasks: int = 12, datasets: dict | None = None) -> Path:
    sweep = root / "synthetic"
    store = LocalStore(sweep)
    for task in range(tasks):
        table, _ = random_tree(1000 + task, max_nodes=60, task=task)
        write_shard(store, task, table, "test")
    spec = {"name": "synthetic", "tasks": {"env": "frozenlake", "start": 0, "stop": tasks},
            "search": {"algorithm": "mcts"}, "output": str(root)}
    if datasets is not None:
        spec["datasets"] = datasets
    store.put("spec.yaml", json.dumps(spec).encode())
    return sweep


def files_under(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def dataset_rows(out: Path) -> dict[str, list[dict]]:
    parts = {p.name: sorted(p.glob("*.parquet")) for p in sorted(out.iterdir()) if p.is_dir()}
    return {name: [row for f in files for row in pq.read_table(f).to_pylist()] for name, files in parts.items()}


def load(folder: Path, name: str, cache: Path):
    import datasets

    files = sorted(str(p) for p in (folder / name).glob("*.parquet"))
    return datasets.load_dataset("parquet", data_files={"train": files}, split="train", cache_dir=str(cache))
