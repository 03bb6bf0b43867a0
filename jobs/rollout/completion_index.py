"""Which index of a sweep a worker pod runs.

An Indexed Job numbers its pods 0..completions-1 and sets JOB_COMPLETION_INDEX in each
(https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode). A Job's completions
cannot skip indexes, so `thicket submit --resume` creates a Job of only the unfinished indexes and
hands the worker their list in THICKET_INDEX_MAP ('3,7-9', the way Kubernetes writes
completedIndexes): completion index i runs the sweep's index sorted(map)[i].
"""

from __future__ import annotations

from collections.abc import Mapping

from thicket.errors import BadInput
from thicket.index_sets import parse_index_set

COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
INDEX_MAP_ENV = "THICKET_INDEX_MAP"


def mapped_indexes(text: str) -> list[int]:
    """The sweep indexes of a resumed Job, in completion-index order; bad text names the variable."""
    try:
        indexes = sorted(parse_index_set(text))
    except ValueError:
        raise BadInput(f"{INDEX_MAP_ENV}: {text!r} is not an index set such as '3,7-9'") from None
    if not indexes:
        raise BadInput(f"{INDEX_MAP_ENV}: empty; a resumed Job runs at least one index")
    return indexes


def sweep_index(env: Mapping[str, str]) -> int:
    """The sweep index this pod runs: JOB_COMPLETION_INDEX, through THICKET_INDEX_MAP when it is set."""
    raw = env.get(COMPLETION_INDEX_ENV)
    if raw is None or not raw.isdigit():
        raise BadInput(f"--index: not given and {COMPLETION_INDEX_ENV} is not set to a number")
    completion = int(raw)
    text = env.get(INDEX_MAP_ENV)
    if not text:
        return completion
    indexes = mapped_indexes(text)
    if completion >= len(indexes):
        raise BadInput(f"{COMPLETION_INDEX_ENV}: {completion} is outside the {len(indexes)} indexes of "
                       f"{INDEX_MAP_ENV} ({text})")
    return indexes[completion]
