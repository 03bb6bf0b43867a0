"""Token-level RL rows: one per root-to-leaf trajectory whose nodes all carry sampled ids.

prompt_ids   = ctx(root), the prompt the root's children were sampled from;
response_ids = ctx(parent(leaf))[len(ctx(root)):] + the leaf's reply ids.
Contexts are stored compressed (ctx(v) = (ctx(parent) + ids(v))[:prefix_len] + suffix(v)), so
for an append-only path each step adds k(v) = prefix_len(v) - len(ctx(parent)) reply ids
(k may be short of the reply by a token the chat template re-rendered) and then its
suffix (the template and the observation). Reply ids get loss 1 and their sampled
logprobs, suffix ids loss 0 and logprob 0.0. A path whose contexts were not append-only
(the prompt was truncated or re-rendered: k < 0) is skipped and counted.
Everything is built with numpy gathers, for a whole forest at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from thicket.aggregate.forest import Forest, list_column, ranges


def _values(kind: pa.DataType) -> pa.DataType:
    """A list of non-null values: Parquet then writes no null levels for them (token rows'
    lists are most of the values aggregation encodes; this took ~10% off encoding them)."""
    return pa.list_(pa.field("item", kind, nullable=False))


TOKENS_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("tree_id", pa.int64()),
        ("group_id", pa.int64()),  # the task: a GRPO group
        ("leaf", pa.int32()),
        pa.field("prompt_ids", _values(pa.int32()), nullable=False),
        pa.field("response_ids", _values(pa.int32()), nullable=False),
        pa.field("loss_mask", _values(pa.int8()), nullable=False),
        pa.field("rollout_logprobs", _values(pa.float32()), nullable=False),
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
    def of(cls, forest: Forest) -> _Columns:
        tok_off, tok = list_column(forest.table, "token_ids")
        lp_off, lp = list_column(forest.table, "logprobs")
        suf_off, suf = list_column(forest.table, "context_suffix_ids")
        prefix = forest.table.column("context_prefix_len").to_numpy(zero_copy_only=False).astype(np.int64)
        return cls(tok_off, tok, lp_off, lp, suf_off, suf, prefix)


def token_rows(forest: Forest) -> TokenRows:
    leaves = forest.leaves
    if len(leaves) == 0:
        return TokenRows(None, 0, 0)
    c = _Columns.of(forest)
    roots = forest.roots
    reply_len = np.diff(c.tok_off)
    sampled = (reply_len > 0) & (np.diff(c.lp_off) == reply_len)
    sampled[roots] = True
    ctx_len = np.where(c.prefix_len >= 0, c.prefix_len + np.diff(c.suf_off), -1)
    kept = c.prefix_len - ctx_len[np.maximum(forest.parent, 0)]  # k(v): reply ids kept in ctx(v)
    kept[roots] = 0
    sent = (c.prefix_len >= 0) & (kept >= 0) & (kept <= reply_len)
    sent[roots] = c.prefix_len[roots] == 0
    paths = forest.ancestors(leaves)  # past a leaf's depth: the root, where sampled is True
    with_ids = sampled[paths].all(axis=1)
    aligned = (sampled & sent)[paths]
    aligned[np.arange(len(leaves)), forest.depth[leaves]] = sampled[leaves]  # the leaf is never sent
    ok = aligned.all(axis=1)
    no_ids = int((~with_ids).sum())
    misaligned = len(leaves) - no_ids - int(ok.sum())
    if not ok.any():
        return TokenRows(None, no_ids, misaligned)
    return TokenRows(_build(forest, c, leaves[ok], paths[ok], kept, ctx_len), no_ids, misaligned)


def _build(
    forest: Forest, columns: _Columns, leaves: np.ndarray, paths: np.ndarray, kept: np.ndarray, ctx_len: np.ndarray
) -> pa.Table:
    steps = paths[:, 1:]
    level = np.arange(1, paths.shape[1])
    depth = forest.depth[leaves][:, None]
    inner = level < depth
    reply_len = np.diff(columns.tok_off)
    n_tok, n_lp, n_suf = len(columns.tok), len(columns.lp), len(columns.suf)
    # Per leaf, ranges alternate reply part / suffix part, level by level, into the
    # concatenation (reply ids, suffix ids); logprobs into (logprobs, zeros). A step keeps
    # k(v) reply ids, the leaf all of its own, and no suffix.
    lengths = np.empty((*steps.shape, 2), dtype=np.int64)
    lengths[..., 0] = np.where(inner, kept[steps], np.where(level == depth, reply_len[steps], 0))
    lengths[..., 1] = np.where(inner, np.diff(columns.suf_off)[steps], 0)
    starts = np.empty_like(lengths)
    starts[..., 0], starts[..., 1] = columns.tok_off[steps], n_tok + columns.suf_off[steps]
    take = ranges(starts.ravel(), lengths.ravel())
    ids = np.concatenate([columns.tok, columns.suf]).astype(np.int32, copy=False)[take]
    mask = (take < n_tok).view(np.int8)  # reply ids 1, suffix ids 0
    if n_lp != n_tok or not np.array_equal(columns.lp_off, columns.tok_off):
        starts[..., 0], starts[..., 1] = columns.lp_off[steps], n_lp + columns.suf_off[steps]
        take = ranges(starts.ravel(), lengths.ravel())
    logprobs = np.concatenate([columns.lp, np.zeros(n_suf, np.float32)]).astype(np.float32, copy=False)[take]
    response_len = lengths.sum(axis=(1, 2))
    tree = forest.tree_of[leaves]
    expected = ctx_len[forest.parent[leaves]] - ctx_len[forest.roots[tree]] + reply_len[leaves]
    assert np.array_equal(response_len, expected), "token rows do not reproduce the contexts"
    offsets = pa.array(np.r_[0, np.cumsum(response_len)].astype(np.int32))
    forced = forest.table.column("constrained").to_numpy(zero_copy_only=False).astype(bool)
    forced[forest.roots] = False  # the roots took no action; past a leaf's depth, paths hold the root
    return pa.table(
        {
            "trajectory_id": forest.row_ids(leaves, "node-", forest.names(leaves)),
            "tree_id": forest.trees[tree],
            "group_id": forest.tasks[tree],
            "leaf": forest.local(leaves).astype(np.int32),
            "prompt_ids": _prompts(forest, columns, tree),
            "response_ids": _lists(offsets, ids),
            "loss_mask": _lists(offsets, mask),
            "rollout_logprobs": _lists(offsets, logprobs),
            "constrained": forced[paths].any(axis=1),
            "stop_reason": forest.table.column("stop_reason").take(pa.array(leaves)),
            "success": forest.success[leaves],
            "reward": forest.returns[leaves].astype(np.float32),
        },
        schema=TOKENS_SCHEMA,
    )


def _prompts(forest: Forest, columns: _Columns, trees: np.ndarray) -> pa.ListArray:
    """ctx(root) of each of `trees`: its root's suffix ids, copied to each run of rows of
    one tree at once (rows come tree by tree, so a forest's runs are its trees)."""
    roots = forest.roots
    lengths = np.diff(columns.suf_off)[roots][trees]
    offsets = np.zeros(len(trees) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.empty(offsets[-1], dtype=np.int32)
    runs = np.flatnonzero(np.diff(trees)) + 1
    for first, end in zip(np.r_[0, runs].tolist(), np.r_[runs, len(trees)].tolist()):
        start = columns.suf_off[roots[trees[first]]]
        prompt = columns.suf[start : start + lengths[first]]
        values[offsets[first] : offsets[end]].reshape(end - first, len(prompt))[:] = prompt
    return _lists(pa.array(offsets.astype(np.int32)), values)


def _lists(offsets: pa.Array, values: np.ndarray) -> pa.ListArray:
    return pa.ListArray.from_arrays(offsets, pa.array(values), type=_values(pa.from_numpy_dtype(values.dtype)))
