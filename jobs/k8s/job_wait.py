"""A Job's state, and waiting on a Job: until it ends (`thicket wait-job`, the prefetch Job before
the rollout), or to let a suspended one run; both outlast an API server that stops answering for a
while (a control-plane upgrade, a throttled burst)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from thicket.errors import Unavailable
from thicket.index_sets import parse_index_set
from thicket.k8s.client import Kube, _one_line
from thicket.k8s.names import QUEUE_LABEL

Obj = dict[str, Any]

OUTAGE_S = 900.0  # how long wait-job keeps polling an API server that does not answer


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
