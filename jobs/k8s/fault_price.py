"""The price of a fault: the GPU-hours each fault class burns, worst case, before the sweep stops or
the failing index is given up, computed from the rollout Job as rendered.

The model is the Job controller's documented behaviour for an Indexed Job with a pod failure policy
(https://kubernetes.io/docs/concepts/workloads/controllers/job/):

- #backoff-limit-per-index: an index is marked failed once its failed pods exceed
  `backoffLimitPerIndex`, so a fault that every attempt meets costs `backoffLimitPerIndex + 1`
  attempts; once more indexes than `maxFailedIndexes` failed, the Job fails and its running pods
  are terminated.
- #pod-failure-policy: a pod whose worker exits with a code of a `FailIndex` rule fails its index at
  once (one attempt); a pod with the `DisruptionTarget` condition under an `Ignore` rule (preemption,
  eviction by the API, a drain) is not counted: the index runs again, without limit.
- #job-termination-and-cleanup: a pod past its `activeDeadlineSeconds` is failed (reason
  DeadlineExceeded) and counts against the backoff limit like any other failure.

A systematic fault strikes every pod: at start (a bad image, a missing Secret, a bad vLLM flag:
what the canary, thicket.k8s.canary, meets first and stops at, so one pod's one attempt), or later,
at every running pod at once (storage down: `parallelism` pods, then `maxFailedIndexes` stops the
Job). A local fault strikes one pod or node: one index's attempts. A pod that a fault kills after
it committed shards burns only what it had not committed (LOST_WORK_S) and its restart: committed
trees stay and a retry skips them.

Times to fail come from the rendered pod: the start-up allowance (image pulls, mounts: enforced by
the canary for index 0, else only by the pod's activeDeadlineSeconds), the worker's
--wait-ready-timeout, the storage retry deadline, terminationGracePeriodSeconds. The sweep's own
GPU-hours are indexes x GPUs per pod x the index's work deadline (run.index_timeout_s, else
per_index x run.task_timeout_s): an upper bound of the work, so the 2% goal is against the most the
sweep may take.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from collections.abc import Callable
from typing import Any

from thicket.errors import ExitCode
from thicket.k8s.names import COMPONENT_LABEL

Obj = dict[str, Any]

GOAL_SHARE = 0.02  # no fault class may burn more than 2% of the sweep's own GPU-hours ...
GOAL_FLOOR_GPU_H = 2.0  # ... or 2 GPU-hours, whichever is larger


class Scope(Enum):
    AT_START = "every pod, at start"
    LATER = "every running pod, later"
    LOCAL = "one pod or node"
    DISRUPTION = "one pod, DisruptionTarget"


class Fault(Enum):
    IMAGE = "image never pulls"
    SECRET_OR_VOLUME = "Secret or volume missing"
    VLLM_NEVER_READY = "vLLM never ready"
    VLLM_CRASH_LOOP = "vLLM crash-loops"
    EXIT_2 = "worker exits 2 (bad input)"
    EXIT_3 = "worker exits 3 (storage unreachable)"
    ENV_DIES = "env sidecar dies"
    PREEMPTED = "node preempted"
    DISK_EVICTION = "pod evicted for disk"
    SLOW_LOAD = "model cache too slow at full scale"
    STUCK_ON_NODE = "one pod cannot start on its node"


SCOPES = {
    Fault.IMAGE: Scope.AT_START, Fault.SECRET_OR_VOLUME: Scope.AT_START, Fault.VLLM_NEVER_READY: Scope.AT_START,
    Fault.VLLM_CRASH_LOOP: Scope.AT_START, Fault.EXIT_2: Scope.AT_START, Fault.EXIT_3: Scope.LATER,
    Fault.ENV_DIES: Scope.LOCAL, Fault.PREEMPTED: Scope.DISRUPTION, Fault.DISK_EVICTION: Scope.LOCAL,
    Fault.SLOW_LOAD: Scope.LATER, Fault.STUCK_ON_NODE: Scope.LOCAL,
}
# The worker's exit code a fault ends in; None: no exit code of the worker's (a kill, a deadline).
EXIT_CODES: dict[Fault, int | None] = {
    Fault.VLLM_NEVER_READY: int(ExitCode.UNAVAILABLE), Fault.VLLM_CRASH_LOOP: int(ExitCode.UNAVAILABLE),
    Fault.EXIT_2: int(ExitCode.BAD_INPUT), Fault.EXIT_3: int(ExitCode.UNAVAILABLE),
    Fault.ENV_DIES: int(ExitCode.UNAVAILABLE), Fault.SLOW_LOAD: int(ExitCode.UNAVAILABLE),
}


@dataclass(frozen=True)
class JobShape:
    """What the Job controller and the kubelet act on, read from the rendered rollout Job."""

    parallelism: int
    completions: int
    backoff_limit_per_index: int
    max_failed_indexes: int
    active_deadline_s: int
    gpus_per_pod: int
    wait_ready_s: int
    grace_s: int
    fail_index_exit_codes: frozenset[int]
    ignores_disruption: bool


@dataclass(frozen=True)
class Guards:
    """What thicket adds around the Job (from the spec): the canary, the start allowance, the worker's
    retry windows, the work a killed pod had not committed yet."""

    canary: bool
    start_allowance_s: int
    storage_retry_s: float
    env_retry_s: float
    lost_work_s: float  # run.shard_wait_s + run.checkpoint.every_s: trees not yet in a committed shard
    index_work_s: float
    # The estimated seconds for every pod of the full parallelism to load the model from the shared
    # cache (thicket.k8s.node_fit.load_estimates, the slowest), and the window it must fit; None: no
    # shared cache, so no estimate.
    load_s: float | None = None
    load_window_s: int = 0
    pods_a_node: int = 1  # rollout pods one node of the picked type holds: a node's preemption ends them all
    # The aggregation's waiter watches the rollout's start (`wait-job --start-watchdog`,
    # thicket.k8s.start_watch): it evicts a pod late on its node, and stops the Job when no worker
    # ever started. It runs the worker's image, so an image that never pulls may stop it too.
    watchdog: bool = False


@dataclass(frozen=True)
class Price:
    fault: Fault
    pods: int  # pods the fault strikes before it is stopped
    attempts: int  # attempts each
    seconds: float  # GPU-held seconds of each attempt
    stopped_by: str
    gpus_per_pod: int

    @property
    def gpu_hours(self) -> float:
        return self.pods * self.attempts * self.seconds * self.gpus_per_pod / 3600


def job_shape(job: Obj) -> JobShape:
    spec = job["spec"]
    pod = spec["template"]["spec"]
    rules = (spec.get("podFailurePolicy") or {}).get("rules") or []
    fail_codes = frozenset(code for rule in rules if rule["action"] == "FailIndex" and "onExitCodes" in rule
                           and rule["onExitCodes"]["operator"] == "In" for code in rule["onExitCodes"]["values"])
    ignores = any(rule["action"] == "Ignore" and any(c.get("type") == "DisruptionTarget" for c in rule.get("onPodConditions", []))
                  for rule in rules)
    return JobShape(
        parallelism=int(spec.get("parallelism", 1)), completions=int(spec.get("completions", 1)),
        backoff_limit_per_index=int(spec.get("backoffLimitPerIndex", 6)),
        max_failed_indexes=int(spec.get("maxFailedIndexes", spec.get("completions", 1))),
        active_deadline_s=int(pod["activeDeadlineSeconds"]), gpus_per_pod=pod_gpus(pod),
        wait_ready_s=_worker_flag(pod, "--wait-ready-timeout"), grace_s=int(pod.get("terminationGracePeriodSeconds", 30)),
        fail_index_exit_codes=fail_codes, ignores_disruption=ignores,
    )


def pod_gpus(pod: Obj) -> int:
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    return sum(int((c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu", 0)) for c in containers)


def _worker_flag(pod: Obj, flag: str) -> int:
    args = pod["containers"][0].get("args", [])
    return int(args[args.index(flag) + 1]) if flag in args else 0


def attempts(shape: JobShape, exit_code: int | None) -> int:
    """An index's attempts at a fault every attempt meets (#pod-failure-policy, #backoff-limit-per-index)."""
    return 1 if exit_code in shape.fail_index_exit_codes else shape.backoff_limit_per_index + 1


def failing_batches(shape: JobShape) -> int:
    """Rounds of `parallelism` indexes that fail together before the Job fails: it fails once more than
    maxFailedIndexes indexes failed (#backoff-limit-per-index), or when none are left."""
    needed = math.ceil((shape.max_failed_indexes + 1) / shape.parallelism)
    return min(needed, math.ceil(shape.completions / shape.parallelism))


def time_to_fail(fault: Fault, shape: JobShape, guards: Guards) -> float:
    """GPU-held seconds of one attempt that meets the fault."""
    start, ready = guards.start_allowance_s, shape.wait_ready_s
    if fault in (Fault.IMAGE, Fault.SECRET_OR_VOLUME):
        # The canary stops a pod whose worker has not started by the start allowance; nothing else
        # does but the pod's activeDeadlineSeconds (#job-termination-and-cleanup).
        return start if guards.canary else shape.active_deadline_s
    if fault in (Fault.VLLM_NEVER_READY, Fault.VLLM_CRASH_LOOP, Fault.EXIT_2):
        return start + ready  # the worker gives up at --wait-ready-timeout (exit 2 found at worst then)
    if fault is Fault.EXIT_3:
        return guards.storage_retry_s + guards.lost_work_s
    if fault is Fault.ENV_DIES:
        return guards.env_retry_s + guards.lost_work_s
    if fault is Fault.PREEMPTED:
        return shape.grace_s + start + ready  # the worker saves its trees in the grace period, then a restart
    return start + ready + guards.lost_work_s  # DISK_EVICTION: killed, its uncommitted trees lost, restarted


def slow_load_price(shape: JobShape, guards: Guards) -> Price:
    """Every pod of the full parallelism reads the model from one shared cache at once, sharing its
    throughput: the canary's one pod loads in time, and when the estimate exceeds the window each pod
    of the scale-up waits --wait-ready-timeout and exits 3, until maxFailedIndexes stops the Job. The
    price is that when the estimate says so, and nothing otherwise (an estimate, not a measurement)."""
    if guards.load_s is None or guards.load_s <= guards.load_window_s:
        why = ("no shared model cache (each pod loads on its own)" if guards.load_s is None else
               f"not expected: ~{guards.load_s:.0f} s to load at parallelism {shape.parallelism}, "
               f"window {guards.load_window_s} s")
        return Price(Fault.SLOW_LOAD, 0, 0, 0.0, why, shape.gpus_per_pod)
    code = EXIT_CODES[Fault.SLOW_LOAD]
    pods = failing_batches(shape) * shape.parallelism - (1 if guards.canary else 0)  # the canary's pod loaded alone
    return Price(Fault.SLOW_LOAD, pods, attempts(shape, code), guards.start_allowance_s + shape.wait_ready_s,
                 f"expected (~{guards.load_s:.0f} s to load, window {guards.load_window_s} s): "
                 + _stopper(shape, code, "maxFailedIndexes"), shape.gpus_per_pod)


def stuck_on_node_price(shape: JobShape, guards: Guards) -> Price:
    """One pod whose worker cannot start on its node (a pull that node cannot finish, a mount that
    hangs there), after other workers started: the waiter's watchdog evicts it at the start allowance
    (DisruptionTarget: rerun, not counted); without it, only activeDeadlineSeconds ends it, counted."""
    if guards.watchdog:
        return Price(Fault.STUCK_ON_NODE, 1, 1, guards.start_allowance_s,
                     "the waiter's start-up watchdog evicts it (per event)", shape.gpus_per_pod)
    return Price(Fault.STUCK_ON_NODE, 1, attempts(shape, None), shape.active_deadline_s,
                 _stopper(shape, None, "the index fails"), shape.gpus_per_pod)


def price(fault: Fault, shape: JobShape, guards: Guards) -> Price:
    if fault is Fault.SLOW_LOAD:
        return slow_load_price(shape, guards)
    if fault is Fault.STUCK_ON_NODE:
        return stuck_on_node_price(shape, guards)
    seconds, code = time_to_fail(fault, shape, guards), EXIT_CODES.get(fault)
    scope = SCOPES[fault]
    if scope is Scope.AT_START and guards.canary:
        return Price(fault, 1, 1, seconds, "the canary (index 0 alone, stopped at its first failure)", shape.gpus_per_pod)
    if fault is Fault.SECRET_OR_VOLUME and guards.watchdog:  # every pod meets it; no worker ever starts
        return Price(fault, shape.parallelism, 1, guards.start_allowance_s,
                     "the waiter's start-up watchdog stops the Job", shape.gpus_per_pod)
    if scope is Scope.DISRUPTION and shape.ignores_disruption:
        return Price(fault, guards.pods_a_node, 1, seconds, "Ignore rule: retried, not counted (per event: the "
                     f"node's {guards.pods_a_node} pod(s))", shape.gpus_per_pod)
    if scope in (Scope.AT_START, Scope.LATER):
        batches, tries = failing_batches(shape), attempts(shape, code)
        if scope is Scope.LATER and (batches > 1 or tries > 1):
            seconds += guards.start_allowance_s  # a retry, or a later batch, starts a pod into the outage
        return Price(fault, batches * shape.parallelism, tries, seconds, _stopper(shape, code, "maxFailedIndexes"),
                     shape.gpus_per_pod)
    return Price(fault, 1, attempts(shape, code), seconds, _stopper(shape, code, "the index fails"), shape.gpus_per_pod)


def _stopper(shape: JobShape, code: int | None, then: str) -> str:
    if code in shape.fail_index_exit_codes:
        return f"FailIndex on exit {code}, then {then}"
    return f"backoffLimitPerIndex {shape.backoff_limit_per_index}, then {then}"


@dataclass(frozen=True)
class FaultTable:
    prices: tuple[Price, ...]
    sweep_gpu_hours: float
    gpu: str | None

    @property
    def goal_gpu_hours(self) -> float:
        return max(GOAL_SHARE * self.sweep_gpu_hours, GOAL_FLOOR_GPU_H)

    def over(self) -> list[Price]:
        return [p for p in self.prices if p.gpu_hours > self.goal_gpu_hours + 1e-9]

    def lines(self) -> list[str]:
        unit = f"{self.gpu} GPU-h" if self.gpu else "GPU-h"
        head = (f"fault price (worst case, {unit}; goal <= {self.goal_gpu_hours:.2f} = max(2% of the sweep's "
                f"{self.sweep_gpu_hours:.1f}, 2)):")
        rows = [f"  {p.fault.value:<38} {p.gpu_hours:7.2f}  {p.pods} pod(s) x {p.attempts} attempt(s) x "
                f"{p.seconds:.0f} s x {p.gpus_per_pod} GPU; {p.stopped_by}" + ("  OVER" if p in self.over() else "")
                for p in self.prices]
        return [head, *rows]

    def warnings(self) -> list[str]:
        return [f"fault price: {p.fault.value} burns up to {p.gpu_hours:.1f} GPU-hours, above the goal of "
                f"{self.goal_gpu_hours:.1f}: {FIXES[p.fault]}" for p in self.over()]


FIXES = {
    Fault.IMAGE: "keep the canary (submit without --no-canary) or lower cluster.start_allowance_s",
    Fault.SECRET_OR_VOLUME: "keep the canary (submit without --no-canary) or lower cluster.start_allowance_s",
    Fault.VLLM_NEVER_READY: "keep the canary, or lower cluster.probes.vllm_startup_s / cluster.wait_ready_timeout_s",
    Fault.VLLM_CRASH_LOOP: "keep the canary, or lower cluster.probes.vllm_startup_s / cluster.wait_ready_timeout_s",
    Fault.EXIT_2: "keep the canary, or lower cluster.max_failed_indexes",
    Fault.EXIT_3: "lower cluster.max_failed_indexes or storage.retry_deadline_s",
    Fault.ENV_DIES: "lower tasks.env_server.retry_deadline_s or cluster.backoff_limit_per_index",
    Fault.PREEMPTED: "lower cluster.start_allowance_s or cluster.probes.vllm_startup_s (each restart reloads the model)",
    Fault.DISK_EVICTION: "lower cluster.backoff_limit_per_index, or raise cluster.ephemeral_storage",
    Fault.STUCK_ON_NODE: "keep the aggregation (its waiter watches the start), or lower cluster.start_allowance_s",
    Fault.SLOW_LOAD: "use a faster model cache (cluster.model_cache.storage_class: EFS elastic, Filestore premium-rwx "
                     "or zonal-rwx), lower cluster.parallelism, or raise cluster.probes.vllm_startup_s",
}


def pods_a_node(spec: Any, objects: list[Obj]) -> int:
    """The most rollout pods one node of a type cluster.node_selector picks holds (thicket.k8s.node_fit);
    with no selector, or one thicket cannot check, the most any GPU node type holds."""
    from thicket.k8s.node_fit import rollout_pod, selector_picks, spec_fits

    pod = rollout_pod(objects)
    if pod is None:
        return 1
    every = [f for f in spec_fits(spec, pod)[1] if f.fits]
    selector = spec.cluster.node_selector
    picked = [f for f in every if selector and selector_picks(f.node, selector)]
    return max((f.pods for f in picked or every), default=1)


def waiter_watches(objects: list[Obj]) -> bool:
    """Whether the rendered aggregation waiter runs the start-up watchdog."""
    return any(o["kind"] == "Job" and o["metadata"]["labels"].get(COMPONENT_LABEL) == "aggregate-wait"
               and "--start-watchdog" in o["spec"]["template"]["spec"]["containers"][0].get("args", [])
               for o in objects)


def guards(spec: Any, canary: bool = True, objects: list[Obj] | None = None) -> Guards:
    from thicket.k8s.node_fit import load_estimates

    run = spec.run
    work = run.index_timeout_s if run.index_timeout_s is not None else spec.tasks.per_index * run.task_timeout_s
    loads = load_estimates(spec)
    return Guards(canary=canary, start_allowance_s=spec.cluster.start_allowance_s,
                  storage_retry_s=spec.storage.retry_deadline_s, env_retry_s=spec.tasks.env_server.retry_deadline_s,
                  lost_work_s=run.shard_wait_s + run.checkpoint.every_s, index_work_s=work,
                  load_s=max((e.seconds for e in loads), default=None), load_window_s=spec.cluster.probes.vllm_startup_s,
                  pods_a_node=pods_a_node(spec, objects) if objects is not None else 1,
                  watchdog=objects is not None and waiter_watches(objects))


def fault_table(spec: Any, objects: list[Obj], canary: bool = True) -> FaultTable | None:
    """The table for the rendered rollout Job; None when its pods hold no GPU."""
    job = next(o for o in objects if o["kind"] == "Job" and o["metadata"]["labels"].get(COMPONENT_LABEL) == "rollout")
    shape, guard = job_shape(job), guards(spec, canary, objects)
    if not shape.gpus_per_pod:
        return None
    sweep = shape.completions * shape.gpus_per_pod * guard.index_work_s / 3600
    return FaultTable(tuple(price(f, shape, guard) for f in Fault), sweep, gpu_name(spec.cluster.node_selector))


def gpu_name(selector: dict[str, str]) -> str | None:
    """The GPU of the machine types the node selector picks, when they agree (thicket.k8s.machine_types)."""
    from thicket.k8s.machine_types import NODE_TYPES
    from thicket.k8s.node_fit import selector_picks

    if not selector:
        return None
    names = {node.gpu.name for node in NODE_TYPES if selector_picks(node, selector)}
    return names.pop() if len(names) == 1 else None


def echo_fault_table(spec: Any, objects: list[Obj], canary: bool, echo: Callable[..., None]) -> FaultTable | None:
    """Print the table (and, on stderr, a warning for each row above the goal)."""
    table = fault_table(spec, objects, canary)
    if table is None:
        return None
    echo("\n".join(table.lines()))
    for warning in table.warnings():
        echo(f"warning: {warning}", err=True)
    return table
