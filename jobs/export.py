"""Exports of committed trees in other pipelines' layouts."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from thicket.aggregate.forest import Forest
from thicket.errors import BadInput
from thicket.shards.storage import iter_shards
from thicket.storage import open_store


def split_logprobs(step: dict[str, Any]) -> tuple[list[float], list[float]]:
    """A step's sampled logprobs: its thought's, its action's (a prefilled action mark, which
    was not sampled, in neither)."""
    logprobs, start = step["logprobs"], step["action_token_start"]
    if start < 0:
        return logprobs, []
    prefilled = max(step.get("prefill_len") or 0, 0) if step.get("prefill_start") == start else 0
    return logprobs[:start], logprobs[start + prefilled :]


def tot_episode(table: pa.Table) -> dict[str, Any]:
    """One tree as {episode, paths: [{trajectory: [step...], final_reward}]}, a path per leaf.
    A step's cumulative_reward is its path's return so far (Forest.returns: the env's reward
    semantics, a sum of rewards or a running score), final_reward the whole path's."""
    rows = table.to_pylist()
    returns = Forest.of([table]).returns.tolist()
    has_children = {r["parent"] for r in rows}
    paths = []
    for leaf in rows:
        if leaf["parent"] < 0 or leaf["node"] in has_children:
            continue
        chain = []
        node = leaf
        while node["parent"] >= 0:
            chain.append(node)
            node = rows[node["parent"]]
        chain.reverse()
        trajectory, thoughts, actions = [], [], []
        for step in chain:
            thought_lp, action_lp = split_logprobs(step)
            trajectory.append(
                {
                    "observation": rows[step["parent"]]["observation"],
                    "thought_history": list(thoughts),
                    "actions_history": list(actions),
                    "current_thought": step["thought"],
                    "current_thought_logp": thought_lp,
                    "current_action": step["action"],
                    "current_action_logp": action_lp,
                    "cumulative_reward": returns[step["node"]],
                }
            )
            thoughts.append(step["thought"])
            actions.append(step["action"])
        paths.append({"trajectory": trajectory, "final_reward": returns[leaf["node"]]})
    return {"episode": int(rows[0]["task"]), "paths": paths}


def export_tot_json(sweep_uri: str) -> str:
    store = open_store(sweep_uri)
    episodes = [tot_episode(table) for _, table in iter_shards(store)]
    if not episodes:
        raise BadInput(f"{sweep_uri}: no committed trees there (expected the sweep folder a run wrote)")
    return json.dumps(episodes, indent=1)
