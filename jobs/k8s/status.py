"""A sweep's state on the cluster, read through the API's paged lists: per-index status (`thicket
status`) and the pod of an index (`thicket logs`). Why each index is where it is comes from
thicket.k8s.pod_reasons; thicket.k8s.status_view prints it."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from thicket.errors import BadInput
from thicket.index_sets import parse_index_set
from thicket.k8s.client import Forbidden, Kube, _one_line
from thicket.k8s.job_wait import finished, job_state
from thicket.k8s.names import COMPONENT_LABEL, SPEC_KEY, SWEEP_LABEL
from thicket.k8s.pod_reasons import (
    IndexRow,
    IndexState,
    current_pod,
    index_rows,
    parse_time,
    phase,
    pod_index,
    pod_name,
)
from thicket.k8s.resume_indexes import RESUMED_INDEXES, index_map
from thicket.k8s.status_view import SweepStatus
from thicket.k8s.workload_status import QueueState, queue_state
from thicket.spec import SweepSpec

Obj = dict[str, Any]


WARNING_EVENTS = "involvedObject.kind=Pod,type=Warning"
PER_POD_EVENTS = 10  # up to this many pods needing a reason: one Event query each; above, one paged list


def sweep_jobs(kube: Kube, namespace: str, sweep: str) -> dict[str, Obj]:
    jobs = kube.list("Job", namespace, f"{SWEEP_LABEL}={sweep}")
    found = {(j["metadata"].get("labels") or {}).get(COMPONENT_LABEL, ""): j for j in jobs}
    if "rollout" not in found and "prefetch" in found:
        prefetch = found["prefetch"]
        raise BadInput(f"sweep {sweep!r} has no rollout yet: job/{prefetch['metadata']['name']} is filling the model "
                       f"cache ({job_state(prefetch)}); `thicket submit` creates the rollout once it completes")
    if "rollout" not in found:
        raise BadInput(f"no sweep {sweep!r} in namespace {namespace!r}: submit it with `thicket submit SPEC`, or pass -n NAMESPACE")
    return found


def warning_events(kube: Kube, namespace: str, pods: list[Obj] | None = None) -> tuple[list[Obj], str | None]:
    """Warning Events about the sweep's pods that need one to say why they wait (the current pod of an
    index that is not Running or done; every pod when `pods` is None), and why there are none when they
    cannot be read. A few pods: one query each (fieldSelector involvedObject.name); more: the
    namespace's Warning Events about pods, paged, kept only for those pods."""
    try:
        if pods is None:
            return kube.list("Event", namespace, "", fields=WARNING_EVENTS), None
        wanted = {pod_name(p) for p in pods if phase(p) not in ("Running", "Succeeded")}
        if not wanted:
            return [], None
        if len(wanted) <= PER_POD_EVENTS:
            events = [e for name in sorted(wanted)
                      for e in kube.list("Event", namespace, "", fields=f"involvedObject.name={name},{WARNING_EVENTS}")]
            return events, None
        return [e for e in kube.list("Event", namespace, "", fields=WARNING_EVENTS)
                if (e.get("involvedObject") or {}).get("name") in wanted], None
    except Forbidden as err:  # a Role from before thicket read Events: the pods still tell most
        return [], f"{_one_line(str(err))[:200]}; apply k8s/rbac.yaml"


def current_pods(pods: list[Obj]) -> list[Obj]:
    """Each index's current pod (thicket.k8s.pod_reasons.current_pod): the ones a reason is read for."""
    by_index: dict[int, list[Obj]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        if (index := pod_index(pod)) is not None:
            by_index.setdefault(index, []).append(pod)
    return [p for group in by_index.values() if (p := current_pod(group)) is not None]


def idle_reason(job: Obj, queue: QueueState | None = None) -> str:
    """Why an index of the Job has no pod (for a queued Job, its Kueue Workload's reason)."""
    state = job_state(job)
    if state == "Suspended":
        return (queue.reason() if queue else None) or "the job is suspended"
    if finished(job):
        return f"not run: the job is {state}"
    return f"no pod yet (parallelism {(job.get('spec') or {}).get('parallelism', '?')})"


def sweep_spec_from_cluster(kube: Kube, namespace: str, sweep: str) -> SweepSpec | None:
    import yaml

    from thicket.spec import parse_spec

    maps = kube.list("ConfigMap", namespace, f"{SWEEP_LABEL}={sweep},{COMPONENT_LABEL}=spec")
    if not maps:
        return None
    return parse_spec(yaml.safe_load(maps[0]["data"][SPEC_KEY]), f"configmap/{maps[0]['metadata']['name']}")


def committed_count(spec: SweepSpec) -> int:
    """Committed tasks of the spec's range, from the commit markers' names (a listing, no reads)."""
    from thicket.shards.storage import commit_key
    from thicket.storage import open_store

    settings = spec.storage.settings() if hasattr(spec, "storage") else None
    store = open_store(spec.sweep_uri, settings) if settings is not None else open_store(spec.sweep_uri)
    prefix = commit_key(0).rsplit("/", 1)[0] + "/"
    pattern = re.compile(r"task-(\d+)\.json$")
    tasks = {int(m.group(1)) for key in store.list(prefix) if (m := pattern.search(key))}
    return sum(1 for task in tasks if spec.tasks.start <= task < spec.tasks.stop)


def sweep_status(kube: Kube, namespace: str, sweep: str, storage: bool = True) -> SweepStatus:
    jobs = sweep_jobs(kube, namespace, sweep)
    job = jobs["rollout"]
    spec_obj, status = job.get("spec") or {}, job.get("status") or {}
    completions = int(spec_obj.get("completions") or 0)
    pods = kube.list("Pod", namespace, f"{SWEEP_LABEL}={sweep},{COMPONENT_LABEL}=rollout")  # paged
    events, events_note = warning_events(kube, namespace, current_pods(pods))
    queue = queue_state(kube, job)
    rows = index_rows(completions, parse_index_set(status.get("completedIndexes")),
                      parse_index_set(status.get("failedIndexes")), pods, events, idle_reason(job, queue))
    rows = sweep_index_rows(job, rows)
    result = SweepStatus(
        sweep=sweep, namespace=namespace, job=job["metadata"]["name"], state=job_state(job), completions=completions,
        indexes={str(state): {row.index for row in rows if row.state is state} for state in IndexState},
        started=parse_time(status.get("startTime")), ended=parse_time(status.get("completionTime")),
        rows=rows, events_note=events_note, queue=queue,
        resumed=(job["metadata"].get("annotations") or {}).get(RESUMED_INDEXES),
    )
    if finished(job) and result.ended is None:
        times = [parse_time(c.get("lastTransitionTime")) for c in status.get("conditions") or [] if c.get("status") == "True"]
        result.ended = max((t for t in times if t), default=None)
    spec = sweep_spec_from_cluster(kube, namespace, sweep)
    if spec is not None:
        result.tasks_total, result.sweep_uri = spec.tasks.count, spec.sweep_uri
        if storage:
            try:
                result.tasks_committed = committed_count(spec)
            except Exception as err:  # storage unreachable from here: the Job's view still stands
                result.storage_note = _one_line(str(err))[:200]
        else:
            result.storage_note = "storage not read"
    if "aggregate" in jobs:
        agg = jobs["aggregate"]
        state = job_state(agg)
        result.aggregate = f"job {agg['metadata']['name']}: " + (
            "waiting for the rollout" if state in ("Running", "Pending", "Suspended") and not finished(job) else state
        )
    return result


def sweep_index_rows(job: Obj, rows: list[IndexRow]) -> list[IndexRow]:
    """The rows of a resumed Job (thicket.k8s.resume_indexes) named by the sweep's index, not the Job's
    completion index: what the user's spec, the shards and `thicket logs --index` number by."""
    mapping = index_map(job)
    if mapping is None:
        return rows
    return [replace(row, index=mapping[row.index]) if row.index < len(mapping) else row for row in rows]


def completion_index(job: Obj, sweep: str, index: int) -> int:
    """The completion index that runs the sweep's `index` in `job` (a resumed Job runs a subset of them)."""
    completions = int((job.get("spec") or {}).get("completions") or 0)
    mapping = index_map(job)
    if mapping is None:
        if not 0 <= index < completions:
            raise BadInput(f"--index: {index} is outside 0-{completions - 1} for sweep {sweep!r}")
        return index
    if index not in mapping:
        raise BadInput(f"--index: sweep index {index} is not run by the resumed job/{job['metadata']['name']} "
                       f"(it runs the sweep's indexes {(job['metadata'].get('annotations') or {}).get(RESUMED_INDEXES)}; "
                       "the others finished before it, with the earlier Job)")
    return mapping.index(index)


def index_pod(kube: Kube, namespace: str, sweep: str, index: int) -> Obj:
    """The latest pod of the sweep's `index` (for a resumed Job, the pod of the completion index that runs it)."""
    job = sweep_jobs(kube, namespace, sweep)["rollout"]
    wanted, index = index, completion_index(job, sweep, index)
    selector = f"{SWEEP_LABEL}={sweep},{COMPONENT_LABEL}=rollout,batch.kubernetes.io/job-completion-index={index}"
    pods = [p for p in kube.list("Pod", namespace, selector) if pod_index(p) == index]
    if not pods:
        raise BadInput(f"--index: no pod for index {wanted} of sweep {sweep!r} yet (see `thicket status {sweep}`)")
    return max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
