"""What `thicket status` prints of a sweep's state: the summary, the progress bar and ETA, one row
per index (problem ones unless --all), or JSON (-o json); and the bytes of `thicket logs`. The state
itself is read in thicket.k8s.status."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from thicket.index_sets import format_index_set
from thicket.k8s.pod_reasons import IndexRow
from thicket.k8s.workload_status import QueueState

Obj = dict[str, Any]

ROW_LIMIT = 20  # index rows `thicket status` prints without --all (problem indexes only)


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@dataclass
class SweepStatus:
    sweep: str
    namespace: str
    job: str
    state: str
    completions: int
    indexes: dict[str, set[int]]  # completed / failed / running / pending / waiting
    started: datetime | None
    ended: datetime | None
    tasks_total: int | None = None
    tasks_committed: int | None = None
    storage_note: str | None = None
    sweep_uri: str | None = None
    aggregate: str | None = None
    rows: list[IndexRow] = field(default_factory=list)  # one per index
    events_note: str | None = None  # why the namespace's Events were not read
    queue: QueueState | None = None  # a queued Job's Kueue Workload conditions
    resumed: str | None = None  # a resumed Job's sweep indexes (thicket.k8s.resume_indexes)
    now: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def fraction(self) -> float:
        if self.tasks_total and self.tasks_committed is not None:
            return min(1.0, self.tasks_committed / self.tasks_total)
        return len(self.indexes["completed"]) / self.completions if self.completions else 0.0

    @property
    def finished(self) -> bool:
        """Nothing more to watch: the rollout Job ended."""
        return self.ended is not None or self.state.split(" ")[0] in ("Complete", "Failed")

    @property
    def elapsed_s(self) -> float | None:
        if self.started is None:
            return None
        return ((self.ended or self.now) - self.started).total_seconds()

    @property
    def eta_s(self) -> float | None:
        f, elapsed = self.fraction, self.elapsed_s
        if self.ended is not None or elapsed is None or f <= 0 or f >= 1:
            return None
        return elapsed * (1 - f) / f

    def summary_lines(self) -> list[str]:
        counts = ", ".join(
            f"{len(v)} {k}" + (f" [{format_index_set(v)}]" if v and k != "waiting" else "")
            for k, v in self.indexes.items() if v
        )
        when = ""
        if self.started is not None:
            when = f", started {self.started:%Y-%m-%d %H:%M:%S}Z, {format_duration(self.elapsed_s or 0)} {'in all' if self.ended else 'ago'}"
        out = [
            f"sweep      {self.sweep} (namespace {self.namespace})",
            f"job        {self.job}: {self.state}{when}",
            f"indexes    {self.completions}: {counts or 'none started'}",
        ]
        if self.tasks_committed is not None:
            out.append(f"tasks      {self.tasks_committed} of {self.tasks_total} committed ({self.fraction:.1%}) in {self.sweep_uri}")
        elif self.storage_note:
            out.append(f"tasks      {self.tasks_total or '?'} in all; committed: unknown ({self.storage_note})")
        if self.resumed:
            out.append(f"resumed    this Job runs the sweep's indexes {self.resumed} (its completion indexes "
                       f"0-{self.completions - 1}); indexes below are the sweep's, the others finished before it")
        if self.queue is not None:
            out.append(self.queue.line())
        if self.aggregate:
            out.append(f"aggregate  {self.aggregate}")
        if self.events_note:
            out.append(f"events     not read ({self.events_note})")
        return out

    def row_lines(self, all_rows: bool = False, limit: int = ROW_LIMIT) -> list[str]:
        """Every index's row (all_rows), else the problem indexes' (failed, retrying, stuck), at most `limit`."""
        rows = self.rows if all_rows else [row for row in self.rows if row.problem]
        shown = rows if all_rows else rows[:limit]
        out = [f"{'index':>5}  {'state':<9}  reason"] if shown else []
        out += [row.line() for row in shown]
        if len(rows) > len(shown):
            out.append(f"… {len(rows) - len(shown)} more problem indexes: `thicket status {self.sweep} --all` lists every index")
        elif not all_rows and self.rows and not rows:
            out.append("no index failed, retrying or stuck (--all lists every index)")
        return out

    def lines(self, all_rows: bool = False, limit: int = ROW_LIMIT) -> list[str]:
        """The summary first, then the index rows (problem ones only unless all_rows)."""
        return self.summary_lines() + self.row_lines(all_rows, limit)

    def as_json(self) -> Obj:
        """`thicket status -o json`: the summary and one entry per index."""
        when = {k: f"{v:%Y-%m-%dT%H:%M:%S}Z" if v else None for k, v in (("started", self.started), ("ended", self.ended))}
        summary = {
            "sweep": self.sweep, "namespace": self.namespace, "job": self.job, "state": self.state,
            "completions": self.completions, **{str(k): len(v) for k, v in self.indexes.items()}, **when,
            "elapsed_s": _seconds(self.elapsed_s), "eta_s": _seconds(self.eta_s), "tasks_total": self.tasks_total,
            "tasks_committed": self.tasks_committed, "storage_note": self.storage_note, "sweep_uri": self.sweep_uri,
            "aggregate": self.aggregate, "events_note": self.events_note,
            "queue": self.queue.line().split(None, 1)[1] if self.queue else None,
        }
        return {"summary": summary, "indexes": [row.as_json() for row in self.rows]}


def _seconds(value: float | None) -> int | None:
    return None if value is None else round(value)


def render_status(status: SweepStatus, crop: bool = False, all_rows: bool = False, limit: int = ROW_LIMIT) -> Any:
    """The summary, a progress bar and ETA, then the index rows (problem ones, at most `limit`, unless
    all_rows), as one rich renderable; crop: cut lines wider than the terminal (--watch) instead of
    wrapping them."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    bar = Table.grid(padding=(0, 1))
    bar.add_column(width=10)
    bar.add_column(width=40)
    bar.add_column()
    total = status.tasks_total if status.tasks_committed is not None else status.completions
    done = status.tasks_committed if status.tasks_committed is not None else len(status.indexes["completed"])
    eta = status.eta_s
    tail = f"{status.fraction:6.1%}" + (f"  ETA {format_duration(eta)}" if eta is not None else "")
    bar.add_row("progress", ProgressBar(total=max(total or 1, 1), completed=done or 0, width=40), tail)

    def text(line: str) -> Any:
        return Text(line, no_wrap=True, overflow="ellipsis") if crop else Text(line)

    return Group(*map(text, status.summary_lines()), bar, *map(text, status.row_lines(all_rows, limit)))


def stdout_write(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
