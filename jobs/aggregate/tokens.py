"""Token-level RL rows: one per root-to-leaf trajectory whose nodes all carry sampled ids.

prompt_ids   = ctx(root), the prompt the root's children were sampled from;
response_ids = ctx(parent(leaf))[len(ctx(root)):] + the leaf's reply ids.
Contexts are stored compressed (ctx(v) = (ctx(parent) + ids(v))[:prefix_len] + suffix(v)), so
for an append-only path each step adds k(v) = prefix_len(v) - len(ctx(parent)) reply ids
(k may be short of the reply by a token the chat template re-rendered) and then its
suffix (the template and the observation). Sampled reply ids get loss 1, their sampled
logprobs and their sampling temperature; prefilled reply ids (the action mark act() put
after a cut thought: prefill_start / prefill_len) and suffix ids loss 0, logprob 0.0 and
temperature 0.0. So a row's ids are exactly the tokens the model saw, in order, and
decoding prompt + response gives back the chat of its path.
Skipped and counted: a path whose contexts were not append-only (the prompt was truncated
or re-rendered: k < 0), and one with a prefill whose ids are not known (prefill_len -1).
Everything is built with numpy gathers, for a whole forest at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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
        # per response token, the temperature it was sampled at (0.0 where loss_mask is 0)
        pa.field("rollout_temperatures", _values(pa.float32()), nullable=False),
        ("temperature", pa.float32()),  # the path's one sampling temperature (null: its steps differ)
        ("constrained", pa.bool_()),
        ("stop_reason", pa.string()),
        ("success", pa.bool_()),
        ("reward", pa.float32()),
    ]
)


class InconsistentContexts(ValueError):
    """Token rows that do not reproduce the contexts the shards recorded (a shard's contexts
    contradict its replies): never written."""


@dataclass(frozen=True)
class TokenRows:
    table: pa.Table | None
    no_token_ids: int  # trajectories skipped: some node has no sampled ids
    not_append_only: int  # trajectories skipped: contexts not append-only along the path
    prefill_unknown: int = 0  # trajectories skipped: a prefill whose ids are not known


@dataclass(frozen=True)
class _Columns:
    tok_off: np.ndarray
    tok: np.ndarray
    lp_off: np.ndarray
    lp: np.ndarray
    suf_off: np.ndarray
    suf: np.ndarray
    prefix_len: np.ndarray
    prefill_start: np.ndarray  # -1: none
    prefill_len: np.ndarray  # -1: not known (older shards: 0)
    temperature: np.ndarray

    @classmethod
    def of(cls, forest: Forest) -> _Columns:
        table = forest.table
        tok_off, tok = list_column(table, "token_ids")
        lp_off, lp = list_column(table, "logprobs")
        suf_off, suf = list_column(table, "context_suffix_ids")
        prefix = table.column("context_prefix_len").to_numpy(zero_copy_only=False).astype(np.int64)
        start, length = (pc.fill_null(table.column(name), fill).to_numpy(zero_copy_only=False).astype(np.int64)
                         for name, fill in (("prefill_start", -1), ("prefill_len", 0)))
        temperature = pc.fill_null(table.column("temperature"), 0.0).to_numpy(zero_copy_only=False).astype(np.float32)
        return cls(tok_off, tok, lp_off, lp, suf_off, suf, prefix, start, length, temperature)


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
    known = (c.prefill_len >= 0)[paths].all(axis=1) | ~with_ids
    aligned = (sampled & sent)[paths]
    aligned[np.arange(len(leaves)), forest.depth[leaves]] = sampled[leaves]  # the leaf is never sent
    ok = aligned.all(axis=1) & known
    no_ids = int((~with_ids).sum())
    unknown = int((~known).sum())
    misaligned = len(leaves) - no_ids - unknown - int(ok.sum())
    if not ok.any():
        return TokenRows(None, no_ids, misaligned, unknown)
    return TokenRows(_build(forest, c, leaves[ok], paths[ok], kept, ctx_len), no_ids, misaligned, unknown)


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
    node = np.repeat(np.repeat(steps.ravel(), 2), lengths.ravel())  # each taken id's node
    at = take - columns.tok_off[node]  # a reply id's position in its reply
    start = columns.prefill_start[node]
    prefilled = (start >= 0) & (at >= start) & (at < start + columns.prefill_len[node])
    sampled = (take < n_tok) & ~prefilled  # sampled reply ids; prefilled and suffix ids are not
    mask = sampled.view(np.int8)
    if n_lp != n_tok or not np.array_equal(columns.lp_off, columns.tok_off):
        starts[..., 0], starts[..., 1] = columns.lp_off[steps], n_lp + columns.suf_off[steps]
        take = ranges(starts.ravel(), lengths.ravel())
    logprobs = np.concatenate([columns.lp, np.zeros(n_suf, np.float32)]).astype(np.float32, copy=False)[take]
    logprobs[~sampled] = 0.0
    temperatures = np.where(sampled, columns.temperature[node], np.float32(0.0)).astype(np.float32)
    response_len = lengths.sum(axis=(1, 2))
    tree = forest.tree_of[leaves]
    expected = ctx_len[forest.parent[leaves]] - ctx_len[forest.roots[tree]] + reply_len[leaves]
    if not np.array_equal(response_len, expected):
        bad = sorted(set(forest.tasks[tree[response_len != expected]].tolist()))
        raise InconsistentContexts(f"token rows do not reproduce the contexts the shards recorded (tasks {bad[:5]})")
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
            "rollout_temperatures": _lists(offsets, temperatures),
            "temperature": path_temperature(columns.temperature, steps, forest.depth[leaves]),
            "constrained": forced[paths].any(axis=1),
            "stop_reason": forest.table.column("stop_reason").take(pa.array(leaves)),
            "success": forest.success[leaves],
            "reward": forest.returns[leaves].astype(np.float32),
        },
        schema=TOKENS_SCHEMA,
    )


def path_temperature(temperature: np.ndarray, steps: np.ndarray, depth: np.ndarray) -> pa.Array:
    """Per path, the temperature all its steps were sampled at (null where they differ)."""
    on_path = np.arange(steps.shape[1])[None, :] < depth[:, None]
    first = temperature[steps[:, 0]]
    same = ((temperature[steps] == first[:, None]) | ~on_path).all(axis=1)
    return pa.array(first, pa.float32(), mask=~same)


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
