"""`thicket pull`: copy a sweep's committed objects to a local folder, verified and resumable.

Copied: spec.yaml, every commit marker with the shard it points to (a batch file once, with
all of its markers), and everything under datasets/. Each shard's SHA-256 is checked against its marker before it is written, and a marker
is written only after its shard, so the folder is always a valid local sweep. Files already there
with the right checksum (shards) or size (the rest) are skipped; every write goes to a temporary
name and is renamed into place, so an interrupted pull just resumes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from thicket.errors import BadInput
from thicket.shards.storage import COMMITS, CommitMarker, mismatch
from thicket.storage import open_store
from thicket.storage.store import LocalStore, Store, StoreError

DATASETS = "datasets/"
SPEC = "spec.yaml"
SUCCESS = "_SUCCESS.json"
PARALLEL = 8


def plural(count: int, noun: str) -> str:
    """'1 object', '2 objects'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


@dataclass(frozen=True)
class Item:
    """One object to copy; `sha256` is known for shards, `size` for everything."""

    key: str
    size: int
    sha256: str | None = None
    then: tuple[tuple[str, bytes], ...] = ()  # commit markers to write once this shard is in place


@dataclass
class PullReport:
    dest: Path
    copied: int = 0
    skipped: int = 0
    bytes: int = 0
    shards: int = 0  # verified, whether copied or already present
    corrupt: list[str] = field(default_factory=list)
    datasets: dict[str, int] | None = None  # rows per dataset, from datasets/_SUCCESS.json

    def line(self) -> str:
        return (
            f"pulled {plural(self.copied, 'object')} ({self.bytes / 1e6:.1f} MB), {self.skipped} already present; "
            f"{plural(self.shards, 'committed shard')} verified -> {self.dest}"
        )

    def lines(self) -> list[str]:
        """The summary, then the datasets pulled (their rows) and which are empty (no files to load)."""
        if self.datasets is None:
            return [self.line()]
        full = [f"{name} {rows}" for name, rows in self.datasets.items() if rows]
        none = [name for name, rows in self.datasets.items() if not rows]
        out = [self.line(), f"datasets {self.dest / DATASETS} (rows): {', '.join(full) or 'none'}"]
        return out + ([f"empty (no rows, no files): {', '.join(none)}"] if none else [])


def pull_sweep(uri: str, dest: Path, progress: bool = True) -> PullReport:
    src = open_store(uri)
    src.check()
    dst = LocalStore(dest)
    with ThreadPoolExecutor(PARALLEL) as pool:
        items = plan(src, pool)
        if not items:
            raise BadInput(f"{uri}: no committed trees or datasets there")
        make_dest(dest)
        report = PullReport(dst.root)
        with bar(sum(i.size for i in items), len(items), progress) as advance:
            for outcome in pool.map(lambda item: copy_item(src, dst, item), items):
                tally(report, *outcome)
                advance(outcome[0].size)
    report.datasets = pulled_datasets(dst)
    if report.corrupt:
        raise StoreError(
            f"{plural(len(report.corrupt), 'shard')} failed verification and were not written "
            f"(first: {report.corrupt[0]}); the rest was pulled"
        )
    return report


def make_dest(dest: Path) -> None:
    """DEST as a folder this process can write into, else BadInput naming it and why."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
        probe = dest / ".thicket-pull-probe"
        probe.touch()
        probe.unlink()
    except OSError as err:
        raise BadInput(f"{dest}: cannot write the pulled sweep there ({err.strerror or err})") from None


def pulled_datasets(dst: LocalStore) -> dict[str, int] | None:
    """Rows per dataset as the pulled datasets/_SUCCESS.json lists them (None: no datasets there)."""
    key = DATASETS + SUCCESS
    if not dst.exists(key):
        return None
    listed = json.loads(dst.get(key)).get("datasets")
    return {str(name): int(rows) for name, rows in listed.items()} if isinstance(listed, dict) else None


def plan(src: Store, pool: ThreadPoolExecutor) -> list[Item]:
    """Shards (each carrying its marker), datasets/ and spec.yaml, with their expected sizes."""
    marker_keys = [k for k in src.list(COMMITS) if k.endswith(".json")]
    shards = shard_items(zip(marker_keys, src.get_many(marker_keys)))
    extra = list(src.list(DATASETS)) + ([SPEC] if src.exists(SPEC) else [])
    sized = pool.map(lambda k: Item(k, src.size(k)), extra)
    return shards + list(sized)


def shard_items(markers: Iterable[tuple[str, bytes]]) -> list[Item]:
    """One item per data file, carrying the markers that point to it (a batch file: several)."""
    items: dict[str, Item] = {}
    for marker_key, raw in markers:
        marker = CommitMarker.from_json(raw)
        item = items.get(marker.data_key) or Item(marker.data_key, marker.bytes, marker.sha256)
        items[marker.data_key] = replace(item, then=(*item.then, (marker_key, raw)))
    return list(items.values())


def copy_item(src: Store, dst: LocalStore, item: Item) -> tuple[Item, bool, str | None]:
    """(item, copied?, corruption message or None)."""
    copied = False
    if not present(dst, item):
        data = src.get(item.key)
        if item.sha256 is not None and (wrong := mismatch(data, item.sha256)):
            return item, False, f"{item.key}: {wrong}"
        dst.put(item.key, data)
        copied = True
    for marker_key, raw in item.then:
        if not (dst.exists(marker_key) and dst.get(marker_key) == raw):
            dst.put(marker_key, raw)
    return item, copied, None


def present(dst: LocalStore, item: Item) -> bool:
    if not dst.exists(item.key) or dst.size(item.key) != item.size:
        return False
    return item.sha256 is None or mismatch(dst.get(item.key), item.sha256) is None


def tally(report: PullReport, item: Item, copied: bool, corrupt: str | None) -> None:
    if corrupt is not None:
        report.corrupt.append(corrupt)
        return
    report.shards += item.sha256 is not None
    if copied:
        report.copied += 1
        report.bytes += item.size
    else:
        report.skipped += 1


@contextmanager
def bar(total_bytes: int, files: int, enabled: bool) -> Iterator[Callable[[int], None]]:
    console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]pull"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[done]}/{task.fields[files]} files"),
        TimeRemainingColumn(),
        console=console,
        disable=not (enabled and console.is_terminal),
    ) as progress:
        task = progress.add_task("pull", total=total_bytes, done=0, files=files)
        done = 0

        def advance(size: int) -> None:
            nonlocal done
            done += 1
            progress.update(task, advance=size, done=done)

        yield advance
