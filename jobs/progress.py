"""A progress bar for tasks (rich), with running counts of nodes and solved tasks."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TaskProgress:
    def __init__(self, total: int, done: int = 0, enabled: bool = True) -> None:
        self.nodes = 0
        self.solved = 0
        console = Console(file=sys.stderr)
        self._progress = Progress(
            TextColumn("[bold]trees"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[nodes]} nodes, {task.fields[solved]} solved"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not (enabled and console.is_terminal),
            transient=False,
        )
        self._task = self._progress.add_task("trees", total=total, completed=done, nodes=0, solved=0)

    def __enter__(self) -> TaskProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(self, nodes: int, solved: int | bool, trees: int = 1) -> None:
        """`trees` more trees done, holding `nodes` nodes, `solved` of them solved."""
        self.nodes += nodes
        self.solved += int(solved)
        self._progress.update(self._task, advance=trees, nodes=self.nodes, solved=self.solved)
