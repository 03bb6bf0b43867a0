"""The spec's `cluster` section (thicket.cluster_spec): bad sections name the field in one line, and
the k8s/ base builds with the names its defaults give."""

from __future__ import annotations

import pytest

from tests.support.manifests import kustomize_objects, spec_with
from thicket.cluster_spec.cluster import ClusterSpec
from thicket.errors import BadInput


@pytest.mark.parametrize(
    "cluster,expected",
    [
        ({"namespace": "Rollouts"}, "cluster.namespace: 'Rollouts' is not a valid namespace (DNS-1123 label)"),
        ({"namespace": "x" * 64}, "cluster.namespace:"),
        ({"images": {"vllm": "vllm/vllm-openai"}}, "cluster.images.vllm: 'vllm/vllm-openai': pin the vllm image by tag"),
        ({"images": {"vllm": "vllm/vllm-openai:latest"}}, "pin the vllm image"),
        ({"images": {"worker": "Not An Image"}}, "cluster.images.worker: 'Not An Image' is not an image reference"),
        ({"vllm_args": ["--no-enable-prefix-caching"]}, "cluster.vllm_args: prefix caching is always on"),
        ({"vllm_args": ["--port=9000"]}, "cluster.vllm_args: --port is set by thicket"),
        ({"vllm_args": ["--revision", "main"]}, "cluster.vllm_args: --revision is set by thicket from policy.revision"),
        ({"resources": {"worker": {"requests": {"memory": "lots"}}}}, "cluster.resources.worker.requests: 'lots' is not a Kubernetes quantity"),
        ({"resources": {"worker": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}}, "requests.cpu (4) is above limits.cpu (2)"),
        ({"resources": {"vllm": {"limits": {"nvidia.com/gpu": 1}}}}, "set GPUs with cluster.gpus"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}, "cluster.tolerations.0: operator Exists takes no value"),
        ({"tolerations": [{"key": "a", "value": "b", "tolerationSeconds": 5}]}, "tolerationSeconds needs effect NoExecute"),
        ({"node_selector": {"bad key!": "x"}}, "cluster.node_selector: 'bad key!' is not a valid label key"),
        ({"queue": "Bad Queue"}, "cluster.queue: 'Bad Queue' is not a valid Kueue queue name"),
        ({"s3_secret": "S3_Creds"}, "cluster.s3_secret: 'S3_Creds' is not a valid name (DNS-1123 subdomain)"),
        ({"priority_class_name": "High!"}, "cluster.priority_class_name:"),
        ({"image_pull_secrets": ["a", "a"]}, "cluster.image_pull_secrets: names must be unique"),
        ({"envs": [{"family": "textcraft", "port": 8000}]}, "cluster: ports must differ"),
        ({"envs": [{"family": "nethack"}]}, "cluster.envs.0.family: unknown env 'nethack'"),
        ({"model_cache": {"hf_home": "relative/path"}}, "cluster.model_cache.hf_home: expected an absolute path"),
        ({"hf_home": "/x"}, "cluster: hf_home is now model_cache.hf_home"),
        ({"model_cache_pvc": "cache"}, "cluster: model_cache_pvc is now model_cache.claim"),
        ({"model_cache": {"claim": None, "size": "10Gi"}}, "cluster.model_cache: size, storage_class and access_mode describe a claim"),
        ({"model_cache": {"claim": None, "prefetch": True}}, "cluster.model_cache: prefetch: true needs a claim"),
        ({"model_cache": {"storage_class": "efs-sc"}}, "cluster.model_cache: storage_class applies to a claim thicket creates"),
        ({"model_cache": {"access_mode": "ReadOnlyMany"}}, "cluster.model_cache: access_mode ReadOnlyMany: the prefetch Job cannot write"),
        ({"model_cache": {"access_mode": "ReadWriteOncePod"}}, "cluster.model_cache.access_mode:"),
        ({"model_cache": {"size": "lots"}}, "cluster.model_cache.size:"),
        ({"model_cache": {"access_mode": "ReadWriteOnce"}, "parallelism": 2},
         "cluster: model_cache.access_mode ReadWriteOnce attaches the claim to one node, but parallelism 2"),
        ({"gpus": -1}, "cluster.gpus: Input should be greater than or equal to 0"),
        ({"parallelism": 0}, "cluster.parallelism:"),
        ({"max_failed_indexes": -1}, "cluster.max_failed_indexes:"),
        ({"bogus": 1}, "cluster.bogus: unknown field"),
    ],
)
def test_bad_cluster_sections_name_the_field_in_one_line(cluster, expected):
    with pytest.raises(BadInput) as err:
        spec_with(**cluster)
    message = str(err.value)
    assert message.startswith("s.yaml: ") and expected in message, message
    assert "\n" not in message


# -- k8s/ base, images, Makefile -------------------------------------------------------------------
def test_kustomize_base_holds_nothing_to_edit_and_the_example_overlay_the_rest():
    base = kustomize_objects()
    assert {o["kind"] for o in base} == {"Namespace", "ServiceAccount", "Role", "RoleBinding"}  # no example values
    assert not any("example" in str(o.get("metadata", {}).get("annotations", {})) for o in base)
    examples = kustomize_objects("k8s/examples")
    assert {o["kind"] for o in examples} == {"Secret", "PersistentVolumeClaim"}
    objects = base + examples
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    defaults = ClusterSpec()
    assert ("Namespace", defaults.namespace) in kinds
    assert ("Secret", defaults.s3_secret) in kinds and ("PersistentVolumeClaim", defaults.model_cache.claim) in kinds
    assert {"ServiceAccount", "Role", "RoleBinding"} <= {k for k, _ in kinds}
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert secret["metadata"]["annotations"]["thicket.dev/example"] == "true"
    assert all(v.startswith(("EXAMPLE", "https://s3.example.invalid", "us-east-1")) for v in secret["stringData"].values())
    assert all(o["metadata"].get("namespace", defaults.namespace) == defaults.namespace for o in objects)
