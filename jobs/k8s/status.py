"""A sweep's state on the cluster: per-index status (`thicket status`), the pod of an index
(`thicket logs`), and waiting for a Job (`thicket wait-job`). Why each index is where it is comes
from thicket.k8s.pod_reasons."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from thicket.errors import BadInput, Unavailable
from thicket.k8s.client import Forbidden, Kube, _one_line
from thicket.k8s.names import COMPONENT_LABEL, QUEUE_LABEL, SPEC_KEY, SWEEP_LABEL
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
from thicket.spec import SweepSpec

Obj = dict[str, Any]


WARNING_EVENTS = "involvedObject.kind=Pod,type=Warning"
ROW_LIMIT = 20  # index rows `thicket status` prints without --all (problem indexes only)
PER_POD_EVENTS = 10  # up to this many pods needing a reason: one Event query each; above, one paged list


# -- status -------------------------------------------------------------------------------------
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


def job_state(job: Obj) -> str:
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") == "True" and condition.get("type") in ("Complete", "Failed", "Suspended"):
            reason = condition.get("reason")
            return condition["type"] + (f" ({reason})" if reason and condition["type"] == "Failed" else "")
    if (job.get("spec") or {}).get("suspend"):
        return "Suspended"
    return "Running" if status.get("active") else "Pending"


def finished(job: Obj) -> bool:
    return job_state(job).split(" ")[0] in ("Complete", "Failed")


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
        }
        return {"summary": summary, "indexes": [row.as_json() for row in self.rows]}


def _seconds(value: float | None) -> int | None:
    return None if value is None else round(value)


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


def idle_reason(job: Obj) -> str:
    """Why an index of the Job has no pod."""
    state = job_state(job)
    if state == "Suspended":
        return "the job is suspended"
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
    rows = index_rows(completions, parse_index_set(status.get("completedIndexes")),
                      parse_index_set(status.get("failedIndexes")), pods, events, idle_reason(job))
    result = SweepStatus(
        sweep=sweep, namespace=namespace, job=job["metadata"]["name"], state=job_state(job), completions=completions,
        indexes={str(state): {row.index for row in rows if row.state is state} for state in IndexState},
        started=parse_time(status.get("startTime")), ended=parse_time(status.get("completionTime")),
        rows=rows, events_note=events_note,
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


# -- logs, cancel, wait ---------------------------------------------------------------------
def index_pod(kube: Kube, namespace: str, sweep: str, index: int) -> Obj:
    job = sweep_jobs(kube, namespace, sweep)["rollout"]
    completions = int((job.get("spec") or {}).get("completions") or 0)
    if not 0 <= index < completions:
        raise BadInput(f"--index: {index} is outside 0-{completions - 1} for sweep {sweep!r}")
    selector = f"{SWEEP_LABEL}={sweep},{COMPONENT_LABEL}=rollout,batch.kubernetes.io/job-completion-index={index}"
    pods = [p for p in kube.list("Pod", namespace, selector) if pod_index(p) == index]
    if not pods:
        raise BadInput(f"--index: no pod for index {index} of sweep {sweep!r} yet (see `thicket status {sweep}`)")
    return max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")


OUTAGE_S = 900.0  # how long wait-job keeps polling an API server that does not answer


def wait_job(
    kube: Kube, namespace: str, name: str, timeout_s: float = 0, interval_s: float = 10,
    echo: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic, check: Callable[[], None] | None = None,
    outage_s: float = OUTAGE_S,
) -> str:
    """Poll Job `name` until it is Complete or Failed; returns that state. timeout_s 0: no limit.
    check: called at each poll while the Job runs; raises to stop waiting (a claim that never binds).
    An API server that stays unreachable, or answers 429 or 5xx, past the client's own retries is
    polled again with a backoff for up to outage_s (an upgrade of the control plane, a throttled
    burst) before the wait fails: a waiter that has waited hours should not die of one bad minute."""
    start = clock()
    last = None
    missing_since: float | None = None
    while True:
        job = patient(lambda: kube.get("Job", namespace, name), f"job/{name}", echo, sleep, outage_s)
        if job is None:
            missing_since = missing_since if missing_since is not None else clock()
            if clock() - missing_since > max(120.0, 3 * interval_s):
                raise Unavailable(f"job/{name} does not exist in namespace {namespace!r}")
            line = f"job/{name}: not found yet"
        else:
            missing_since = None
            status = job.get("status") or {}
            done = len(parse_index_set(status.get("completedIndexes"))) if "completedIndexes" in status else status.get("succeeded", 0)
            line = (f"job/{name}: {job_state(job)}, {done} of {(job.get('spec') or {}).get('completions', '?')} completed, "
                    f"{len(parse_index_set(status.get('failedIndexes')))} failed")
            if finished(job):
                echo(line)
                return job_state(job).split(" ")[0]
        if line != last:
            echo(line)
            last = line
        if check is not None:
            check()
        if timeout_s and clock() - start >= timeout_s:
            raise Unavailable(f"job/{name} did not finish within {timeout_s:g} s")
        sleep(interval_s)


def patient(call: Callable[[], Any], what: str, echo: Callable[[str], None] = print,
            sleep: Callable[[float], None] = time.sleep, outage_s: float = OUTAGE_S) -> Any:
    """call(), tried again on Unavailable (429, 5xx or a dropped connection, after the client's own
    retries) with an exponential backoff of up to 60 s, for up to outage_s seconds in all; the
    Retry-After of a 429 is honoured by the client (thicket.k8s.client) within each try."""
    from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential, wait_random

    def said(state: Any) -> None:
        echo(f"{what}: the API server did not answer ({_one_line(str(state.outcome.exception()))[:160]}); "
             f"trying again in {state.upcoming_sleep:.0f} s")

    retrying = Retrying(retry=retry_if_exception_type(Unavailable), stop=stop_after_delay(outage_s),
                        wait=wait_exponential(multiplier=2, max=60) + wait_random(0, 1), sleep=sleep, before_sleep=said, reraise=True)
    return retrying(call)


def release_job(kube: Kube, namespace: str, name: str, queue: str | None = None,
                echo: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
                outage_s: float = OUTAGE_S) -> None:
    """Let a Job created suspended run: `spec.suspend: false`; with a Kueue `queue`, add the queue
    label instead (Kueue admits a labelled suspended Job and unsuspends it itself)."""
    patch: Obj = {"metadata": {"labels": {QUEUE_LABEL: queue}}} if queue else {"spec": {"suspend": False}}
    patient(lambda: kube.patch("Job", namespace, name, patch), f"job/{name}", echo, sleep, outage_s)
    echo(f"job/{name}: released" + (f" to Kueue queue {queue}" if queue else ""))


def stdout_write(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()
