"""How long a sweep's pods may live, and how many of its indexes may fail.

The rollout pod's `activeDeadlineSeconds` counts from the pod's start (status.startTime: once it is
bound to a node, so time waiting for a GPU is not charged) and covers what the worker cannot see:
a pod stuck before any container runs (an image that cannot be pulled, a Secret key that is
missing, a volume that does not mount) would otherwise hold its GPU forever. It is the worker's
own worst case plus what comes before the worker starts:

    activeDeadlineSeconds = start_allowance_s           image pulls, mounts, Secrets (cluster)
                          + wait_ready_timeout          the worker's wait for its servers (--wait-ready-timeout)
                          + work                        run.index_timeout_s, else per_index x run.task_timeout_s
                          + shard_wait_s + storage.retry_deadline_s       the last batch's commit
                          + run.checkpoint.grace_s + 60 the shutdown (terminationGracePeriodSeconds)

so the worker's own clean exit (exit 3 when a server never answers, exit 4 at the index deadline)
always comes first. A pod killed at its deadline (reason DeadlineExceeded) counts against
`backoffLimitPerIndex` (it carries no DisruptionTarget condition). `cluster.active_deadline_s`
overrides the sum; the rules refuse one that is not above the worker's own deadlines.

`maxFailedIndexes` stops a sweep whose pods all fail the same way (a broken image, a bad model):
by default max(1, 5% of the indexes), so a fault in every pod costs a few indexes' retries, not
the whole sweep's.
"""

from __future__ import annotations

import math

from thicket.errors import BadInput
from thicket.k8s.names import index_count
from thicket.k8s.rules.report import HIGH_COMPLETIONS_LIMIT, COMPLETIONS_SOFT_LIMIT
from thicket.spec import SweepSpec

SLACK_S = 60  # after the pod's terminationGracePeriodSeconds


def worker_deadline(spec: SweepSpec, wait_ready_s: int) -> int:
    """The longest the worker itself runs: its wait for the servers, its work and its last commit."""
    run = spec.run
    work = run.index_timeout_s if run.index_timeout_s is not None else spec.tasks.per_index * run.task_timeout_s
    return math.ceil(wait_ready_s + work + run.shard_wait_s + spec.storage.retry_deadline_s)


def rollout_pod_deadline(spec: SweepSpec, wait_ready_s: int) -> int:
    """The rollout pod's activeDeadlineSeconds (see the module's docstring)."""
    c = spec.cluster
    own = worker_deadline(spec, wait_ready_s)
    if c.active_deadline_s is not None:
        if c.active_deadline_s <= wait_ready_s + (spec.run.index_timeout_s or 0):
            raise BadInput(f"cluster.active_deadline_s: {c.active_deadline_s} s is not above the worker's own "
                           f"deadlines (--wait-ready-timeout {wait_ready_s} s + run.index_timeout_s "
                           f"{spec.run.index_timeout_s or 0:g} s): the pod would be killed before the worker's "
                           f"clean exit; leave it unset for the derived {c.start_allowance_s + own + grace(spec)} s")
        return c.active_deadline_s
    return c.start_allowance_s + own + grace(spec)


def grace(spec: SweepSpec) -> int:
    """The pod's terminationGracePeriodSeconds and some slack."""
    return spec.run.checkpoint.grace_s + SLACK_S


def max_failed_indexes(spec: SweepSpec) -> int:
    """The rollout Job's maxFailedIndexes: cluster.max_failed_indexes, else max(1, share x indexes)."""
    c = spec.cluster
    completions = index_count(spec)
    if c.max_failed_indexes is not None:
        if c.max_failed_indexes > completions:
            raise BadInput(f"cluster.max_failed_indexes: {c.max_failed_indexes} is above the sweep's {completions} "
                           "indexes (tasks.count / tasks.per_index); the API server refuses it")
        return c.max_failed_indexes
    value = min(completions, max(1, math.floor(c.max_failed_share * completions)))
    if completions > COMPLETIONS_SOFT_LIMIT:
        value = min(value, HIGH_COMPLETIONS_LIMIT)
    return value
