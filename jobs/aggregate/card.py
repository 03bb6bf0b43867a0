"""The datasets folder's README.md: a dataset card whose front matter names each non-empty
dataset as a config, so `datasets.load_dataset(FOLDER, "dpo")` loads it in one line, and marks
one as the default (`sft` where it has rows, else the first non-empty one), so that
`datasets.load_dataset(FOLDER)` loads that one.

HF `datasets` needs the `configs:` block: without it, a folder of differently shaped subfolders
fails ("column names don't match"). An empty dataset has no files and so no config (a config
without data files raises EmptyDatasetError, and a 0-row Parquet file is refused too): the card
lists it as empty instead, as `_SUCCESS.json`, `thicket pull` and report.html do.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import yaml

from thicket.aggregate.forest import EVALUATED

DESCRIPTIONS = {
    "sft": "Successful root-to-leaf paths as TRL conversational `messages`: the exact chat the policy saw plus "
    "the final assistant turn. `sft.rows` picks the paths (see Parameters): `best` (the default), the best path "
    "per task (highest return, then fewest steps, then lowest node id); `distinct`, per task the best path of "
    "each distinct action sequence that succeeded (paths whose replies differ in their thoughts only are one "
    "sequence), best first, as AgentGym's AgentEvol and ETO's iterations keep every distinct success. "
    "`reward` is the path's return by the env's reward semantics (see Rewards below).",
    "sft_fastchat": "The same paths in FastChat layout: `id`, `conversations` of {from: system|human|gpt, value}.",
    "dpo": "Preference pairs in TRL format (`prompt`, `chosen`, `rejected` message lists). `kind` = trajectory: "
    "a successful path vs an evaluated failed one of the same task with a lower return (ETO-style; rewards: "
    "the two paths' returns); `kind` = step: two evaluated sibling replies whose values differ by at least "
    "beta (DensePolicy-style; rewards: the two nodes' values), with different actions: two replies of the same "
    "action (their thoughts differ) say nothing about actions, and are kept only with `dpo.thought_pairs` "
    "and only where the env declares itself deterministic (stats.json `preference_rows_same_action` counts "
    "them). The prompt is the chat up to the shared prefix. "
    "No prompt holds A over B and B over A: such rows are dropped (both), and a repeated row is kept once, "
    "across the whole sweep (stats.json `preference_rows_dropped`). "
    "A trajectory pair's `chosen` and `rejected` run on for several turns, the environment's observations "
    "(user turns) between the replies: every message carries a `loss` flag, true on assistant turns only, "
    "for trainers that mask (as ETO's does). TRL's DPOTrainer scores every completion token, observations "
    "included: for it, use `dpo_first_turn` or mask by the flags.",
    "dpo_first_turn": "Step-level preferences: the two sibling steps where a `dpo` pair parts, one assistant "
    "message each (no observation is scored; TRL's DPOTrainer takes it as it is). Each pair of steps once, "
    "whatever the order of the pairs it came from, oriented by the two steps' own values and kept only where "
    "they make a step pair (both evaluated, values at least beta apart, different replies, different actions "
    "as in `dpo`): `chosen` is the step of higher value, and the rewards are the two steps' values, not "
    "whole-path returns. Contradicting and repeated rows are dropped as in `dpo`.",
    "revision": "Agent-R revision trajectories: a bad path up to its transition point (loss 0), an assistant "
    "revision turn `Thought: ...\\nAction: wait` (loss 1), user `ok.`, then the good path from where the two "
    "part (assistant turns loss 1). Every message carries a `loss` flag; `transition_method` says how the "
    "cut was found.",
    "tokens": "Token-level RL rows, one per root-to-leaf trajectory with sampled ids: `prompt_ids`, "
    "`response_ids` (exactly the tokens the model saw, in order: decoding prompt + response gives the chat "
    "template's text of the path), `loss_mask` (1 on sampled reply tokens; 0 on observations, template "
    "tokens and the action mark prefilled after a cut thought), `rollout_logprobs` (see Logprobs below), "
    "`rollout_temperatures` and `temperature`, `stop_reason`, `reward` (the path's return), `group_id` "
    "(the task: a GRPO group), `trajectory_id`. Paths that the search's budget, a timeout or an error cut "
    "short have no outcome: for outcome rewards keep the rows whose `stop_reason` is one of "
    + ", ".join(EVALUATED) + ".",
}

# What a column means, where its name does not say it all (the card lists every column and its type).
COLUMNS = {
    "id": "a stable row id: task, then the nodes it is made of",
    "task": "the task index",
    "tree": "the tree's id in the sweep",
    "leaf": "the path's last node (a row of the task's tree shard)",
    "reward": "the path's return (the env's reward semantics: a sum of rewards, or a running score's last value)",
    "steps": "actions on the path",
    "messages": "the chat: {role, content[, loss]} turns",
    "conversations": "FastChat turns: {from, value}",
    "kind": "`trajectory` or `step`",
    "prompt_node": "the last node of the shared prefix",
    "chosen_node": "the last node of the chosen side",
    "rejected_node": "the last node of the rejected side",
    "prompt": "the chat up to the shared prefix, ending on a user turn",
    "chosen": "the preferred continuation",
    "rejected": "the other continuation",
    "chosen_reward": "a trajectory pair's path return, a step pair's node value",
    "rejected_reward": "as chosen_reward",
    "good_leaf": "the good path's last node",
    "bad_leaf": "the bad path's last node",
    "shared_depth": "depth of the last node the two paths share",
    "transition_node": "the last bad node kept",
    "transition_depth": "its depth",
    "transition_method": "`verifier` or `heuristic`",
    "good_value": "the good leaf's value",
    "bad_value": "the bad leaf's value",
    "trajectory_id": "the path's id",
    "tree_id": "the tree's id",
    "group_id": "the task (a GRPO group)",
    "prompt_ids": "the root prompt's token ids",
    "response_ids": "every later token: sampled replies and observations",
    "loss_mask": "1 on sampled reply tokens; 0 on observations, template tokens and prefilled tokens",
    "rollout_logprobs": "each sampled token's logprob under the distribution it was drawn from (0 where loss_mask is 0)",
    "rollout_temperatures": "each sampled token's sampling temperature (0 where loss_mask is 0)",
    "temperature": "the temperature every step of the path was sampled at (null: the steps differ, as in dense trees)",
    "constrained": "whether any action on the path was constrained to the valid actions",
    "stop_reason": "why the path ended",
    "success": "the env said the task was solved",
}


DEFAULT_CONFIG = "sft"  # what `datasets.load_dataset(FOLDER)` loads, where it has rows


def default_config(files: dict[str, list[str]]) -> str | None:
    """The config loaded when none is named: `sft` where it has files, else the first non-empty
    dataset by name (None when all are empty)."""
    if files.get(DEFAULT_CONFIG):
        return DEFAULT_CONFIG
    return next((name for name in sorted(files) if files[name]), None)


REWARDS = {
    "increment": "each step's reward is what that step earned; a path's return is their sum",
    "running": "each step's reward is the episode's score so far (ScienceWorld, TextWorld); a path's return "
    "is its last step's reward, never a sum",
    "legacy": "shards older than `path_return`: a running score for sciworld and textworld, else a sum",
}
LOGPROBS = (
    "`rollout_logprobs` (and the shards' `logprobs`) are vLLM's `processed_logprobs`, which thicket sets on "
    "every vLLM it starts or renders: the log-probability of each sampled token under the distribution it "
    "was drawn from, after the temperature and top_p and, on constrained steps, the action grammar's mask. "
    "`rollout_temperatures` gives each token's temperature, so a trainer can score its policy at the "
    "temperature each token was sampled at. A greedy step (temperature 0, dense trees' label 0) carries "
    "the untempered distribution's logprob. A policy served elsewhere (`policy.url`) reports what its "
    "server computes; thicket cannot check a remote server's mode."
)


def data_lines(data_sources: dict[str, int]) -> list[str]:
    """Where the sweep's tasks came from: generated data is said to be generated, in the env's words."""
    lines = ["## Data", ""]
    lines += [f"- {source} ({trees} trees)" for source, trees in sorted(data_sources.items())]
    return lines + [""]


def meaning_lines(reward_semantics: dict[str, int]) -> list[str]:
    """What rewards and logprobs mean in these rows."""
    lines = ["## Rewards", ""]
    for name, trees in sorted(reward_semantics.items()):
        lines.append(f"- `{name}` ({trees} trees): {REWARDS.get(name, name)}.")
    lines += ["", "A row's reward is its path's return; a step pair's rewards are its two nodes' values (the "
              "mean outcome of the evaluated leaves below each).", "", "## Logprobs", "", LOGPROBS, ""]
    return lines


def configs(files: dict[str, list[str]]) -> list[dict[str, Any]]:
    """HF `configs:` entries, one per dataset with files (each dataset's parts as its train split),
    the default one marked `default: true` (HF asks for a config name without it: "Config name
    is missing").

    Each config lists its parts by their exact, content-named paths, never a glob: HF `datasets`
    keys its cache on the card (the folder's base name, the config name and these data files),
    and every sweep's folder is called `datasets`, so with `sft/*.parquet` two sweeps shared one
    cache entry and the second load returned the first sweep's rows. A glob would also take in
    stale parts that an older `thicket pull` left in a folder."""
    default = default_config(files)
    return [
        {"config_name": name, "data_files": [{"split": "train", "path": sorted(files[name])}]}
        | ({"default": True} if name == default else {})
        for name in sorted(files)
        if files[name]
    ]


def empty(rows: dict[str, int]) -> list[str]:
    """The datasets without rows (and so without files or a config)."""
    return sorted(name for name, count in rows.items() if count == 0)


def front_matter(files: dict[str, list[str]]) -> list[str]:
    meta: dict[str, Any] = {"configs": configs(files)} if configs(files) else {}
    meta["tags"] = ["thicket", "agents", "tree-search"]
    return ["---", yaml.safe_dump(meta, sort_keys=False).rstrip(), "---", ""]


def _type(kind: pa.DataType) -> str:
    if pa.types.is_list(kind) and pa.types.is_struct(kind.value_type):
        fields = ", ".join(f.name for f in kind.value_type)
        return f"list of {{{fields}}}"
    if pa.types.is_list(kind):
        return f"list of {kind.value_type}"
    return str(kind)


def column_lines(schema: pa.Schema) -> list[str]:
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    return lines + [f"| `{f.name}` | {_type(f.type)} | {_cell(COLUMNS.get(f.name, ''))} |" for f in schema]


def _cell(text: str) -> str:
    """Text for a table cell: GFM splits a cell at every unescaped `|`, in code spans too."""
    return text.replace("|", "\\|")


def dataset_section(name: str, rows: int, files: list[str], schema: pa.Schema) -> list[str]:
    lines = [f"## {name}", "", DESCRIPTIONS[name], ""]
    if files:
        load = f'ds = datasets.load_dataset(FOLDER, "{name}", split="train")'
        lines += ["```python", "import datasets", load, "```", ""]
    else:
        lines += [f"**Empty**: this sweep gave no `{name}` rows, so there are no files and no `{name}` config.", ""]
    return lines + column_lines(schema) + [""]


def selection_lines(params: dict[str, Any]) -> list[str]:
    """Which rows this build kept, in words: the SFT paths and the same-action step pairs."""
    rows = params.get("sft", {}).get("rows", "best")
    thoughts = params.get("dpo", {}).get("thought_pairs", False)
    sft = ("the best successful path per task" if rows == "best"
           else "the best path of each distinct successful action sequence per task")
    same = ("kept where the env declares itself deterministic, dropped elsewhere" if thoughts
            else "dropped (they say nothing about actions)")
    return [f"- `sft.rows: {rows}`: {sft}.", f"- `dpo.thought_pairs: {str(thoughts).lower()}`: step pairs whose "
            f"two sides take the same action are {same}.", ""]


def dataset_card(
    sweep: str,
    spec: dict[str, Any] | None,
    rows: dict[str, int],
    files: dict[str, list[str]],
    params: dict[str, Any],
    schemas: dict[str, pa.Schema],
    reward_semantics: dict[str, int] | None = None,
    data_sources: dict[str, int] | None = None,
) -> str:
    lines = front_matter(files)
    lines += [
        f"# Datasets of sweep `{sweep}`",
        "",
        "Built by `thicket aggregate` from the sweep's committed tree shards. Paths are relative to this folder;",
        "each non-empty dataset is a config of it: `datasets.load_dataset(FOLDER, NAME, split=\"train\")`,",
        "FOLDER being this folder (a local path, e.g. after `thicket pull`). In a trainer script,",
        "`thicket.load(SWEEP, NAME)` returns the same rows checked against `_SUCCESS.json` (docs/training.md).",
        "Each config lists its parts by their content-named paths, so HF's cache never serves another sweep's rows.",
        "",
        "| dataset | rows | files |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| `{name}` | {rows[name]} | {len(files[name]) or 'empty'} |" for name in sorted(rows)]
    lines += [""]
    if default := default_config(files):
        why = "" if default == DEFAULT_CONFIG else f" (`{DEFAULT_CONFIG}` is empty: the first non-empty dataset)"
        lines += [f"The default config is `{default}`{why}: `datasets.load_dataset(FOLDER, split=\"train\")`, "
                  "with no name, loads it.", ""]
    if none := empty(rows):
        lines += ["Empty (no rows, no files, no config): " + ", ".join(f"`{name}`" for name in none) + ".", ""]
    for name in sorted(rows):
        lines += dataset_section(name, rows[name], files[name], schemas[name])
    lines += data_lines(data_sources or {})
    lines += meaning_lines(reward_semantics or {})
    lines += ["## Parameters", "", *selection_lines(params), "```yaml", yaml.safe_dump(params, sort_keys=True).rstrip(),
              "```", ""]
    lines += ["## Sweep spec", ""]
    if spec is None:
        lines += ["(no spec.yaml in the sweep folder)", ""]
    else:
        summary = {k: spec[k] for k in ("name", "tasks", "search", "policy", "seed") if k in spec}
        lines += ["```yaml", yaml.safe_dump(summary, sort_keys=False).rstrip(), "```", ""]
    lines += [
        "`stats.json` holds the sweep's statistics and `report.html` plots them. `_SUCCESS.json` is written last "
        "and lists every file with its SHA-256 and row count, and the empty datasets: read only a folder that has it.",
        "",
    ]
    return "\n".join(lines)
