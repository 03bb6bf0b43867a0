"""The model cache on a cluster: the claim thicket may create (size, class, access mode), the
prefetch Job that fills it once before the rollout (and that `submit` waits for), vLLM with the hub
offline, and vLLM's memory from the model's size."""

from __future__ import annotations

import threading
import time

import pytest

from tests.support.manifests import by_kind, containers, rollout, spec_with
from thicket.errors import BadInput, Unavailable
from thicket.k8s.client import connect
from thicket.k8s.render import render
from thicket.k8s.status import sweep_status
from thicket.k8s.submit import cancel, submit
from thicket.k8s.vllm_memory import parameters_b, vllm_memory


def prefetch(objects):
    jobs = by_kind(objects, "Job", "prefetch")
    return jobs[0] if jobs else None


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# -- render ----------------------------------------------------------------------------------------
def test_a_hub_model_is_prefetched_into_the_claim_before_the_rollout_and_served_offline():
    objects = render(spec_with(hf_token_secret="hf-token"))
    job = prefetch(objects)
    assert job is not None
    kinds = [(o["kind"], o["metadata"]["labels"]["app.kubernetes.io/component"]) for o in objects]
    assert kinds.index(("Job", "prefetch")) < kinds.index(("Job", "rollout"))
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert [container["command"][0], *container["args"]] == [
        "hf", "download", "meta-llama/Llama-3.1-8B-Instruct", "--exclude", "original/*"]
    env = env_of(container)
    assert env["HF_HOME"] == "/models/huggingface"
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "HF_TOKEN"}}
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "thicket-models"}} in pod["volumes"]
    assert "nvidia.com/gpu" not in str(container["resources"])  # a download needs no GPU
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    vllm = containers(rollout(objects)["spec"]["template"]["spec"])["vllm"]
    assert env_of(vllm)["HF_HUB_OFFLINE"] == "1"


@pytest.mark.parametrize(
    "cluster",
    [
        {"model": "/models/tiny"},  # a folder already in the cache
        {"model_cache": {"claim": None}},  # an emptyDir per pod: each downloads for itself
        {"model_cache": {"prefetch": False}},
    ],
    ids=["path", "empty-dir", "off"],
)
def test_no_prefetch_and_the_hub_online_when_nothing_is_prefetched(cluster):
    objects = render(spec_with(**cluster))
    assert prefetch(objects) is None
    vllm = containers(rollout(objects)["spec"]["template"]["spec"])["vllm"]
    assert "HF_HUB_OFFLINE" not in env_of(vllm)


def test_a_user_set_hf_hub_offline_is_kept():
    objects = render(spec_with(env={"vllm": {"HF_HUB_OFFLINE": "0"}}))
    vllm = containers(rollout(objects)["spec"]["template"]["spec"])["vllm"]
    assert [e["value"] for e in vllm["env"] if e["name"] == "HF_HUB_OFFLINE"] == ["0"]


def test_the_prefetch_gets_the_vllm_containers_hub_settings_but_never_goes_offline():
    objects = render(spec_with(env={"vllm": {"HF_ENDPOINT": "https://hub.mirror.internal", "HF_HUB_OFFLINE": "1"}}))
    env = env_of(prefetch(objects)["spec"]["template"]["spec"]["containers"][0])
    assert env["HF_ENDPOINT"] == "https://hub.mirror.internal"
    assert "HF_HUB_OFFLINE" not in env and env["HF_HUB_DISABLE_UPDATE_CHECK"] == "1"


def test_the_claim_is_rendered_only_when_thicket_creates_it_and_carries_no_sweep_label():
    assert not by_kind(render(spec_with()), "PersistentVolumeClaim")
    objects = render(spec_with(model_cache={"size": "500Gi", "storage_class": "efs-sc"}))
    (claim,) = by_kind(objects, "PersistentVolumeClaim")
    assert objects[0] is claim  # before anything mounts it
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "500Gi"}},
                             "storageClassName": "efs-sc"}
    assert "thicket.dev/sweep" not in claim["metadata"]["labels"]  # `cancel` and the Jobs' TTL leave the cache


# -- vLLM's memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "model,billions",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 8.0),
        ("Qwen/Qwen2.5-0.5B-Instruct", 0.5),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 56.0),
        ("Qwen/Qwen3-30B-A3B", 30.0),  # the active-parameter count is not the size
        ("HuggingFaceTB/SmolLM2-135M", 0.135),
        ("google/gemma-2-9b-it", 9.0),
        ("deepseek-ai/DeepSeek-V3", None),
        ("/models/tiny", None),
    ],
)
def test_the_model_size_comes_from_its_name(model, billions):
    assert parameters_b(model) == billions


def test_vllm_memory_grows_with_the_model_and_its_precision():
    eight = vllm_memory("meta-llama/Llama-3.1-8B-Instruct", 1)
    seventy = vllm_memory("meta-llama/Llama-3.1-70B-Instruct", 4)
    fp8 = vllm_memory("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", 4)
    assert eight.quantity == "24Gi"  # 14.9 GiB of bf16 weights + 6 + 2, rounded up to 4 GiB
    assert fp8.gib < seventy.gib and seventy.gib >= 130  # the weights alone are 130 GiB in bf16
    assert vllm_memory("Qwen/Qwen2.5-0.5B-Instruct", 1).quantity == "16Gi"  # the floor
    assert vllm_memory("some-org/unnamed-size", 1).quantity == "32Gi"  # a name with no size: the default


def test_the_rendered_vllm_memory_follows_the_model_unless_the_spec_sets_it():
    def vllm_resources(**cluster):
        return containers(rollout(render(spec_with(**cluster)))["spec"]["template"]["spec"])["vllm"]["resources"]

    assert vllm_resources()["requests"]["memory"] == vllm_resources()["limits"]["memory"] == "24Gi"
    cpus_only = vllm_resources(resources={"vllm": {"requests": {"cpu": "8"}}})
    assert cpus_only["requests"] == {"cpu": "8", "memory": "24Gi", "ephemeral-storage": "11264Mi", "nvidia.com/gpu": "1"}
    mine = vllm_resources(resources={"vllm": {"requests": {"cpu": "2", "memory": "40Gi"}, "limits": {"memory": "40Gi"}}})
    assert mine["limits"]["memory"] == "40Gi"


# -- submit ----------------------------------------------------------------------------------------
def test_submit_creates_the_rollout_only_once_the_prefetch_job_completes(fake, monkeypatch):
    monkeypatch.setattr("thicket.k8s.submit.PREFETCH_POLL_S", 0.05)
    fake.job_ends.clear()  # the download takes a while
    spec = spec_with()
    lines: list[str] = []
    done = threading.Event()
    worker = threading.Thread(target=lambda: (submit(connect(), spec, render(spec), echo=lines.append), done.set()))
    worker.start()
    deadline = time.monotonic() + 30
    while fake.get("jobs", "thicket", "tc-prefetch") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    assert fake.get("jobs", "thicket", "tc-prefetch") is not None
    assert fake.get("jobs", "thicket", "tc") is None and not done.is_set()  # no GPU pod yet
    with pytest.raises(BadInput, match=r"^sweep 'tc' has no rollout yet: job/tc-prefetch is filling the model cache"):
        sweep_status(connect(), "thicket", "tc", storage=False)
    fake.get("jobs", "thicket", "tc-prefetch")["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    worker.join(timeout=30)
    assert done.is_set() and fake.get("jobs", "thicket", "tc") is not None
    assert any("downloading meta-llama/Llama-3.1-8B-Instruct into the model cache" in line for line in lines)


def test_a_failed_prefetch_stops_submit_with_its_reason_and_no_rollout(fake, monkeypatch):
    monkeypatch.setattr("thicket.k8s.submit.PREFETCH_POLL_S", 0.05)
    fake.job_ends["prefetch"] = "Failed"
    spec = spec_with()
    with pytest.raises(Unavailable, match=r"^job/tc-prefetch could not fill the model cache with "
                                          r"meta-llama/Llama-3.1-8B-Instruct: see `kubectl -n thicket logs"):
        submit(connect(), spec, render(spec), echo=lambda _: None)
    assert fake.get("jobs", "thicket", "tc") is None


def test_submit_creates_a_missing_claim_and_keeps_an_existing_one(fake):
    fake.objects.pop(("persistentvolumeclaims", "thicket", "thicket-models"))
    spec = spec_with(model_cache={"size": "100Gi", "storage_class": "standard-rwx"})
    done = submit(connect(), spec, render(spec), echo=lambda _: None)
    assert done["persistentvolumeclaim/thicket-models"] == "created"
    claim = fake.get("persistentvolumeclaims", "thicket", "thicket-models")
    assert claim["spec"]["storageClassName"] == "standard-rwx"
    bigger = spec_with(model_cache={"size": "200Gi", "storage_class": "standard-rwx"})
    done = submit(connect(), bigger, render(bigger), echo=lambda _: None)
    assert done["persistentvolumeclaim/thicket-models"] == "kept"
    assert fake.get("persistentvolumeclaims", "thicket", "thicket-models")["metadata"]["uid"] == claim["metadata"]["uid"]
    cancel(connect(), "thicket", "tc", echo=lambda _: None)
    assert fake.get("persistentvolumeclaims", "thicket", "thicket-models") is not None  # the cache stays


def test_resume_reruns_a_failed_prefetch_but_not_a_completed_one(fake, monkeypatch):
    monkeypatch.setattr("thicket.k8s.submit.PREFETCH_POLL_S", 0.05)
    spec = spec_with()
    submit(connect(), spec, render(spec), echo=lambda _: None)
    for name in ("tc", "tc-aggregate-wait", "tc-aggregate"):
        fake.get("jobs", "thicket", name)["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    filled = fake.get("jobs", "thicket", "tc-prefetch")["metadata"]["uid"]
    done = submit(connect(), spec, render(spec), resume=True, echo=lambda _: None)
    assert done["job/tc-prefetch"] == "unchanged" and done["job/tc"] == "resumed"
    assert fake.get("jobs", "thicket", "tc-prefetch")["metadata"]["uid"] == filled
    for name in ("tc", "tc-aggregate-wait", "tc-aggregate"):
        fake.get("jobs", "thicket", name)["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
    fake.get("jobs", "thicket", "tc-prefetch")["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
    done = submit(connect(), spec, render(spec), resume=True, echo=lambda _: None)
    assert done["job/tc-prefetch"] == "resumed"
