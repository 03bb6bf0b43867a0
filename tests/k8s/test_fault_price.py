"""The price of a fault (thicket.k8s.fault_price): the worst-case GPU-hours of each fault class, for
the rollout Job as rendered, worked out here by hand from the Job controller's documented rules:

- https://kubernetes.io/docs/concepts/workloads/controllers/job/#backoff-limit-per-index: an index
  fails once its failed pods exceed backoffLimitPerIndex (so b + 1 attempts); the Job fails once
  more than maxFailedIndexes indexes failed.
- #pod-failure-policy: FailIndex on an exit code: one attempt; Ignore on DisruptionTarget: not counted.
- #job-termination-and-cleanup: a pod past activeDeadlineSeconds fails and counts.

The defaults of textcraft-mcts.yaml, used below: start allowance S = 900 s (cluster.start_allowance_s),
--wait-ready-timeout W = 1800 s (probes.vllm_startup_s), storage retry R = 300 s, uncommitted work
L = shard_wait_s 60 + checkpoint.every_s 30 = 90 s, grace 60 s, 16 indexes, parallelism 8, 1 GPU,
index_timeout_s 21600 s.
"""

from __future__ import annotations


import pytest
import yaml

from tests.support.manifests import ROOT, rollout
from thicket.k8s.fault_price import Fault, fault_table, job_shape, price, guards
from thicket.k8s.render import render
from thicket.spec import load_spec, parse_spec

TEXTCRAFT = ROOT / "sweeps" / "cluster" / "textcraft-mcts.yaml"
EXAMPLES = sorted((ROOT / "sweeps" / "cluster").glob("*.yaml"))
S, W, R, L, GRACE = 900, 1800, 300, 60 + 30, 60

H100_KUEUE = ROOT / "sweeps" / "cluster" / "textcraft-h100x64-kueue.yaml"  # GKE a3-highgpu-8g, a Kueue queue


def table(spec, canary=True):
    return fault_table(spec, render(spec), canary)


def hours(t):
    return {p.fault: round(p.gpu_hours, 4) for p in t.prices}


def test_textcraft_rows_by_hand():
    t = table(load_spec(TEXTCRAFT))
    assert t.gpu == "L4"  # node_selector g6.4xlarge
    assert t.sweep_gpu_hours == 16 * 1 * 21600 / 3600  # 96: indexes x GPUs x the index's work deadline
    assert t.goal_gpu_hours == max(0.02 * 96, 2) == 2
    assert hours(t) == {
        # The canary: index 0 alone, stopped at its first failure, or when its worker has not started by S.
        Fault.IMAGE: round(1 * 1 * S / 3600, 4),  # 0.25
        Fault.SECRET_OR_VOLUME: round(1 * 1 * S / 3600, 4),
        Fault.VLLM_NEVER_READY: round(1 * 1 * (S + W) / 3600, 4),  # 0.75: exit 3 at --wait-ready-timeout
        Fault.VLLM_CRASH_LOOP: round(1 * 1 * (S + W) / 3600, 4),
        Fault.EXIT_2: round(1 * 1 * (S + W) / 3600, 4),
        # Storage down later meets all 8 running pods; exit 3 fails each index at once (FailIndex);
        # maxFailedIndexes = max(1, floor(5% x 16)) = 1 < 8 failed: the Job fails after that one round.
        Fault.EXIT_3: round(8 * 1 * (R + L) / 3600, 4),  # 0.8667
        Fault.ENV_DIES: round(1 * 1 * (60 + L) / 3600, 4),  # the env client's 60 s retry, then exit 3
        Fault.PREEMPTED: round(1 * 1 * (GRACE + S + W) / 3600, 4),  # per event: not counted (Ignore)
        # Its own disk limit: evicted without DisruptionTarget, counted: backoffLimitPerIndex 1 -> 2 attempts.
        Fault.DISK_EVICTION: round(1 * 2 * (S + W + L) / 3600, 4),  # 1.55
        # 8 pods x 14.9 GiB from EFS bursting (efs-sc), 100 MiB/s shared: 14.9 x 1024 / 12.5 = 1,221 s
        # + 180 s = ~1,401 s, inside the 1,800 s window: not expected, no price.
        Fault.SLOW_LOAD: 0,
        # A pod that cannot start on its node once others run: the waiter's watchdog evicts it at S.
        Fault.STUCK_ON_NODE: round(1 * 1 * S / 3600, 4),  # 0.25 per event
    }
    assert t.over() == [] and t.warnings() == []


def test_without_the_canary_an_unpullable_image_holds_every_gpu_to_the_pod_deadline():
    spec = load_spec(TEXTCRAFT)
    t = table(spec, canary=False)
    deadline = rollout(render(spec))["spec"]["template"]["spec"]["activeDeadlineSeconds"]
    assert deadline == S + W + 21600 + 60 + R + GRACE + 60  # 24780 (thicket.k8s.deadlines)
    # 8 pods at once, 2 attempts each (backoffLimitPerIndex 1), each killed at activeDeadlineSeconds.
    assert hours(t)[Fault.IMAGE] == round(8 * 2 * 24780 / 3600, 4)  # 110.13
    assert hours(t)[Fault.EXIT_2] == round(8 * 1 * (S + W) / 3600, 4)  # FailIndex: one attempt each
    # A missing Secret or volume: no worker ever starts, so the waiter's watchdog stops the Job at S.
    assert hours(t)[Fault.SECRET_OR_VOLUME] == round(8 * 1 * S / 3600, 4) == 2.0
    warnings = t.warnings()
    assert warnings[0].startswith("fault price: image never pulls burns up to 110.1 GPU-hours, above the goal of 2.0")
    assert "without --no-canary" in warnings[0]


def job(parallelism=4, completions=20, backoff=3, max_failed=5, rules=None, gpus=2):
    """A hand-made rollout Job (today's render before this change: exit 2 only, backoff 3)."""
    rules = rules if rules is not None else [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailIndex", "onExitCodes": {"containerName": "worker", "operator": "In", "values": [2]}},
    ]
    return {"spec": {
        "completionMode": "Indexed", "parallelism": parallelism, "completions": completions,
        "backoffLimitPerIndex": backoff, "maxFailedIndexes": max_failed, "podFailurePolicy": {"rules": rules},
        "template": {"spec": {
            "activeDeadlineSeconds": 24780, "terminationGracePeriodSeconds": GRACE,
            "initContainers": [{"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            "containers": [{"name": "worker", "args": ["worker", "spec.yaml", "--wait-ready-timeout", str(W)]}],
        }},
    }}


def guard(canary=False):
    return guards(load_spec(TEXTCRAFT), canary)


def test_retried_storage_outage_with_more_failures_allowed_than_pods():
    shape = job_shape(job())
    # Exit 3 counts (no FailIndex rule): 3 + 1 = 4 attempts per index; maxFailedIndexes 5 needs 6
    # failed indexes, 4 at a time: ceil(6 / 4) = 2 rounds of 4 pods. Each attempt after the first starts
    # a pod into the outage: S + R + L.
    p = price(Fault.EXIT_3, shape, guard())
    assert (p.pods, p.attempts, p.seconds) == (2 * 4, 4, S + R + L)
    assert round(p.gpu_hours, 4) == round(8 * 4 * (S + R + L) * 2 / 3600, 4)  # 2 GPUs a pod: 22.93


def test_rounds_stop_when_no_index_is_left():
    # maxFailedIndexes 20 of 20 indexes, parallelism 4: ceil(21 / 4) = 6 rounds, but only 20 / 4 = 5 exist.
    p = price(Fault.VLLM_NEVER_READY, job_shape(job(max_failed=20)), guard())
    assert (p.pods, p.attempts) == (5 * 4, 4)


def test_exit_2_fails_the_index_at_once():
    p = price(Fault.EXIT_2, job_shape(job()), guard())
    assert (p.pods, p.attempts) == (2 * 4, 1)  # FailIndex: one attempt; still 2 rounds for maxFailedIndexes 5


def test_preemption_is_counted_without_the_ignore_rule():
    rules = [{"action": "FailIndex", "onExitCodes": {"containerName": "worker", "operator": "In", "values": [2]}}]
    ignored = price(Fault.PREEMPTED, job_shape(job()), guard())
    counted = price(Fault.PREEMPTED, job_shape(job(rules=rules)), guard())
    assert (ignored.pods, ignored.attempts) == (1, 1)  # per event, not counted
    assert (counted.pods, counted.attempts) == (1, 3 + 1)  # counted: the index's b + 1 attempts


def test_the_canary_prices_a_fault_at_start_as_one_pod():
    p = price(Fault.IMAGE, job_shape(job(parallelism=64, completions=640)), guard(canary=True))
    assert (p.pods, p.attempts, p.seconds) == (1, 1, S)
    assert p.gpu_hours == 1 * 1 * S * 2 / 3600  # 2 GPUs a pod: 0.5


def test_without_the_waiter_a_pod_stuck_on_its_node_holds_its_gpu_to_the_deadline():
    """aggregate.enabled false: no waiter, so no watchdog; the pod's activeDeadlineSeconds ends it, a
    counted failure (DeadlineExceeded), backoffLimitPerIndex 1: 2 attempts x 24,780 s = 13.77 GPU-h."""
    data = yaml.safe_load(TEXTCRAFT.read_text())
    data["cluster"]["aggregate"] = {"enabled": False}
    t = table(parse_spec(data, "s.yaml"))
    assert hours(t)[Fault.STUCK_ON_NODE] == round(1 * 2 * 24780 / 3600, 4)
    assert [w for w in t.warnings() if w.startswith("fault price: one pod cannot start on its node")]


def test_64_h100_kueue_spec_within_the_goal():
    spec = load_spec(H100_KUEUE)
    objects = render(spec)
    assert rollout(objects)["spec"]["suspend"] is True  # created suspended: Kueue unsuspends it on admission
    t = table(spec)
    assert t.gpu == "H100 80GB"
    assert t.sweep_gpu_hours == 64 * 1 * 21600 / 3600 == 384
    assert t.goal_gpu_hours == pytest.approx(0.02 * 384)  # 7.68
    # maxFailedIndexes = max(1, floor(5% x 64)) = 3 < 64: one round of 64 pods, one attempt each (FailIndex).
    assert hours(t)[Fault.EXIT_3] == round(64 * 1 * (R + L) / 3600, 4)  # 6.9333
    # 64 pods x 14.9 GiB (8B in bf16) from Filestore Basic SSD, 1,200 MiB/s shared: 14.9 x 1024 / (1200 / 64)
    # = 814 s, + 180 s of vLLM's own start = ~994 s, inside the 1,800 s window: no price.
    assert hours(t)[Fault.SLOW_LOAD] == 0
    # 8 pods a node (a3-highgpu-8g, 300 GiB of disk, packed): a node's preemption restarts all 8.
    assert hours(t)[Fault.PREEMPTED] == round(8 * 1 * (GRACE + S + W) / 3600, 4)  # 6.1333
    assert t.over() == []


def test_a_slow_model_cache_at_full_scale_is_priced():
    """The canary's one pod loads the model alone; the scale-up's 63 share the cache's throughput. On
    Filestore Basic HDD (standard-rwx, 100 MiB/s in all): 14.9 x 1024 / (100 / 64) = 9,766 s + 180 s =
    ~9,946 s > 1,800 s, so each of them waits --wait-ready-timeout and exits 3 (FailIndex): 63 x 1 x
    (S + W) = 47.25 H100-hours, far above the goal; the warning names the field."""
    data = yaml.safe_load(H100_KUEUE.read_text())
    data["cluster"]["model_cache"]["storage_class"] = "standard-rwx"
    t = table(parse_spec(data, "slow.yaml"))
    p = next(p for p in t.prices if p.fault is Fault.SLOW_LOAD)
    assert (p.pods, p.attempts, p.seconds) == (63, 1, S + W)
    assert hours(t)[Fault.SLOW_LOAD] == round(63 * (S + W) / 3600, 4) == 47.25
    assert [w for w in t.warnings() if "cluster.model_cache.storage_class" in w]
    no_canary = table(parse_spec(data, "slow.yaml"), canary=False)
    assert next(p for p in no_canary.prices if p.fault is Fault.SLOW_LOAD).pods == 64  # without it, all 64


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_is_within_the_goal(path):
    t = table(load_spec(path))
    assert t is not None and t.over() == [], t.lines()


def test_a_spec_over_the_goal_is_warned_naming_the_field():
    data = yaml.safe_load(TEXTCRAFT.read_text())
    data["cluster"]["backoff_limit_per_index"] = 3
    t = table(parse_spec(data, "s.yaml"))
    # 4 attempts x (S + W + L) = 4 x 2790 s = 3.1 GPU-h > 2
    assert hours(t)[Fault.DISK_EVICTION] == round(4 * (S + W + L) / 3600, 4)
    assert [w for w in t.warnings() if "cluster.backoff_limit_per_index" in w]


def test_validate_prints_the_table(cli):
    code, out, err = cli("validate", str(TEXTCRAFT))
    assert code == 0
    assert "fault price (worst case, L4 GPU-h; goal <= 2.00 = max(2% of the sweep's 96.0, 2)):" in out
    assert "  image never pulls " in out and "  pod evicted for disk " in out
    assert "OVER" not in out and "fault price" not in err
