"""A bench's figures, kept step by step: beside each step's output in its work folder, and under a
record folder in the repository at the same relative path, so that a later session on another
machine, whose work folder is gone, takes them instead of measuring them again."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Kept:
    work: Path
    record: Path | None = None

    def recorded(self, path: Path) -> Path | None:
        """Where `path` (in the work folder) is recorded; None where nothing is."""
        if self.record is None or not path.is_relative_to(self.work):
            return None
        return self.record / path.relative_to(self.work)

    def copies(self, path: Path) -> list[Path]:
        recorded = self.recorded(path)
        return [path] if recorded is None else [path, recorded]

    def figures(self, path: Path, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """make()'s figures, kept in `path` and recorded: a rerun takes them instead of making them."""
        there = [copy for copy in self.copies(path) if copy.is_file()]
        figures = json.loads(there[0].read_text()) if there else make()
        for copy in self.copies(path):
            if not copy.is_file():
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_text(json.dumps(figures, default=str) + "\n")
        return figures

    def has(self, path: Path) -> bool:
        return any(copy.is_file() for copy in self.copies(path))

    def forget(self, path: Path) -> None:
        for copy in self.copies(path):
            copy.unlink(missing_ok=True)
