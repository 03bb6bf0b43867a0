"""`thicket submit --resume`: a rollout Job of only the unfinished indexes.

Finished are the indexes the finished Job lists in status.completedIndexes (through its own index
map, when it was itself a resumed Job) and those whose tasks all have commit markers in storage.
An Indexed Job's completions cannot skip indexes (its pods are 0..completions-1,
https://kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode), so the resumed Job
has completions = the unfinished indexes' count and hands its worker their list in
THICKET_INDEX_MAP (thicket.rollout.completion_index); finished indexes take no node and load no
model again. The Job keeps the rendered template hash: a later plain `submit` of the same spec
leaves it alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from thicket.errors import BadInput
from thicket.index_sets import format_index_set, parse_index_set
from thicket.k8s.client import _one_line
from thicket.k8s.names import WORKER
from thicket.rollout.completion_index import INDEX_MAP_ENV, mapped_indexes
from thicket.spec import SweepSpec

Obj = dict[str, Any]

RESUMED_INDEXES = "thicket.dev/resumed-indexes"  # the Job's annotation: the sweep indexes it runs


@dataclass(frozen=True)
class ResumePlan:
    total: int
    unfinished: list[int]
    by_job: set[int]  # finished per the old Job's completedIndexes
    by_storage: set[int] | None  # finished per commit markers; None when storage was not read
    storage_note: str | None = None

    def line(self, name: str) -> str:
        stored = (f"{len(self.by_storage)} by commit markers" if self.by_storage is not None
                  else f"storage not read: {self.storage_note}")
        return (f"job/{name}: resuming {len(self.unfinished)} of {self.total} indexes "
                f"[{format_index_set(self.unfinished)}] ({len(self.by_job)} finished by the Job, {stored})")


def index_map(job: Obj) -> list[int] | None:
    """The sweep indexes a (resumed) rollout Job runs, from its worker's THICKET_INDEX_MAP; None: 0..completions-1."""
    for container in (job.get("spec") or {}).get("template", {}).get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if container.get("name") == WORKER and env.get("name") == INDEX_MAP_ENV:
                return mapped_indexes(env["value"])
    return None


def job_finished_indexes(live: Obj, total: int) -> set[int]:
    """The sweep indexes finished per the live Job: its completedIndexes (through its index map), and
    for a resumed Job also the indexes it left out, finished before it."""
    done = parse_index_set((live.get("status") or {}).get("completedIndexes"))
    mapping = index_map(live)
    if mapping is None:
        return done
    return (set(range(total)) - set(mapping)) | {mapping[i] for i in done if i < len(mapping)}


def storage_finished_indexes(spec: SweepSpec) -> set[int]:
    """Indexes all of whose tasks have commit markers (one listing of the markers' names)."""
    from thicket.shards.storage import committed_task_ids
    from thicket.storage import open_store

    committed = committed_task_ids(open_store(spec.sweep_uri, spec.storage.settings()))
    return {i for i, tasks in enumerate(spec.tasks.index_ranges()) if set(tasks) <= committed}


def plan(spec: SweepSpec, live: Obj, read_storage: Callable[[SweepSpec], set[int]] = storage_finished_indexes) -> ResumePlan:
    total = len(spec.tasks.index_ranges())
    by_job = job_finished_indexes(live, total)
    try:
        by_storage, note = read_storage(spec), None
    except Exception as err:  # storage unreachable from here: the Job's completedIndexes still stand
        by_storage, note = None, _one_line(str(err))[:200]
    done = by_job | (by_storage or set())
    return ResumePlan(total, [i for i in range(total) if i not in done], by_job, by_storage, note)


def resumed_job(job: Obj, indexes: list[int]) -> Obj:
    """The rendered rollout Job cut to `indexes`: completions their count, the worker told their list."""
    if not indexes:
        raise BadInput(f"--resume: every index of job/{job['metadata']['name']} is finished (completedIndexes and "
                       "commit markers): nothing to rerun; submit without --resume, or `thicket cancel` to start over")
    out = copy.deepcopy(job)
    spec, text = out["spec"], format_index_set(indexes, limit=len(indexes))
    spec["completions"] = len(indexes)
    spec["parallelism"] = min(int(spec.get("parallelism") or 1), len(indexes))
    if "maxFailedIndexes" in spec:  # the API requires maxFailedIndexes <= completions
        spec["maxFailedIndexes"] = min(int(spec["maxFailedIndexes"]), len(indexes))
    out["metadata"].setdefault("annotations", {})[RESUMED_INDEXES] = text
    for container in spec["template"]["spec"]["containers"]:
        if container["name"] == WORKER:
            container.setdefault("env", []).append({"name": INDEX_MAP_ENV, "value": text})
    return out


def clamp_to_live(mutable: Obj, live: Obj) -> Obj:
    """A plain submit's patch of a resumed Job: parallelism and maxFailedIndexes at most its completions."""
    completions = int((live.get("spec") or {}).get("completions") or 0)
    if not (live["metadata"].get("annotations") or {}).get(RESUMED_INDEXES) or not completions:
        return mutable
    return {k: min(v, completions) if k in ("parallelism", "maxFailedIndexes") else v for k, v in mutable.items()}
