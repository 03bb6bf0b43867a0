"""A progress bar for tasks (rich), with running counts of nodes and solved tasks."""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from thicket.logs import under_progress_bar


class TaskProgress:
    """The bar, shown where stderr is a terminal (and `enabled`); while it is shown, text logs
    keep to warnings and errors (thicket.logs.under_progress_bar)."""

    def __init__(self, total: int, done: int = 0, enabled: bool = True, console: Console | None = None) -> None:
        self.nodes = 0
        self.solved = 0
        console = console or Console(file=sys.stderr)
        self.shown = enabled and console.is_terminal
        self._logs = contextlib.ExitStack()
        self._progress = Progress(
            TextColumn("[bold]trees"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[nodes]} nodes, {task.fields[solved]} solved"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not self.shown,
            transient=False,
        )
        self._task = self._progress.add_task("trees", total=total, completed=done, nodes=0, solved=0)

    def __enter__(self) -> TaskProgress:
        self._progress.start()
        if self.shown:  # rich's stderr proxy (once started) prints log lines above the bar
            self._logs.enter_context(under_progress_bar(sys.stderr if sys.stderr is not sys.__stderr__ else None))
        return self

    def __exit__(self, *exc: object) -> None:
        self._logs.close()
        self._progress.stop()

    def advance(self, nodes: int, solved: int | bool, trees: int = 1) -> None:
        """`trees` more trees done, holding `nodes` nodes, `solved` of them solved."""
        self.nodes += nodes
        self.solved += int(solved)
        self._progress.update(self._task, advance=trees, nodes=self.nodes, solved=self.solved)
