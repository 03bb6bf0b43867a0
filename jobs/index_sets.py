"""Sets of indexes as text, the way Kubernetes writes a Job's completedIndexes and failedIndexes:
'1,3-5,7'. thicket prints task and index sets the same way (`thicket status`, `thicket show`)."""

from __future__ import annotations


def parse_index_set(text: str | None) -> set[int]:
    """'1,3-5,7' (a Job's completedIndexes / failedIndexes) -> {1, 3, 4, 5, 7}."""
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def format_index_set(indexes: set[int] | list[int], limit: int = 8) -> str:
    """{0, 1, 2, 5} -> '0-2,5' (at most `limit` runs, then '…')."""
    runs: list[str] = []
    ordered = sorted(indexes)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs[:limit]) + (",…" if len(runs) > limit else "")
