"""The prefetch Job (thicket.k8s.prefetch): a small image on CPU nodes, a pinned and recorded model
revision; the model-cache example claim names a ReadWriteMany class."""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from tests.support.manifests import BASE, ROOT, by_kind, containers, rollout
from thicket.cluster_spec.cluster import ClusterSpec
from thicket.errors import BadInput
from thicket.k8s.node_fit import CLASS_STORAGE
from thicket.k8s.prefetch import revision_warnings
from thicket.k8s.render import render
from thicket.spec import parse_spec

SHA = "0e9e39f249a16976918f6564b8830bc894c89659"  # meta-llama/Llama-3.1-8B-Instruct's commit


def _spec(revision: str | None = SHA, **cluster):
    data = copy.deepcopy(BASE)
    data["policy"] = {**data["policy"], **({"revision": revision} if revision else {})}
    data["cluster"] = cluster
    return parse_spec(data, "s.yaml")


def _prefetch(objects):
    (job,) = by_kind(objects, "Job", "prefetch")
    return job["spec"]["template"]["spec"]


def test_the_prefetch_runs_the_small_image_not_the_vllm_cuda_image():
    pod = _prefetch(render(_spec()))
    (container,) = pod["containers"]
    images = ClusterSpec().images
    assert container["image"] == images.prefetch != images.vllm
    assert container["command"] == ["hf"]
    # The image's target installs requirements/prefetch.txt: huggingface_hub (which has `hf`), no torch.
    dockerfile = (ROOT / "docker" / "thicket.Dockerfile").read_text()
    assert re.search(r"FROM runtime AS prefetch\n", dockerfile) and "COPY requirements/prefetch.txt" in dockerfile
    lock = (ROOT / "requirements" / "prefetch.txt").read_text()
    assert re.search(r"^huggingface-hub==", lock, re.M)
    assert not re.search(r"^(torch|vllm|transformers)\b", lock, re.M)


def test_the_prefetch_keeps_off_gpu_nodes():
    pod = _prefetch(render(_spec()))
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    avoided = {e["key"] for e in terms[0]["matchExpressions"] if e["operator"] == "DoesNotExist"}
    assert avoided == set(ClusterSpec().aggregate.avoid_node_labels)  # the GPU nodes' labels
    assert "nvidia.com/gpu" not in str(pod["containers"][0]["resources"])
    # aggregate.avoid_node_labels: [] turns it off, as for the aggregation Jobs.
    assert "affinity" not in _prefetch(render(_spec(aggregate={"avoid_node_labels": []})))


def test_the_revision_is_downloaded_loaded_and_recorded():
    objects = render(_spec())
    args = _prefetch(objects)["containers"][0]["args"]
    assert args[:4] == ["download", "meta-llama/Llama-3.1-8B-Instruct", "--revision", SHA]
    vllm = containers(rollout(objects)["spec"]["template"]["spec"])["vllm"]["args"]
    assert vllm[vllm.index("--revision") + 1] == SHA
    (config,) = by_kind(objects, "ConfigMap", "spec")  # the spec the pods (and the sweep's spec.yaml) keep
    assert yaml.safe_load(next(iter(config["data"].values())))["policy"]["revision"] == SHA
    assert revision_warnings(_spec()) == []


def test_a_hub_model_without_a_revision_is_warned_and_a_bad_one_refused():
    (warning,) = revision_warnings(_spec(None))
    assert warning.startswith("policy.revision: not set: the prefetch downloads meta-llama/Llama-3.1-8B-Instruct")
    assert "--revision" not in _prefetch(render(_spec(None)))["containers"][0]["args"]
    with pytest.raises(BadInput) as err:  # one line naming the field (the CLI exits 2)
        _spec("main; rm -rf /")
    assert str(err.value) == "s.yaml: policy.revision: expected a commit sha, tag or branch name, got 'main; rm -rf /'"


def test_the_example_claim_names_a_read_write_many_class():
    (claim,) = [d for d in yaml.safe_load_all((ROOT / "k8s/examples/model-cache-pvc.yaml").read_text()) if d]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    # The defaults (EKS gp2/gp3, GKE standard-rwo) are block storage: ReadWriteOnce only.
    assert claim["spec"]["storageClassName"] == "efs-sc" and "efs-sc" in CLASS_STORAGE


def test_a_sweep_grown_at_one_revision_refuses_a_rerun_at_another():
    """The revision decides the weights, so the trees: like policy.model it blocks a rerun (docs/spec.md)."""
    from thicket.rollout.spec_record import differences, normalized

    stored = normalized(_spec(SHA).model_dump(mode="json"))
    other = _spec("5206a32e0bd3067aef1ce90f5528ade7d866253f").model_dump(mode="json")
    assert differences(stored, other) == [("policy.revision", SHA, "5206a32e0bd3067aef1ce90f5528ade7d866253f")]
    # A sweep stored before the field existed reads as revision null: no difference without one.
    old = _spec(None).model_dump(mode="json")
    del old["policy"]["revision"]
    assert differences(normalized(old), _spec(None).model_dump(mode="json")) == []
