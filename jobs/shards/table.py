"""A finished tree as a shard table: one row per node, canonical node order."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from thicket.policy import prompts
from thicket.search.tree import Node, Tree
from thicket.shards.storage import TREE_SCHEMA


@dataclass(frozen=True)
class TreeMeta:
    sweep: str
    env: str
    algorithm: str
    model: str
    seed: int
    instructions: str = ""
    show_valid_actions: bool = False


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (slice compares run in C). Append-only prompts
    differ from the parent's context + reply only in the last few tokens (a re-rendered
    end of the reply), so those lengths are tried first; else a binary search."""
    n = min(len(a), len(b))
    for k in range(n, max(n - 4, 0) - 1, -1):
        if a[k - 1 : k] == b[k - 1 : k] and a[:k] == b[:k]:  # the last token first: a cheap look
            return k
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def node_context(node: Node) -> list[int] | None:
    """The prompt ids this node's children were sampled from (None: never sent)."""
    for child in node.children:
        if child.reply is not None and child.reply.prompt_token_ids is not None:
            return child.reply.prompt_token_ids
    return None


def compress_contexts(nodes: list[Node]) -> dict[Node, tuple[int, list[int]]]:
    """Each node's context stored as (prefix length kept from parent context + own
    reply ids, suffix ids): append-only prompts make the suffix one turn long."""
    out: dict[Node, tuple[int, list[int]]] = {}
    full: dict[Node, list[int]] = {}
    for node in nodes:
        context = node_context(node)
        if context is None:
            out[node] = (-1, [])
            continue
        base: list[int] = []
        if node.parent is not None and node.reply is not None:
            base = full.get(node.parent, []) + node.reply.token_ids
        keep = common_prefix(base, context)
        out[node] = (keep, context[keep:])
        full[node] = context
    return out


def tree_table(tree: Tree, meta: TreeMeta) -> pa.Table:
    nodes = tree.freeze()
    contexts = compress_contexts(nodes)
    rows: dict[str, list] = {name: [] for name in TREE_SCHEMA.names}
    system_prompt = prompts.system_message(meta.instructions)["content"]

    def add(**values: object) -> None:
        for name, value in values.items():
            rows[name].append(value)

    for node in nodes:
        r = node.reply
        prefix_len, suffix = contexts[node]
        valid = node.observation.valid_actions
        add(
            sweep=meta.sweep,
            env=meta.env,
            algorithm=meta.algorithm,
            model=meta.model,
            seed=meta.seed,
            task=tree.task,
            tree=tree.task,
            node=node.id,
            parent=node.parent.id if node.parent is not None else -1,
            depth=node.depth,
            child_index=node.index,
            label=node.label,
            system_prompt=system_prompt,
            observation=node.observation.text,
            user_message=prompts.observation_message(
                node.observation.text, valid, meta.show_valid_actions
            )["content"],
            num_valid_actions=len(valid) if valid is not None else -1,
            thought=r.thought if r else "",
            action=r.action if r else "",
            reply=r.text if r else "",
            token_ids=r.token_ids if r else [],
            logprobs=r.logprobs if r else [],
            action_token_start=r.action_token_start if r else -1,
            prefill_start=r.prefill_start if r else -1,
            prefill_len=r.prefill_len if r else 0,
            context_prefix_len=prefix_len,
            context_suffix_ids=suffix,
            prompt_tokens=r.prompt_tokens if r else 0,
            cached_tokens=r.cached_tokens if r else None,
            finish_reason=r.finish_reason if r else "",
            constrained=r.constrained if r else False,
            temperature=r.temperature if r else 0.0,
            sample_seed=r.seed if r else 0,
            reward=node.reward,
            path_return=node.path_return,
            reward_semantics=tree.reward_semantics.value,
            data_source=tree.data_source,
            deterministic=tree.deterministic,
            done=node.done,
            success=node.success,
            terminal=node.terminal,
            stop_reason=node.stop.value,
            value=node.value,
            visits=node.visits,
            llm_ms=r.latency_s * 1000 if r else 0.0,
            env_ms=node.env_ms,
            llm_calls=node.llm_calls,
            llm_tokens=node.llm_tokens,
            resumed_llm_calls=node.resumed_llm_calls,
            resumed=node.resumed,
        )
    return pa.Table.from_pydict(rows, schema=TREE_SCHEMA)


def rebuild_contexts(table: pa.Table) -> list[list[int] | None]:
    """Inverse of compress_contexts, row by row (rows are in canonical order)."""
    parents = table.column("parent").to_pylist()
    prefix = table.column("context_prefix_len").to_pylist()
    suffix = table.column("context_suffix_ids").to_pylist()
    tokens = table.column("token_ids").to_pylist()
    out: list[list[int] | None] = []
    for i, parent in enumerate(parents):
        if prefix[i] < 0:
            out.append(None)
            continue
        base = (out[parent] or []) + tokens[i] if parent >= 0 else []
        out.append(base[: prefix[i]] + suffix[i])
    return out
