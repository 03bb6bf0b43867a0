"""The checks before submit: what would leave the sweep's pods stuck if it were missing. The server's
Kubernetes version, the namespace, every Secret and Secret key the rendered pods read, the S3
Secret's keys (and not the example's placeholders), the ServiceAccount, the model-cache PVC and
its StorageClass, the image pull secrets."""

from __future__ import annotations

from typing import Any

from thicket.errors import BadInput
from thicket.k8s.client import Forbidden, Kube, NotFound
from thicket.k8s.names import serves_vllm
from thicket.k8s.queue_check import check_scheduling_refs
from thicket.k8s.storage_class import check_storage_class
from thicket.spec import SweepSpec

Obj = dict[str, Any]


EXAMPLE_ANNOTATION = "thicket.dev/example"

S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")

# Native sidecars (init containers with restartPolicy Always), backoffLimitPerIndex and the
# podFailurePolicy action FailIndex: beta and on by default in 1.29-1.32, GA in 1.33.
MIN_KUBERNETES = (1, 29)
GA_KUBERNETES = (1, 33)
FEATURES = "native sidecars, the Indexed Job's backoffLimitPerIndex and podFailurePolicy FailIndex"


def check_server_version(kube: Kube) -> str | None:
    """Refuse a server older than 1.29 (exit 2); a warning for 1.29-1.32 (beta features) or an
    unreadable version; None for 1.33+."""
    try:
        major, minor, git = kube.server_version()
    except (Forbidden, NotFound):
        return "cannot read the server's version (/version): not checked; thicket needs Kubernetes 1.29 or newer"
    if (major, minor) < MIN_KUBERNETES:
        raise BadInput(
            f"the cluster runs Kubernetes {git}; thicket needs 1.29 or newer: its pods use {FEATURES}, which older "
            "servers drop or reject (vLLM would never stop, or a failed index would retry forever): upgrade the control plane"
        )
    if (major, minor) < GA_KUBERNETES:
        return (f"the cluster runs Kubernetes {git}: {FEATURES} are beta there (on by default, GA in 1.33); "
                "if a feature gate turned them off, pods misbehave: check SidecarContainers and JobBackoffLimitPerIndex")
    return None


def secret_refs(objects: list[Obj]) -> list[tuple[str, str | None, str]]:
    """(Secret, key or None for the whole Secret, who reads it) for each Secret a rendered pod needs:
    env valueFrom.secretKeyRef, envFrom secretRef, secret volumes (and their items); optional ones left out."""
    refs: list[tuple[str, str | None, str]] = []
    for obj in objects:
        if obj["kind"] != "Job":
            continue
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
        owner = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        for container in (pod.get("initContainers") or []) + (pod.get("containers") or []):
            where = f"{owner} container {container.get('name')}"
            for var in container.get("env") or []:
                ref = (var.get("valueFrom") or {}).get("secretKeyRef")
                if ref and not ref.get("optional"):
                    refs.append((ref["name"], ref["key"], f"{where} env {var.get('name')}"))
            for source in container.get("envFrom") or []:
                ref = source.get("secretRef")
                if ref and not ref.get("optional"):
                    refs.append((ref["name"], None, f"{where} envFrom"))
        for volume in pod.get("volumes") or []:
            secret = volume.get("secret")
            if secret and not secret.get("optional"):
                where = f"{owner} volume {volume.get('name')}"
                items = secret.get("items") or []
                refs += [(secret["secretName"], item["key"], where) for item in items] or [(secret["secretName"], None, where)]
    return refs


def check_secret_keys(kube: Kube, spec: SweepSpec, objects: list[Obj], warnings: list[str]) -> None:
    """Every Secret key the rendered pods read exists (else the pod waits in CreateContainerConfigError)."""
    c, ns = spec.cluster, spec.cluster.namespace
    fields = {name: f for name, f in ((c.s3_secret, "cluster.s3_secret"), (c.hf_token_secret, "cluster.hf_token_secret"))
              if name} | {name: "cluster.image_pull_secrets" for name in c.image_pull_secrets}
    rendered = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    seen: dict[str, Obj | None] = {}
    for name, key, where in secret_refs(objects):
        if name not in seen:
            try:
                seen[name] = rendered.get(name) or kube.get("Secret", ns, name)
            except Forbidden:
                seen[name] = None
                if not any(f"secret/{name} " in w for w in warnings):
                    warnings.append(f"cannot read secret/{name} (forbidden): its keys were not checked")
                continue
            if seen[name] is None:
                raise BadInput(f"{fields.get(name, where)}: secret {name!r} not found in namespace {ns!r} "
                               f"({where} reads it): create it")
        secret = seen[name]
        if secret is None or key is None:
            continue
        have = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
        if key not in have:
            raise BadInput(
                f"{fields.get(name, where)}: secret {name!r} has no key {key} ({where} reads it; it has "
                f"{', '.join(sorted(have)) or 'no keys'}): add it, e.g. kubectl -n {ns} create secret generic {name} "
                f"--from-literal={key}=... --dry-run=client -o yaml | kubectl apply -f -"
            )


def preflight(kube: Kube, spec: SweepSpec, objects: list[Obj] | None = None) -> list[str]:
    """Refuse what would leave pods stuck: a server older than 1.29, a missing namespace, Secret, Secret
    key (of `objects`, the rendered ones), PVC, StorageClass, Kueue LocalQueue or PriorityClass. Returns warnings."""
    c = spec.cluster
    ns = c.namespace
    warnings: list[str] = []
    if note := check_server_version(kube):
        warnings.append(note)
    if "://" not in spec.output or spec.output.startswith("file://"):
        raise BadInput(
            f"output: {spec.output!r} is a local path; a cluster sweep needs an object store "
            "(s3://bucket/prefix): a pod's disk goes away with the pod"
        )

    def check(kind: str, name: str, field_name: str, hint: str) -> Obj | None:
        try:
            obj = kube.get(kind, ns, name)
        except Forbidden:
            warnings.append(f"cannot read {kind.lower()}/{name} (forbidden): not checked")
            return None
        if obj is None:
            raise BadInput(f"{field_name}: {kind.lower()} {name!r} not found in namespace {ns!r}: {hint}")
        return obj

    try:
        if kube.get("Namespace", "", ns) is None:
            raise BadInput(
                f"cluster.namespace: namespace {ns!r} does not exist: create it (kubectl apply -k k8s/) "
                "or set cluster.namespace"
            )
    except Forbidden:
        pass  # namespaced accounts cannot read namespaces; the first create will tell
    if c.s3_secret:
        secret = check("Secret", c.s3_secret, "cluster.s3_secret",
                       "create it with your S3 credentials (see k8s/examples/s3-credentials.yaml), or set "
                       "cluster.s3_secret: null and cluster.service_account for workload identity")
        if secret is not None:
            if (secret["metadata"].get("annotations") or {}).get(EXAMPLE_ANNOTATION) == "true":
                raise BadInput(
                    f"cluster.s3_secret: secret {c.s3_secret!r} still holds the example placeholder values "
                    "from k8s/examples/: put your real S3 credentials in it and drop its thicket.dev/example annotation"
                )
            have = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
            missing = [k for k in S3_KEYS if k not in have]
            if missing:
                raise BadInput(f"cluster.s3_secret: secret {c.s3_secret!r} has no key {missing[0]}")
    if c.service_account:
        check("ServiceAccount", c.service_account, "cluster.service_account",
              "create it, annotated for your cloud's workload identity (docs/kubernetes-walkthrough.md, step 2)")
    cache = c.model_cache
    if serves_vllm(spec) and cache.claim and not cache.size:
        check("PersistentVolumeClaim", cache.claim, "cluster.model_cache.claim",
              "create it (see k8s/examples/model-cache-pvc.yaml), set cluster.model_cache.size for thicket to "
              "create it, or set cluster.model_cache.claim: null for an emptyDir per pod")
    if serves_vllm(spec) and c.hf_token_secret:
        check("Secret", c.hf_token_secret, "cluster.hf_token_secret", "create it with key HF_TOKEN")
    for name in c.image_pull_secrets:
        check("Secret", name, "cluster.image_pull_secrets", "create it (kubectl create secret docker-registry)")
    if objects is not None:
        check_secret_keys(kube, spec, objects, warnings)
    check_storage_class(kube, spec)
    check_scheduling_refs(kube, spec, warnings)
    return warnings
