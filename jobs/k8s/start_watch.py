"""Start-up watching: a rollout pod bound to a node whose worker has not started within
cluster.start_allowance_s (an image that is not pulled, a Secret or volume that does not mount) holds
its GPU for nothing, and only the pod's activeDeadlineSeconds would end it.

Two watchers use it: the canary (thicket.k8s.canary, index 0 while `submit` waits) and the
aggregation's waiter (`thicket wait-job --start-watchdog`), which runs in the cluster for the whole
sweep. The waiter's watchdog stops the Job (suspends it, or deactivates its Kueue Workload) when a pod
is late before any worker of the Job ever started, a fault every pod meets; once a worker has run, a
late pod is a fault of its node and is evicted (the Eviction API,
https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/): the pod gets the
DisruptionTarget condition, which the rollout Job's podFailurePolicy ignores, so the index runs again
without counting a failure (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thicket.errors import ThicketError
from thicket.k8s.names import WORKER
from thicket.k8s.status_view import format_duration

Obj = dict[str, Any]

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def disrupted(pod: Obj) -> bool:
    """The pod has the DisruptionTarget condition: preempted, evicted or drained, not its own fault
    (the rollout Job's Ignore rule does not count it either)."""
    return any(c.get("type") == "DisruptionTarget" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def worker_started(pod: Obj) -> bool:
    state = next((s.get("state") or {} for s in (pod.get("status") or {}).get("containerStatuses") or []
                  if s.get("name") == WORKER), {})
    return "running" in state or "terminated" in state


class StartWatch:
    """Pods bound to a node (status.startTime: time waiting for a GPU is not counted) whose worker has
    not started within the allowance, timed from when this watcher first saw them started."""

    def __init__(self, allowance_s: float, clock: Callable[[], float]) -> None:
        self.allowance_s, self.clock = allowance_s, clock
        self.seen: dict[str, float] = {}  # pod name -> when the watcher first saw it started

    def late_pods(self, pods: list[Obj]) -> list[Obj]:
        late = []
        for pod in pods:
            if not (pod.get("status") or {}).get("startTime") or worker_started(pod) or disrupted(pod):
                continue
            first = self.seen.setdefault(pod["metadata"]["name"], self.clock())
            if self.clock() - first >= self.allowance_s:
                late.append(pod)
        return late

    def late(self, pods: list[Obj]) -> str | None:
        """Why the first late pod is late, or None."""
        return self.reason() if self.late_pods(pods) else None

    def reason(self) -> str:
        return f"no worker running {format_duration(self.allowance_s)} after the pod started (cluster.start_allowance_s)"


class StartupWatchdog:
    """The waiter's watchdog over the rollout Job `job` (see the module's docstring)."""

    def __init__(self, kube: Any, namespace: str, job: str, allowance_s: float, clock: Callable[[], float],
                 echo: Callable[[str], None] = print) -> None:
        self.kube, self.namespace, self.job, self.echo = kube, namespace, job, echo
        self.watch = StartWatch(allowance_s, clock)
        self.a_worker_ran = False
        self.evicted: set[str] = set()

    def check(self) -> None:
        """One look at the Job's pods; raises ThicketError once it stopped the Job."""
        pods = [p for p in self.kube.list("Pod", self.namespace, f"{JOB_NAME_LABEL}={self.job}")
                if p["metadata"]["name"] not in self.evicted]
        self.a_worker_ran = self.a_worker_ran or any(worker_started(p) for p in pods)
        late = self.watch.late_pods(pods)
        if not late:
            return
        if not self.a_worker_ran:
            self.stop(late[0])
        for pod in late:
            name = pod["metadata"]["name"]
            self.kube.evict(self.namespace, name)
            self.evicted.add(name)
            self.echo(f"job/{self.job}: start-up watchdog: evicted pod {name}: {self.watch.reason()}; its index "
                      "runs again (DisruptionTarget: not counted)")

    def stop(self, pod: Obj) -> None:
        from thicket.k8s.kueue import stop

        live = self.kube.get("Job", self.namespace, self.job)
        how = stop(self.kube, live) if live is not None else "the Job is gone"
        raise ThicketError(
            f"start-up watchdog: job/{self.job} pod {pod['metadata']['name']}: {self.watch.reason()}, and no worker "
            f"of the Job has started: a fault every pod meets (an image, a Secret, a volume); {how}. "
            f"See `kubectl describe pod {pod['metadata']['name']}`, fix it, then `thicket cancel` and submit again"
        )
