"""`thicket.load`: one of a sweep's datasets, as exactly the rows its aggregation committed.

    import thicket
    sft = thicket.load("out/my-first-sweep", "sft")                 # a datasets.Dataset
    dpo = thicket.load("s3://bucket/prefix/NAME", "dpo_first_turn")  # straight from storage
    table = thicket.load("out/my-first-sweep", "tokens", format="arrow")  # a pyarrow.Table

The source is a sweep (a local folder, file:// or s3:// URI), its `datasets/` folder, or a folder
`thicket export --format hf` wrote. The rows come from the files `datasets/_SUCCESS.json` lists
(aggregation writes it last), each checked against its SHA-256 and row count, and their sum
against the dataset's count there; anything else is refused (DatasetMismatch), so a trainer never
trains on another sweep's, a half-rewritten or a tampered dataset. Nothing goes through a cache.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from thicket.aggregate.card import default_config
from thicket.errors import BadInput, ThicketError
from thicket.storage import open_store
from thicket.storage.store import Store

if TYPE_CHECKING:
    import datasets

SUCCESS = "_SUCCESS.json"
DATASETS = "datasets/"


class DatasetMismatch(ThicketError):
    """A dataset's files do not hold what its sweep's _SUCCESS.json says they hold."""


@dataclass(frozen=True)
class Manifest:
    """A sweep's datasets/_SUCCESS.json, and where its files are (`prefix` in `store`)."""

    store: Store
    prefix: str  # "datasets/" under a sweep, "" in a datasets folder itself
    rows: dict[str, int]
    files: list[dict[str, Any]]

    @property
    def where(self) -> str:
        return f"{self.store.uri.rstrip('/')}/{self.prefix}"

    def files_of(self, name: str) -> list[dict[str, Any]]:
        return sorted((f for f in self.files if f["path"].startswith(f"{name}/")), key=lambda f: f["path"])


def manifest(source: str) -> Manifest:
    """The _SUCCESS.json of SOURCE (a sweep, or a datasets folder), else BadInput saying why."""
    store = open_store(source)
    for prefix in (DATASETS, ""):
        if not store.exists(prefix + SUCCESS):
            continue
        listed = json.loads(store.get(prefix + SUCCESS))
        return Manifest(store, prefix, dict(listed["datasets"]), list(listed["files"]))
    raise BadInput(f"{source}: no datasets/{SUCCESS} there (a sweep that was aggregated, or its datasets folder): "
                   "run `thicket aggregate` on it, or wait until its aggregation finished")


def verified_bytes(found: Manifest, entry: dict[str, Any]) -> bytes:
    """One listed file's bytes, checked against its SHA-256 and size in the manifest."""
    data = found.store.get(found.prefix + entry["path"])
    if len(data) != entry["bytes"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise DatasetMismatch(f"{found.where}{entry['path']}: its bytes differ from what {SUCCESS} lists "
                              f"({len(data)} bytes, {entry['bytes']} listed): rewritten since, or damaged")
    return data


def load_table(source: str, name: str | None = None) -> pa.Table:
    """Dataset NAME of SOURCE (None: the default, `sft` where it has rows) as one pyarrow Table."""
    found = manifest(source)
    name = name or default_config({n: [f["path"] for f in found.files_of(n)] for n in found.rows})
    if name is None or name not in found.rows:
        known = ", ".join(sorted(found.rows)) or "none"
        raise BadInput(f"dataset {name!r}: not a dataset of {found.where} (it has: {known})")
    tables = []
    for entry in found.files_of(name):
        table = pq.read_table(pa.BufferReader(verified_bytes(found, entry)))
        if table.num_rows != entry.get("rows"):
            raise DatasetMismatch(f"{found.where}{entry['path']}: {table.num_rows} rows, {entry.get('rows')} listed")
        tables.append(table)
    total = sum(t.num_rows for t in tables)
    if total != found.rows[name]:
        raise DatasetMismatch(f"{found.where}: dataset {name!r} has {total} rows in its files, "
                              f"{found.rows[name]} in {SUCCESS}")
    return pa.concat_tables(tables) if tables else empty_table(name)


def empty_table(name: str) -> pa.Table:
    """A dataset the sweep gave no rows: its columns, no rows."""
    from thicket.aggregate.driver import SCHEMAS

    return SCHEMAS[name].empty_table()


def load(source: str, name: str | None = None, *,
         format: Literal["dataset", "arrow"] = "dataset") -> datasets.Dataset | pa.Table:  # noqa: A002
    """Dataset NAME of a sweep, verified (module docstring): a `datasets.Dataset` (TRL's trainers
    take `sft` and `dpo_first_turn` as they are), or with format="arrow" a pyarrow Table."""
    if format not in ("dataset", "arrow"):
        raise BadInput(f"format: {format!r} is not one of dataset, arrow")
    table = load_table(source, name)
    if format == "arrow":
        return table
    try:
        import datasets
    except ImportError:
        raise BadInput("thicket.load(..., format='dataset') needs the `datasets` package "
                       "(pip install 'thicket[train]'), or use format='arrow'") from None
    return datasets.Dataset(table)


def export_hub_folder(source: str, dest: Path) -> dict[str, int]:
    """Write SOURCE's datasets folder to DEST as a Hugging Face Hub dataset repository holds it: the
    card (README.md, whose `configs:` name each dataset's parts), the parts, stats.json, report.html
    and _SUCCESS.json, every file verified first. DEST must be new or empty. Returns rows per dataset."""
    found = manifest(source)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BadInput(f"-o {dest}: not an empty folder (an export goes to a new or empty one)")
    entries = sorted(found.files, key=lambda f: f["path"])
    for entry in entries:
        write_atomically(dest / entry["path"], verified_bytes(found, entry))
    write_atomically(dest / SUCCESS, found.store.get(found.prefix + SUCCESS))  # last: the folder is whole
    return found.rows


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(data)
    partial.replace(path)
