"""Checks of a family's env_args that come from a spec (YAML): a wrong type or range is the
user's mistake, told in one line (BadInput), never a TypeError deep in a loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thicket.errors import BadInput


def int_arg(family: str, name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f">= {low}"
        raise BadInput(f"{family}: env_args.{name} must be an integer {span}, got {value!r}")
    return value


def path_arg(family: str, name: str, value: Any) -> Path | None:
    """A folder's path (~ expanded), or None when not given."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadInput(f"{family}: env_args.{name} must be a folder's path, got {value!r}")
    return Path(value).expanduser()
