"""`thicket aggregate`: committed tree shards -> training datasets, stats and report.

Shards are streamed in batches of consecutive trees (forests), each built in one go;
each dataset goes through a bounded writer.
Dataset parts are written first, then stats.json, report.html and README.md, then stale
objects of an earlier run are deleted, and `datasets/_SUCCESS.json` (every file's SHA-256
and rows) is put last. Everything is sorted and carries no timestamps: a rerun over the
same shards writes the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from thicket.aggregate.chats import Chats
from thicket.aggregate.content import ContentKeys, PairKeys
from thicket.aggregate.dpo import DPO_SCHEMA, FIRST_TURN_SCHEMA, dpo_tables
from thicket.aggregate.forest import Forest
from thicket.aggregate.params import DatasetsSpec, resolve
from thicket.aggregate.quality import quality_line
from thicket.aggregate.card import dataset_card, empty
from thicket.aggregate.report import TaskRow, report_html, task_rows
from thicket.aggregate.revision import REVISION_SCHEMA, revision_table
from thicket.aggregate.sft import FASTCHAT_SCHEMA, SFT_SCHEMA, sft_tables
from thicket.aggregate.source import BATCH_NODES, batches, decode, forests, shards_of
from thicket.aggregate.stats import SweepStats
from thicket.aggregate.tokens import TOKENS_SCHEMA, token_rows
from thicket.aggregate.tree_pages import write_tree_pages
from thicket.aggregate.transfer import pack, unpack
from thicket.aggregate.verifier import Verifier, VerifierConfig
from thicket.aggregate.writer import (
    DATASETS,
    MAX_BYTES,
    MAX_ROWS,
    Datasets,
    Encoding,
    WrittenFile,
    keep_rows,
    put_file,
)
from thicket.errors import BadInput
from thicket.progress import TaskProgress
from thicket.shards.storage import ShardRef, committed_shards
from thicket.storage import open_store
from thicket.storage.store import Store

SUCCESS = "_SUCCESS.json"
# name -> (schema, Parquet encoding): chats repeat their texts a lot; token ids don't.
DATASET_SCHEMAS: dict[str, tuple[pa.Schema, Encoding]] = {
    "sft": (SFT_SCHEMA, Encoding()),
    "sft_fastchat": (FASTCHAT_SCHEMA, Encoding()),
    "dpo": (DPO_SCHEMA, Encoding()),
    "dpo_first_turn": (FIRST_TURN_SCHEMA, Encoding()),
    "revision": (REVISION_SCHEMA, Encoding()),
    "tokens": (TOKENS_SCHEMA, Encoding(dictionary=("stop_reason", "tree_id", "group_id"))),
}
SCHEMAS = {name: schema for name, (schema, _) in DATASET_SCHEMAS.items()}
PREFERENCES = ("dpo", "dpo_first_turn")  # no prompt may carry A over B and B over A


@dataclass(frozen=True)
class AggregateResult:
    sweep_uri: str
    rows: dict[str, int]
    files: list[WrittenFile]
    stats: dict[str, Any]
    llm: bool = True  # the sweep's policy is an LLM (the uniform baseline's samples are not LLM calls)

    def lines(self) -> list[str]:
        s = self.stats
        rate = "n/a" if s["success_rate"] is None else f"{s['success_rate']:.1%}"
        where = f"{self.sweep_uri.rstrip('/')}/{DATASETS}"
        out = [f"datasets     {where}", f"trees        {s['trees']} committed in the sweep, all aggregated ({s['nodes']} nodes, {rate} solved)"]
        for name, rows in sorted(self.rows.items()):
            out.append(f"  {name:<15}{rows} rows{'' if rows else ' (empty: no files)'}")
        return out + [quality_line(s, self.llm), f"report       {where}report.html"]


def read_spec(store: Store) -> dict[str, Any] | None:
    if not store.exists("spec.yaml"):
        return None
    data = yaml.safe_load(store.get("spec.yaml"))
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class Job:
    """What building a forest's rows needs besides the shards (sent to worker processes)."""

    params: DatasetsSpec
    verifier: VerifierConfig | None = None


@dataclass
class TreeOutput:
    """A forest's rows for every dataset, its preference rows' content keys, and its statistics."""

    tables: dict[str, pa.Table]
    stats: SweepStats
    keys: dict[str, PairKeys]
    tasks: list[TaskRow]  # report.html's per-task rows

    def __reduce__(self) -> tuple[Any, ...]:
        """From a worker process with the tables' exact layout (see transfer.py)."""
        return _unpack_output, ({name: pack(t) for name, t in self.tables.items()}, self.stats, self.keys, self.tasks)


def _unpack_output(tables: dict[str, Any], stats: SweepStats, keys: dict[str, PairKeys],
                   tasks: list[TaskRow]) -> TreeOutput:
    return TreeOutput({name: unpack(*packed) for name, packed in tables.items()}, stats, keys, tasks)


_VERIFIERS: dict[VerifierConfig, Verifier] = {}  # one client per process


def build(job: Job, store: Store, group: list[ShardRef]) -> TreeOutput:
    """A group's output, its shards fetched here (in a worker process: each worker fetches
    its own, so reads scale with the workers, as a store's client is bound by one GIL)."""
    return build_forest(job, decode(shards_of(store, group)))


def build_forest(job: Job, forest: Forest) -> TreeOutput:
    """Every dataset's rows for a forest, tree by tree, and its statistics."""
    stats = SweepStats()
    stats.add(forest)
    tables: dict[str, pa.Table | None] = {}
    chats = Chats(forest)  # shared: message texts gathered once per forest
    tables["sft"], tables["sft_fastchat"] = sft_tables(forest, job.params.sft, chats) or (None, None)
    keys: dict[str, PairKeys] = {}
    preferences = dpo_tables(forest, job.params.dpo, chats, ContentKeys.of(forest), stats.same_action_pairs)
    for name, rows in zip(PREFERENCES, preferences):
        tables[name] = None if rows is None else rows.table
        if rows is not None:
            keys[name] = rows.keys
    judge = None
    if job.verifier is not None:
        judge = _VERIFIERS.get(job.verifier) or _VERIFIERS.setdefault(job.verifier, Verifier(job.verifier))
    tables["revision"] = revision_table(forest, job.params.revision, judge, chats)
    tokens = token_rows(forest)
    tables["tokens"] = tokens.table
    stats.tokens_skipped.update(no_token_ids=tokens.no_token_ids, not_append_only=tokens.not_append_only,
                                prefill_unknown=tokens.prefill_unknown)
    if tables["revision"] is not None:
        stats.revision_methods.update(_counts(tables["revision"].column("transition_method")))
    return TreeOutput({k: t for k, t in tables.items() if t is not None}, stats, keys, task_rows(forest))


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    return {item["values"]: item["counts"] for item in pc.value_counts(column).to_pylist()}


def auto_workers(trees: int) -> int:
    """Worker processes: none for small sweeps or few cores, where starting them and shipping
    rows between processes costs more than they save (measured: 2 workers on 2 cores took
    1.8x the CPU time of inline); else one per core but one (the writer's)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 if trees < 64 or cores < 4 else min(cores - 1, 8)


def built(job: Job, store: Store, groups: list[list[ShardRef]], workers: int) -> Iterator[TreeOutput]:
    """Every forest's output, in order: inline, or on `workers` processes a bounded window ahead."""
    if workers == 0:
        yield from (build_forest(job, forest) for forest in forests(store, groups))
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        pending: deque[Future[TreeOutput]] = deque()
        for group in groups:
            pending.append(pool.submit(build, job, store, group))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def aggregate(
    sweep_uri: str,
    overrides: dict[str, dict[str, Any]] | None = None,
    verifier: VerifierConfig | None = None,
    *,
    store: Store | None = None,
    workers: int | None = None,
    max_rows: int = MAX_ROWS,
    max_bytes: int = MAX_BYTES,
    batch_nodes: int = BATCH_NODES,
    progress: bool = False,
) -> AggregateResult:
    """Build every dataset of the sweep at `sweep_uri` (or `store`, when given).
    workers: processes building rows (None: by the sweep's size and the cores; 0: inline);
    batch_nodes: nodes of the consecutive trees built at once (see source.batches);
    progress: a progress bar of the trees read, on a terminal."""
    store = store or open_store(sweep_uri)
    spec = read_spec(store)
    params = resolve(spec.get("datasets") if spec else None, overrides, source=f"{store.uri}/spec.yaml")
    shards = committed_shards(store)
    if not shards:
        raise BadInput(f"{sweep_uri}: no committed trees there (expected the folder of a sweep that ran)")
    store.delete(DATASETS + SUCCESS)  # a reader must not trust a half-rewritten folder
    stats = SweepStats()
    job = Job(params, verifier)
    ledger: dict[str, list[PairKeys]] = {name: [] for name in PREFERENCES}
    kinds: dict[str, list[pa.Array]] = {name: [] for name in PREFERENCES}
    tasks: list[TaskRow] = []
    try:
        bar = TaskProgress(total=len(shards), enabled=progress)
        with Datasets(store, DATASET_SCHEMAS, max_rows, max_bytes) as datasets, bar:
            n_workers = auto_workers(len(shards)) if workers is None else workers
            for output in built(job, store, batches(shards, batch_nodes), n_workers):
                stats.merge(output.stats)
                tasks += output.tasks
                datasets.add(output.tables)
                for name, keys in output.keys.items():
                    ledger[name].append(keys)
                    kinds[name].append(output.tables[name].column("kind").combine_chunks())
                bar.advance(output.stats.nodes, output.stats.solved_trees, trees=output.stats.trees)
            parts = datasets.close()
    finally:
        for judge in _VERIFIERS.values():
            judge.close()
        _VERIFIERS.clear()
    rows = datasets.rows
    dropped = {name: drop_disagreeing(store, parts, rows, name, ledger[name], kinds, stats) for name in PREFERENCES}
    summary = {**stats.to_json(rows), "preference_rows_dropped": dropped,
               "source_shards_sha256": _sources_digest(shards)}
    sweep = str(spec.get("name", store.uri)) if spec else store.uri
    files = [f for name in sorted(parts) for f in parts[name]]
    card = dataset_card(sweep, spec, rows, _paths(parts), params.model_dump(), SCHEMAS, summary["reward_semantics"],
                        summary["data_sources"])
    pages, page_files = write_tree_pages(store, [row.task for row in tasks])
    files += page_files + [
        put_file(store, "stats.json", (json.dumps(summary, indent=1, sort_keys=True) + "\n").encode()),
        put_file(store, "report.html", report_html(summary, sweep, sorted(tasks, key=lambda row: row.task), store.uri,
                                                   pages).encode()),
        put_file(store, "README.md", card.encode()),
    ]
    _finish(store, files, rows, params)
    llm = not spec or (spec.get("policy") or {}).get("kind") != "uniform"
    return AggregateResult(store.uri, rows, files, summary, llm)


def drop_disagreeing(store: Store, parts: dict[str, list[WrittenFile]], rows: dict[str, int], name: str,
                     keys: list[PairKeys], kinds: dict[str, list[pa.Array]], stats: SweepStats) -> dict[str, int]:
    """Across the whole sweep, drop the preference rows whose two sides another row prefers the
    other way round (both), and the repeats of a row (all but the first); rewrite the parts
    that lose rows, and count the kept rows' kinds. {contradicting, repeated}: rows dropped."""
    keep, contradicting, repeated = PairKeys.concat(keys).verdict()
    if not keep.all():
        parts[name] = keep_rows(store, parts[name], keep, DATASET_SCHEMAS[name][1])
        rows[name] = int(keep.sum())
    if name == "dpo" and len(keep):
        stats.dpo_kinds = Counter(pa.concat_arrays(kinds[name]).filter(pa.array(keep)).to_pylist())
    return {"contradicting": contradicting, "repeated": repeated}


def _sources_digest(shards: list[ShardRef]) -> str:
    """One digest of every shard read: equal digests, equal inputs."""
    return hashlib.sha256("".join(f"{s.data_key}:{s.sha256}\n" for s in shards).encode()).hexdigest()


def _paths(parts: dict[str, list[WrittenFile]]) -> dict[str, list[str]]:
    return {name: [f.path for f in files] for name, files in parts.items()}


def _finish(store: Store, files: list[WrittenFile], rows: dict[str, int], params: DatasetsSpec) -> None:
    """Delete what an earlier run left that this one did not write, then commit the manifest."""
    written = {DATASETS + f.path for f in files}
    for key in list(store.list(DATASETS)):
        if key not in written:
            store.delete(key)
    manifest = {
        "datasets": {name: rows[name] for name in sorted(rows)},
        "empty": empty(rows),  # no rows, so no files and no config in README.md
        "files": [f.to_json() for f in sorted(files, key=lambda f: f.path)],
        "params": params.model_dump(),
    }
    store.put(DATASETS + SUCCESS, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
