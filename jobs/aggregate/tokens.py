"""Token-level RL rows: one per root-to-leaf trajectory whose nodes all carry sampled ids.

prompt_ids   = ctx(root), the prompt the root's children were sampled from;
response_ids = ctx(parent(leaf))[len(ctx(root)):] + the leaf's reply ids.
Contexts are stored compressed (ctx(v) = (ctx(parent) + ids(v))[:prefix_len] + suffix(v)), so
for an append-only path each step adds k(v) = prefix_len(v) - len(ctx(parent)) reply ids
(k may be short of the reply by a token the chat template re-rendered) and then its
suffix (the template and the observation). Reply ids get loss 1 and their sampled
logprobs, suffix ids loss 0 and logprob 0.0. A path whose contexts were not append-only
(the prompt was truncated or re-rendered: k < 0) is skipped and counted.
Everything is built with numpy gathers, one tree at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from thicket.aggregate.view import TreeView, list_column, ranges

TOKENS_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("tree_id", pa.int64()),
        ("group_id", pa.int64()),  # the task: a GRPO group
        ("leaf", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("rollout_logprobs", pa.list_(pa.float32())),
        ("constrained", pa.bool_()),
        ("stop_reason", pa.string()),
        ("success", pa.bool_()),
        ("reward", pa.float32()),
    ]
)


@dataclass(frozen=True)
class TokenRows:
    table: pa.Table | None
    no_token_ids: int  # trajectories skipped: some node has no sampled ids
    not_append_only: int  # trajectories skipped: contexts not append-only along the path


@dataclass(frozen=True)
class _Columns:
    tok_off: np.ndarray
    tok: np.ndarray
    lp_off: np.ndarray
    lp: np.ndarray
    suf_off: np.ndarray
    suf: np.ndarray
    prefix_len: np.ndarray

    @classmethod
    def of(cls, view: TreeView) -> _Columns:
        tok_off, tok = list_column(view.table, "token_ids")
        lp_off, lp = list_column(view.table, "logprobs")
        suf_off, suf = list_column(view.table, "context_suffix_ids")
        prefix = view.table.column("context_prefix_len").to_numpy(zero_copy_only=False).astype(np.int64)
        return cls(tok_off, tok, lp_off, lp, suf_off, suf, prefix)


def token_rows(view: TreeView) -> TokenRows:
    leaves = view.leaves
    if len(leaves) == 0:
        return TokenRows(None, 0, 0)
    c = _Columns.of(view)
    reply_len = np.diff(c.tok_off)
    sampled = (reply_len > 0) & (np.diff(c.lp_off) == reply_len)
    sampled[0] = True
    ctx_len = np.where(c.prefix_len >= 0, c.prefix_len + np.diff(c.suf_off), -1)
    kept = c.prefix_len - ctx_len[np.maximum(view.parent, 0)]  # k(v): reply ids kept in ctx(v)
    kept[0] = 0
    sent = (c.prefix_len >= 0) & (kept >= 0) & (kept <= reply_len)
    sent[0] = c.prefix_len[0] == 0
    paths = view.ancestors(leaves)  # past a leaf's depth: the root, where sampled is True
    with_ids = sampled[paths].all(axis=1)
    aligned = (sampled & sent)[paths]
    aligned[np.arange(len(leaves)), view.depth[leaves]] = sampled[leaves]  # the leaf is never sent
    ok = aligned.all(axis=1)
    no_ids = int((~with_ids).sum())
    misaligned = len(leaves) - no_ids - int(ok.sum())
    if not ok.any():
        return TokenRows(None, no_ids, misaligned)
    return TokenRows(_build(view, c, leaves[ok], paths[ok], kept, ctx_len), no_ids, misaligned)


def _build(
    view: TreeView, c: _Columns, leaves: np.ndarray, paths: np.ndarray, kept: np.ndarray, ctx_len: np.ndarray
) -> pa.Table:
    depth = view.depth[leaves][:, None]
    levels = np.arange(1, paths.shape[1])[None, :]
    nodes = paths[:, 1:]
    inner = levels < depth
    reply_len = np.diff(c.tok_off)
    reply_take = np.where(inner, kept[nodes], np.where(levels == depth, reply_len[nodes], 0))
    suffix_take = np.where(inner, np.diff(c.suf_off)[nodes], 0)
    n_tok, n_lp, n_suf = len(c.tok), len(c.lp), len(c.suf)
    # Per leaf, ranges alternate reply part / suffix part, level by level, into the
    # concatenation (reply ids, suffix ids); logprobs into (logprobs, zeros).
    flat_len = np.stack([reply_take, suffix_take], axis=2).ravel()
    tok_starts = np.stack([c.tok_off[nodes], n_tok + c.suf_off[nodes]], axis=2).ravel()
    take = ranges(tok_starts, flat_len)
    ids = np.concatenate([c.tok, c.suf]).astype(np.int32, copy=False)[take]
    mask = (take < n_tok).astype(np.int8)
    if n_lp != n_tok or not np.array_equal(c.lp_off, c.tok_off):
        lp_starts = np.stack([c.lp_off[nodes], n_lp + c.suf_off[nodes]], axis=2).ravel()
        take = ranges(lp_starts, flat_len)
    logprobs = np.concatenate([c.lp, np.zeros(n_suf, np.float32)]).astype(np.float32, copy=False)[take]
    response_len = reply_take.sum(axis=1) + suffix_take.sum(axis=1)
    expected = ctx_len[view.parent[leaves]] - ctx_len[0] + reply_len[leaves]
    assert np.array_equal(response_len, expected), "token rows do not reproduce the contexts"
    offsets = pa.array(np.r_[0, np.cumsum(response_len)].astype(np.int32))
    prompt = c.suf[c.suf_off[0] : c.suf_off[1]].astype(np.int32)
    prompt_offsets = pa.array((np.arange(len(leaves) + 1) * len(prompt)).astype(np.int32))
    forced = view.table.column("constrained").to_numpy(zero_copy_only=False).astype(bool)
    forced[0] = False  # the root took no action; past a leaf's depth, paths hold the root
    stop = view.table.column("stop_reason").take(pa.array(leaves))
    trajectory = f"task-{view.task:08d}/node-"
    return pa.table(
        {
            "trajectory_id": pa.array([trajectory + str(leaf) for leaf in leaves.tolist()], pa.string()),
            "tree_id": np.full(len(leaves), view.tree, np.int64),
            "group_id": np.full(len(leaves), view.task, np.int64),
            "leaf": leaves.astype(np.int32),
            "prompt_ids": pa.ListArray.from_arrays(prompt_offsets, pa.array(np.tile(prompt, len(leaves)))),
            "response_ids": pa.ListArray.from_arrays(offsets, pa.array(ids)),
            "loss_mask": pa.ListArray.from_arrays(offsets, pa.array(mask)),
            "rollout_logprobs": pa.ListArray.from_arrays(offsets, pa.array(logprobs)),
            "constrained": forced[paths].any(axis=1),
            "stop_reason": stop,
            "success": view.success[leaves],
            "reward": view.returns[leaves].astype(np.float32),
        },
        schema=TOKENS_SCHEMA,
    )
