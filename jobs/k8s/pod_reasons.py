"""Why each index of a sweep is where it is (`thicket status`): one row per index, from the index's
pods (conditions, container states, restarts, the worker's exit code and termination message) and
the namespace's Warning Events about those pods."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from enum import StrEnum
from typing import Any

from thicket.errors import ExitCode
from thicket.k8s.names import WORKER

Obj = dict[str, Any]


INDEX_KEY = "batch.kubernetes.io/job-completion-index"
DETAIL_LIMIT = 300


class IndexState(StrEnum):
    """An index's state, in the order `thicket status` counts them."""

    COMPLETED = "completed"
    FAILED = "failed"
    RUNNING = "running"
    PENDING = "pending"
    WAITING = "waiting"


WORKER_EXITS: dict[int, str] = {
    ExitCode.OK: "ok",
    ExitCode.FAILED: "failed: a bug or an unrecoverable fault",
    ExitCode.BAD_INPUT: "bad input: the spec or flags are wrong; not retried",
    ExitCode.UNAVAILABLE: "unavailable: vLLM, an env server or storage did not answer in time; retried",
    ExitCode.DEADLINE: "deadline: the index's deadline passed with tasks left; a rerun resumes",
}
SIGNALS = {9: "killed (SIGKILL)", 15: "terminated (SIGTERM)"}
OOM_KILLED = "OOMKilled"
WAITING_WHILE_STARTING = {"ContainerCreating", "PodInitializing"}
# Waiting reasons that do not pass by themselves: a canary stops at them (thicket submit --canary).
FATAL_WAITING = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "CreateContainerConfigError",
                           "CreateContainerError", "CrashLoopBackOff"})


def exit_meaning(code: int, reason: str | None = None) -> str:
    """What the worker's exit code means (thicket.errors.ExitCode, or a signal)."""
    if reason == OOM_KILLED:
        return "OOMKilled: out of memory, over the container's memory limit"
    if code in WORKER_EXITS:
        return WORKER_EXITS[code]
    if code > 128:
        return SIGNALS.get(code - 128, f"killed by signal {code - 128}")
    return "an exit code thicket does not use"


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def last_line(text: str | None) -> str | None:
    """The last non-empty line of a termination message, trimmed (None when there is none)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:DETAIL_LIMIT] if lines else None


def one_line(text: str | None) -> str | None:
    """A message on one line (None when there is none)."""
    joined = " ".join((text or "").split())
    return joined[:DETAIL_LIMIT] if joined else None


@dataclass(frozen=True)
class Reason:
    text: str
    detail: str | None = None


@dataclass(frozen=True)
class WorkerExit:
    code: int
    reason: str | None  # the kubelet's: Completed, Error, OOMKilled
    detail: str | None  # the last line of the termination message (FallbackToLogsOnError)

    @property
    def meaning(self) -> str:
        return exit_meaning(self.code, self.reason)

    def text(self) -> str:
        return f"worker exit {self.code} ({self.meaning})"


@dataclass(frozen=True)
class IndexRow:
    index: int
    state: IndexState
    reason: str
    detail: str | None = None
    restarts: int = 0  # container restarts in the index's current pod
    attempts: int = 0  # the index's pods so far (retries with backoffLimitPerIndex make more)
    exit: WorkerExit | None = None  # the worker's last exit, in this pod or an earlier one
    pod: str | None = None
    problem: bool = False  # failed, retrying, restarting or stuck: shown by `thicket status` without --all

    def line(self) -> str:
        parts = [self.reason + (f": {self.detail}" if self.detail else "")]
        if self.exit is not None and self.state in (IndexState.RUNNING, IndexState.PENDING):
            parts.append(f"last worker exit {self.exit.code} ({self.exit.meaning})")
        if self.restarts:
            parts.append(f"{self.restarts} restart{'s' if self.restarts != 1 else ''}")
        if self.attempts > 1:
            parts.append(f"attempt {self.attempts}")
        return f"{self.index:>5}  {self.state:<9}  " + "; ".join(parts)

    def as_json(self) -> Obj:
        return {
            "index": self.index, "state": str(self.state), "reason": self.reason, "restarts": self.restarts,
            "exit_code": self.exit.code if self.exit else None, "exit_meaning": self.exit.meaning if self.exit else None,
            "detail": self.detail, "pod": self.pod, "attempts": self.attempts,
        }


# -- reading a pod ------------------------------------------------------------------------------
def pod_index(pod: Obj) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(INDEX_KEY) or (meta.get("annotations") or {}).get(INDEX_KEY)
    return int(raw) if raw is not None and str(raw).isdigit() else None


def pod_name(pod: Obj) -> str:
    return pod["metadata"]["name"]


def phase(pod: Obj) -> str:
    return (pod.get("status") or {}).get("phase") or "Pending"


def deleting(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def container_statuses(pod: Obj) -> list[Obj]:
    """Init containers (the sidecars) first, then the worker."""
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def restarts(pod: Obj) -> int:
    return sum(int(c.get("restartCount") or 0) for c in container_statuses(pod))


def worker_exit(pod: Obj) -> WorkerExit | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") != WORKER:
            continue
        done = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
        if done and done.get("exitCode") is not None:
            return WorkerExit(int(done["exitCode"]), done.get("reason"), last_line(done.get("message")))
    return None


def unschedulable(pod: Obj) -> Reason | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return Reason(condition.get("reason") or "not scheduled", one_line(condition.get("message")))
    return None


def stuck_container(pod: Obj) -> Reason | None:
    """A container waiting for a reason other than starting up: ImagePullBackOff, CrashLoopBackOff, ..."""
    for status in container_statuses(pod):
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] not in WAITING_WHILE_STARTING:
            last = (status.get("lastState") or {}).get("terminated")
            before = f"last exit {last.get('exitCode')} ({last.get('reason')})" if last else None
            detail = "; ".join(filter(None, (before, one_line(waiting.get("message")))))
            return Reason(f"{status['name']}: {waiting['reason']}", detail or None)
    return None


def unready_sidecar(pod: Obj) -> Reason | None:
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if (status.get("state") or {}).get("running") is not None and not status.get("ready"):
            return Reason(f"waiting for {status['name']} to become ready")
    return None


def restarted_container(pod: Obj) -> Reason | None:
    for status in container_statuses(pod):
        last = (status.get("lastState") or {}).get("terminated")
        count = int(status.get("restartCount") or 0)
        if count and last:
            how = last.get("reason") or f"exit {last.get('exitCode')}"
            return Reason(f"{status['name']} restarted (last: {how})", last_line(last.get("message")))
    return None


def failed_pod(pod: Obj) -> Reason | None:
    """Why a pod failed without its worker exiting: evicted, deadline, preempted."""
    status = pod.get("status") or {}
    if status.get("reason"):
        return Reason(f"pod {status['reason']}", one_line(status.get("message")))
    return None


def starting(pod: Obj) -> Reason:
    for status in container_statuses(pod):
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return Reason(f"{status['name']}: {waiting['reason']}")
    scheduled = any(c.get("type") == "PodScheduled" and c.get("status") == "True"
                    for c in (pod.get("status") or {}).get("conditions") or [])
    return Reason("starting" if scheduled else "not scheduled yet")


def event_reason(event: Obj | None) -> Reason | None:
    if event is None:
        return None
    return Reason(f"event {event.get('reason') or 'Warning'}", one_line(event.get("message")))


def event_time(event: Obj) -> datetime:
    text = event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get("creationTimestamp")
    return parse_time(text) or datetime.min.replace(tzinfo=timezone.utc)


def latest_warnings(events: list[Obj]) -> dict[str, Obj]:
    """Pod name -> its latest Warning event."""
    out: dict[str, Obj] = {}
    for event in sorted(events, key=event_time):
        involved = event.get("involvedObject") or {}
        if event.get("type") == "Warning" and involved.get("kind") == "Pod" and involved.get("name"):
            out[involved["name"]] = event
    return out


# -- one row per index --------------------------------------------------------------------------
def first(*reasons: Reason | None) -> Reason | None:
    return next((r for r in reasons if r is not None), None)


def active_reason(pod: Obj, event: Obj | None) -> Reason:
    """A Pending or Running pod: what holds it up, else what it is doing."""
    problem = first(unschedulable(pod), stuck_container(pod), unready_sidecar(pod), restarted_container(pod))
    if problem is not None:
        return problem
    if phase(pod) == "Running":
        return Reason("running")
    return event_reason(event) or starting(pod)


def ended_reason(pod: Obj | None, event: Obj | None, exit_: WorkerExit | None) -> Reason:
    """A pod that ended (or none left): the worker's exit, else the pod's own reason, else an event."""
    if exit_ is not None:
        return Reason(exit_.text(), exit_.detail)
    if pod is None:
        return Reason("no pod left to tell why")
    return first(failed_pod(pod), stuck_container(pod), event_reason(event)) or Reason(f"pod {phase(pod)}")


def last_exit(pods: list[Obj]) -> WorkerExit | None:
    """The worker's last exit over the index's pods (oldest first)."""
    return next((e for e in map(worker_exit, reversed(pods)) if e is not None), None)


def current_pod(pods: list[Obj]) -> Obj | None:
    """The index's newest pod that is not being deleted, else its newest."""
    live = [p for p in pods if not deleting(p)]
    return (live or pods)[-1] if pods else None


def index_state(index: int, completed: set[int], failed: set[int], pod: Obj | None) -> IndexState:
    if index in completed:
        return IndexState.COMPLETED
    if index in failed:
        return IndexState.FAILED
    if pod is None or deleting(pod):
        return IndexState.WAITING
    return {"Running": IndexState.RUNNING, "Pending": IndexState.PENDING,
            "Succeeded": IndexState.COMPLETED}.get(phase(pod), IndexState.WAITING)


def index_reason(state: IndexState, pod: Obj | None, event: Obj | None, exit_: WorkerExit | None, idle: str) -> Reason:
    if pod is not None and state in (IndexState.RUNNING, IndexState.PENDING):
        return active_reason(pod, event)
    if state is IndexState.COMPLETED:
        return Reason("completed")
    if state is IndexState.FAILED:
        return ended_reason(pod, event, exit_)
    if pod is None:
        return Reason(idle)
    if deleting(pod):
        return Reason(f"pod {pod_name(pod)} is terminating")
    ended = ended_reason(pod, event, exit_)
    return Reason(f"awaiting a retry after {ended.text}", ended.detail)


def index_row(index: int, completed: set[int], failed: set[int], pods: list[Obj], warnings: dict[str, Obj],
              idle: str) -> IndexRow:
    """pods: the index's pods, oldest first; idle: why an index without a pod has none."""
    pod = current_pod(pods)
    state = index_state(index, completed, failed, pod)
    exit_ = last_exit(pods)
    event = warnings.get(pod_name(pod)) if pod else None
    reason = index_reason(state, pod, event, exit_, idle)
    return IndexRow(index=index, state=state, reason=reason.text, detail=reason.detail,
                    restarts=restarts(pod) if pod else 0, attempts=len(pods), exit=exit_,
                    pod=pod_name(pod) if pod else None, problem=is_problem(state, pods, pod, event))


def is_problem(state: IndexState, pods: list[Obj], pod: Obj | None, event: Obj | None) -> bool:
    """Failed, awaiting a retry, on a later attempt, restarting, or stuck (unschedulable, a container
    that cannot start, a Warning event while Pending): not an index that is merely starting or running."""
    if state is IndexState.FAILED:
        return True
    if state is IndexState.COMPLETED or pod is None:
        return False
    if state is IndexState.WAITING or len(pods) > 1 or restarts(pod):
        return True
    return bool(unschedulable(pod) or stuck_container(pod) or (phase(pod) == "Pending" and event is not None))


def index_rows(completions: int, completed: set[int], failed: set[int], pods: list[Obj], events: list[Obj],
               idle: str) -> list[IndexRow]:
    """One row per index 0..completions-1; idle: why an index without a pod has none."""
    by_index: dict[int, list[Obj]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        index = pod_index(pod)
        if index is not None:
            by_index.setdefault(index, []).append(pod)
    warnings = latest_warnings(events)
    return [index_row(i, completed, failed, by_index.get(i, []), warnings, idle) for i in range(completions)]
