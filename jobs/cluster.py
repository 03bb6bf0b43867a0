"""submit / status / logs / cancel / wait-job through the Kubernetes API.

Talks to the API server on plain JSON dicts, the same dicts `thicket.manifests` renders: through the
official `kubernetes` client with a kubeconfig, or straight over urllib3 with the pod's service account
in a cluster (so an image that only waits on Jobs needs no `kubernetes` package). Failures become
one-line errors: no cluster configured or reachable (exit 3), forbidden / unauthorized / rejected
objects / missing Secret or PVC (exit 2).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.manifests import (
    COMPONENT_LABEL,
    SPEC_KEY,
    SWEEP_LABEL,
    TEMPLATE_HASH,
    WORKER,
    serves_vllm,
)
from thicket.spec import SweepSpec

Obj = dict[str, Any]

RESOURCES: dict[str, tuple[str, str]] = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Secret": ("/api/v1", "secrets"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Pod": ("/api/v1", "pods"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Job": ("/apis/batch/v1", "jobs"),
}
# What `cancel` deletes, in this order (Jobs first: their pods go with them).
SWEEP_KINDS = ("Job", "ConfigMap", "RoleBinding", "Role", "ServiceAccount")
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
EXAMPLE_ANNOTATION = "thicket.dev/example"
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # the pod's service account (tests point it elsewhere)
NEEDS_CLIENT = "thicket's cluster commands need the kubernetes client: pip install 'thicket[cluster]'"
NO_CLUSTER = (
    "no Kubernetes cluster configured: set KUBECONFIG (or create ~/.kube/config), or run inside a cluster"
)


class NotFound(Exception):
    pass


class Conflict(Exception):
    pass


class Forbidden(BadInput):
    """The API server refused the request (403): the account lacks a permission."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class Transport:
    """How a Kube request reaches the API server: send one request, answer a urllib3 response
    (unread: `.status`, `.data`, `.stream()`). `host` and `auth_hint` go into error messages."""

    host: str
    auth_hint: str

    def send(self, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str],
             body: Any, timeout: tuple[float, float | None]) -> Any:
        raise NotImplementedError


class ApiClientTransport(Transport):
    """Through a `kubernetes.client.ApiClient` (a kubeconfig, outside a cluster)."""

    auth_hint = "check your kubeconfig"

    def __init__(self, api_client: Any) -> None:
        self.api = api_client
        self.host = api_client.configuration.host

    def send(self, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str],
             body: Any, timeout: tuple[float, float | None]) -> Any:
        params = self.api.param_serialize(
            method=method, resource_path=path, query_params=query, header_params=headers,
            body=body, auth_settings=["BearerToken"],
        )
        return self.api.call_api(*params, _request_timeout=timeout).response


def _sa_file(path: str) -> str:
    """A service account file's text (token, ca.crt, namespace); Unavailable when missing or empty."""
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError as err:
        raise Unavailable(f"in-cluster Kubernetes config: cannot read {path} ({err.strerror})") from None
    if not text:
        raise Unavailable(f"in-cluster Kubernetes config: {path} is empty")
    return text


class InClusterTransport(Transport):
    """Straight over urllib3 with the pod's service account: no `kubernetes` package needed."""

    auth_hint = "check the pod's service account"

    def __init__(self, sa_dir: str = SA_DIR, retries: int = 1) -> None:
        from thicket.transport import proxy_for

        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise Unavailable(f"{NO_CLUSTER} (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set)")
        self.host = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        self.token_path = os.path.join(sa_dir, "token")
        self.token()  # a missing token fails here, not at the first request
        try:
            self.namespace: str | None = _sa_file(os.path.join(sa_dir, "namespace"))
        except Unavailable:
            self.namespace = None
        ca = _sa_file(os.path.join(sa_dir, "ca.crt"))
        tls: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_cert_data": ca, "retries": retries}
        proxy = proxy_for(self.host)
        self.pool = urllib3.ProxyManager(proxy, **tls) if proxy else urllib3.PoolManager(**tls)

    def token(self) -> str:
        """Read for each request: the kubelet rotates bound service account tokens in place."""
        return _sa_file(self.token_path)

    def send(self, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str],
             body: Any, timeout: tuple[float, float | None]) -> Any:
        url = self.host + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {**headers, "Authorization": f"Bearer {self.token()}"}
        return self.pool.request(method, url, body=data, headers=headers, preload_content=False,
                                 timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]))


class Kube:
    """A thin JSON client for the few REST paths thicket needs."""

    def __init__(self, client: Any, namespace: str | None = None, timeout: tuple[float, float] = (5, 30)) -> None:
        """client: a Transport, or a `kubernetes.client.ApiClient`."""
        self.transport: Transport = client if isinstance(client, Transport) else ApiClientTransport(client)
        self.host = self.transport.host
        self.default_namespace = namespace
        self.timeout = timeout

    # -- transport ---------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
        stream: bool = False,
        timeout: Any = None,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            response = self.transport.send(method, path, query or [], headers, body, timeout or self.timeout)
        except (urllib3.exceptions.HTTPError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise Unavailable(f"cannot reach the Kubernetes API at {self.host}: {_one_line(reason)}") from None
        except Exception as err:  # ApiException(status=0) for TLS failures, and the like
            if type(err).__name__ == "ApiException":
                raise Unavailable(f"cannot reach the Kubernetes API at {self.host}: {_one_line(err.reason)}") from None
            raise
        if 200 <= response.status < 300:
            if stream:
                return response
            data = response.data
            return json.loads(data) if data else {}
        raise self._error(method, path, response.status, response.data)

    def _error(self, method: str, path: str, status: int, data: bytes) -> Exception:
        """The exception for an answer outside 2xx."""
        try:
            message = json.loads(data).get("message") or ""
        except (ValueError, AttributeError):
            message = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
        message = _one_line(message)[:400]
        if status == 404:
            return NotFound(message)
        if status == 409:
            return Conflict(message)
        if status == 401:
            return BadInput(f"the Kubernetes API at {self.host} did not accept the credentials (401 Unauthorized): "
                            f"{self.transport.auth_hint}")
        if status == 403:
            return Forbidden(f"forbidden (403): {message or method + ' ' + path}")
        if status in (400, 422):
            return BadInput(f"the API server rejected {method} {path}: {message}")
        if status >= 500 or status == 429:
            return Unavailable(f"the Kubernetes API at {self.host} answered {status}: {message}")
        return ThicketError(f"{method} {path}: HTTP {status}: {message}")

    # -- objects -----------------------------------------------------------------------------
    @staticmethod
    def path(kind: str, namespace: str, name: str | None = None) -> str:
        if kind == "Namespace":
            return "/api/v1/namespaces" + (f"/{quote(name)}" if name else "")
        prefix, plural = RESOURCES[kind]
        out = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
        return out + (f"/{quote(name)}" if name else "")

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            return self.request("GET", self.path(kind, namespace, name))
        except NotFound:
            return None

    def list(self, kind: str, namespace: str, selector: str) -> list[Obj]:
        return self.request("GET", self.path(kind, namespace), query=[("labelSelector", selector)]).get("items") or []

    def create(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self.request("POST", self.path(obj["kind"], meta.get("namespace", ""), None), body=obj)

    def replace(self, obj: Obj) -> Obj:
        meta = obj["metadata"]
        return self.request("PUT", self.path(obj["kind"], meta.get("namespace", ""), meta["name"]), body=obj)

    def patch(self, kind: str, namespace: str, name: str, patch: Obj) -> Obj:
        return self.request("PATCH", self.path(kind, namespace, name), body=patch, content_type="application/merge-patch+json")

    def delete(self, kind: str, namespace: str, name: str, propagation: str = "Background") -> bool:
        try:
            self.request("DELETE", self.path(kind, namespace, name), body={"propagationPolicy": propagation})
            return True
        except NotFound:
            return False

    def logs(self, namespace: str, pod: str, container: str, follow: bool, tail: int | None) -> Iterator[bytes]:
        query = [("container", container)]
        if follow:
            query.append(("follow", "true"))
        if tail is not None:
            query.append(("tailLines", str(tail)))
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(pod)}/log"
        response = self.request("GET", path, query=query, stream=True, timeout=(self.timeout[0], None) if follow else None)
        try:
            yield from response.stream(4096)
        finally:
            response.release_conn()


def connect(context: str | None = None) -> Kube:
    """A client from KUBECONFIG / ~/.kube/config (optionally a context), or the in-cluster account
    (KUBERNETES_SERVICE_HOST set, no KUBECONFIG, no context: needs no `kubernetes` package)."""
    if context is None and os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        transport = InClusterTransport(SA_DIR)
        return Kube(transport, transport.namespace)
    return _connect_kubeconfig(context)


def _connect_kubeconfig(context: str | None) -> Kube:
    try:
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise BadInput(NEEDS_CLIENT) from None

    configuration = client.Configuration()
    try:
        config_file = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        config.load_kube_config(config_file=config_file, context=context, client_configuration=configuration)
        namespace = _context_namespace(config, config_file, context)
    except ConfigException as err:
        detail = _one_line(err)
        if context is not None and "context" in detail.lower():
            raise BadInput(f"--context: {detail}") from None
        raise Unavailable(f"{NO_CLUSTER} ({detail})") from None
    except (OSError, TypeError, ValueError, KeyError) as err:
        raise Unavailable(f"{NO_CLUSTER} (kubeconfig unusable: {_one_line(err)})") from None
    configuration.retries = 1
    return Kube(client.ApiClient(configuration), namespace)


def _context_namespace(config: Any, config_file: str, context: str | None) -> str | None:
    """The namespace of the kubeconfig context in use (`context`, else the current one), if any."""
    from kubernetes.config.config_exception import ConfigException

    try:
        contexts, active = config.list_kube_config_contexts(config_file=config_file)
        if context is not None:
            active = next((c for c in contexts if c["name"] == context), active)
        return (active or {}).get("context", {}).get("namespace")
    except (ConfigException, OSError, KeyError, TypeError):
        return None


# -- submit -------------------------------------------------------------------------------------
def is_subset(want: Any, have: Any) -> bool:
    """Whether everything in `want` is in `have` (the server adds defaults and status)."""
    if isinstance(want, dict):
        return isinstance(have, dict) and all(k in have and is_subset(v, have[k]) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(is_subset, want, have))
    return want == have


def _meta_subset(obj: Obj) -> Obj:
    return {k: obj["metadata"][k] for k in ("labels", "annotations") if k in obj["metadata"]}


def preflight(kube: Kube, spec: SweepSpec) -> list[str]:
    """Refuse what would leave pods stuck: a missing namespace, Secret or PVC. Returns warnings."""
    c = spec.cluster
    ns = c.namespace
    warnings: list[str] = []
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
                       "create it with your S3 credentials (see k8s/s3-credentials.example.yaml)")
        if secret is not None:
            if (secret["metadata"].get("annotations") or {}).get(EXAMPLE_ANNOTATION) == "true":
                raise BadInput(
                    f"cluster.s3_secret: secret {c.s3_secret!r} still holds the example placeholder values "
                    "from k8s/: put your real S3 credentials in it and drop its thicket.dev/example annotation"
                )
            have = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
            missing = [k for k in S3_KEYS if k not in have]
            if missing:
                raise BadInput(f"cluster.s3_secret: secret {c.s3_secret!r} has no key {missing[0]}")
    if serves_vllm(spec) and c.model_cache_pvc:
        check("PersistentVolumeClaim", c.model_cache_pvc, "cluster.model_cache_pvc",
              "create it (see k8s/model-cache-pvc.yaml) or set cluster.model_cache_pvc: null for an emptyDir")
    if serves_vllm(spec) and c.hf_token_secret:
        check("Secret", c.hf_token_secret, "cluster.hf_token_secret", "create it with key HF_TOKEN")
    for name in c.image_pull_secrets:
        check("Secret", name, "cluster.image_pull_secrets", "create it (kubectl create secret docker-registry)")
    return warnings


def _wait_gone(kube: Kube, kind: str, ns: str, name: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while kube.get(kind, ns, name) is not None:
        if time.monotonic() > deadline:
            raise Unavailable(f"{kind.lower()}/{name} was not deleted within {timeout_s:g} s")
        time.sleep(1)


def apply_object(kube: Kube, obj: Obj, replace: bool = False) -> str:
    """Create or update one object; returns created / unchanged / updated / replaced."""
    kind, meta = obj["kind"], obj["metadata"]
    ns, name = meta["namespace"], meta["name"]
    live = kube.get(kind, ns, name)
    if live is None:
        try:
            kube.create(obj)
            return "created"
        except Conflict:
            live = kube.get(kind, ns, name)
            if live is None:
                raise
    if kind == "Job":
        want_hash = meta["annotations"][TEMPLATE_HASH]
        have_hash = (live["metadata"].get("annotations") or {}).get(TEMPLATE_HASH)
        if want_hash != have_hash:
            if not replace:
                raise BadInput(
                    f"job/{name} exists with a different pod template (a Job's template cannot change): "
                    "rerun with --replace to delete and recreate it (committed tasks are kept and skipped), "
                    "or rename the sweep"
                )
            kube.delete("Job", ns, name, propagation="Foreground")
            _wait_gone(kube, "Job", ns, name)
            kube.create(obj)
            return "replaced"
        mutable = {k: obj["spec"][k] for k in ("parallelism", "ttlSecondsAfterFinished", "maxFailedIndexes") if k in obj["spec"]}
        want = {"metadata": _meta_subset(obj), "spec": mutable}
        if is_subset(want, live):
            return "unchanged"
        kube.patch("Job", ns, name, want)
        return "updated"
    if kind == "RoleBinding" and live.get("roleRef") != obj.get("roleRef"):
        kube.delete(kind, ns, name)  # roleRef is immutable
        _wait_gone(kube, kind, ns, name)
        kube.create(obj)
        return "updated"
    if is_subset(obj, live):
        return "unchanged"
    body = json.loads(json.dumps(obj))
    body["metadata"]["resourceVersion"] = live["metadata"].get("resourceVersion")
    kube.replace(body)
    return "updated"


def submit(kube: Kube, spec: SweepSpec, objects: list[Obj], replace: bool = False,
           echo: Callable[[str], None] = print) -> dict[str, str]:
    for warning in preflight(kube, spec):
        echo(f"warning: {warning}")
    # Jobs whose pod template changed go first, before the ConfigMap changes under running pods.
    stale = []
    for obj in objects:
        if obj["kind"] == "Job":
            meta = obj["metadata"]
            live = kube.get("Job", meta["namespace"], meta["name"])
            if live is not None and (live["metadata"].get("annotations") or {}).get(TEMPLATE_HASH) != meta["annotations"][TEMPLATE_HASH]:
                stale.append(obj)
    if stale and not replace:
        raise BadInput(
            f"job/{stale[0]['metadata']['name']} exists with a different pod template (a Job's template cannot "
            "change): rerun with --replace to delete and recreate it (committed tasks are kept and skipped), "
            "or rename the sweep"
        )
    for obj in stale:
        meta = obj["metadata"]
        kube.delete("Job", meta["namespace"], meta["name"], propagation="Foreground")
        _wait_gone(kube, "Job", meta["namespace"], meta["name"])
    replaced = {f"job/{o['metadata']['name']}" for o in stale}
    done: dict[str, str] = {}
    for obj in objects:
        key = f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        action = apply_object(kube, obj, replace)
        done[key] = "replaced" if key in replaced and action == "created" else action
        echo(f"{key} {done[key]}")
    return done


# -- status -------------------------------------------------------------------------------------
def parse_index_set(text: str | None) -> set[int]:
    """'1,3-5,7' (a Job's completedIndexes / failedIndexes) -> {1, 3, 4, 5, 7}."""
    out: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def format_index_set(indexes: set[int] | list[int], limit: int = 8) -> str:
    """{0, 1, 2, 5} -> '0-2,5' (at most `limit` runs, then '…')."""
    runs: list[str] = []
    ordered = sorted(indexes)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs[:limit]) + (",…" if len(runs) > limit else "")


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def format_duration(seconds: float) -> str:
    seconds = int(max(0, seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


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


@dataclass
class SweepStatus:
    sweep: str
    namespace: str
    job: str
    state: str
    completions: int
    indexes: dict[str, set[int]]  # completed / failed / running / pending / waiting
    started: datetime | None
    ended: datetime | None
    tasks_total: int | None = None
    tasks_committed: int | None = None
    storage_note: str | None = None
    sweep_uri: str | None = None
    aggregate: str | None = None
    now: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def fraction(self) -> float:
        if self.tasks_total and self.tasks_committed is not None:
            return min(1.0, self.tasks_committed / self.tasks_total)
        return len(self.indexes["completed"]) / self.completions if self.completions else 0.0

    @property
    def elapsed_s(self) -> float | None:
        if self.started is None:
            return None
        return ((self.ended or self.now) - self.started).total_seconds()

    @property
    def eta_s(self) -> float | None:
        f, elapsed = self.fraction, self.elapsed_s
        if self.ended is not None or elapsed is None or f <= 0 or f >= 1:
            return None
        return elapsed * (1 - f) / f

    def lines(self) -> list[str]:
        counts = ", ".join(
            f"{len(v)} {k}" + (f" [{format_index_set(v)}]" if v and k != "waiting" else "")
            for k, v in self.indexes.items() if v
        )
        when = ""
        if self.started is not None:
            when = f", started {self.started:%Y-%m-%d %H:%M:%S}Z, {format_duration(self.elapsed_s or 0)} {'in all' if self.ended else 'ago'}"
        out = [
            f"sweep      {self.sweep} (namespace {self.namespace})",
            f"job        {self.job}: {self.state}{when}",
            f"indexes    {self.completions}: {counts or 'none started'}",
        ]
        if self.tasks_committed is not None:
            out.append(f"tasks      {self.tasks_committed} of {self.tasks_total} committed ({self.fraction:.1%}) in {self.sweep_uri}")
        elif self.storage_note:
            out.append(f"tasks      {self.tasks_total or '?'} in all; committed: unknown ({self.storage_note})")
        if self.aggregate:
            out.append(f"aggregate  {self.aggregate}")
        return out


def sweep_jobs(kube: Kube, namespace: str, sweep: str) -> dict[str, Obj]:
    jobs = kube.list("Job", namespace, f"{SWEEP_LABEL}={sweep}")
    found = {(j["metadata"].get("labels") or {}).get(COMPONENT_LABEL, ""): j for j in jobs}
    if "rollout" not in found:
        raise BadInput(f"no sweep {sweep!r} in namespace {namespace!r}: submit it with `thicket submit SPEC`, or pass -n NAMESPACE")
    return found


def pod_index(pod: Obj) -> int | None:
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get(INDEX_KEY) or (meta.get("annotations") or {}).get(INDEX_KEY)
    return int(raw) if raw is not None and str(raw).isdigit() else None


def sweep_spec_from_cluster(kube: Kube, namespace: str, sweep: str) -> SweepSpec | None:
    from thicket.spec import parse_spec
    import yaml

    maps = kube.list("ConfigMap", namespace, f"{SWEEP_LABEL}={sweep},{COMPONENT_LABEL}=spec")
    if not maps:
        return None
    return parse_spec(yaml.safe_load(maps[0]["data"][SPEC_KEY]), f"configmap/{maps[0]['metadata']['name']}")


def committed_count(spec: SweepSpec) -> int:
    """Committed tasks of the spec's range, from the commit markers' names (a listing, no reads)."""
    from thicket.storage.shards import commit_key
    from thicket.storage.store import open_store

    settings = spec.storage.settings() if hasattr(spec, "storage") else None
    store = open_store(spec.sweep_uri, settings) if settings is not None else open_store(spec.sweep_uri)
    prefix = commit_key(0).rsplit("/", 1)[0] + "/"
    pattern = re.compile(r"task-(\d+)\.json$")
    tasks = {int(m.group(1)) for key in store.list(prefix) if (m := pattern.search(key))}
    return sum(1 for task in tasks if spec.tasks.start <= task < spec.tasks.stop)


def sweep_status(kube: Kube, namespace: str, sweep: str, storage: bool = True) -> SweepStatus:
    jobs = sweep_jobs(kube, namespace, sweep)
    job = jobs["rollout"]
    spec_obj, status = job.get("spec") or {}, job.get("status") or {}
    completions = int(spec_obj.get("completions") or 0)
    completed = parse_index_set(status.get("completedIndexes"))
    failed = parse_index_set(status.get("failedIndexes"))
    running: set[int] = set()
    pending: set[int] = set()
    for pod in kube.list("Pod", namespace, f"{SWEEP_LABEL}={sweep},{COMPONENT_LABEL}=rollout"):
        index = pod_index(pod)
        if index is None or index in completed or index in failed or (pod["metadata"].get("deletionTimestamp")):
            continue
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            running.add(index)
        elif phase == "Pending":
            pending.add(index)
    pending -= running
    waiting = set(range(completions)) - completed - failed - running - pending
    result = SweepStatus(
        sweep=sweep, namespace=namespace, job=job["metadata"]["name"], state=job_state(job), completions=completions,
        indexes={"completed": completed, "failed": failed, "running": running, "pending": pending, "waiting": waiting},
        started=parse_time(status.get("startTime")), ended=parse_time(status.get("completionTime")),
    )
    if finished(job) and result.ended is None:
        times = [parse_time(c.get("lastTransitionTime")) for c in status.get("conditions") or [] if c.get("status") == "True"]
        result.ended = max((t for t in times if t), default=None)
    spec = sweep_spec_from_cluster(kube, namespace, sweep)
    if spec is not None:
        result.tasks_total, result.sweep_uri = spec.tasks.count, spec.sweep_uri
        if storage:
            try:
                result.tasks_committed = committed_count(spec)
            except Exception as err:  # storage unreachable from here: the Job's view still stands
                result.storage_note = _one_line(str(err))[:200]
        else:
            result.storage_note = "storage not read"
    if "aggregate" in jobs:
        agg = jobs["aggregate"]
        state = job_state(agg)
        result.aggregate = f"job {agg['metadata']['name']}: " + (
            "waiting for the rollout" if state in ("Running", "Pending") and not finished(job) else state
        )
    return result


def render_status(status: SweepStatus) -> Any:
    """The status lines plus a progress bar and ETA, as one rich renderable."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table
    from rich.text import Text

    bar = Table.grid(padding=(0, 1))
    bar.add_column(width=10)
    bar.add_column(width=40)
    bar.add_column()
    total = status.tasks_total if status.tasks_committed is not None else status.completions
    done = status.tasks_committed if status.tasks_committed is not None else len(status.indexes["completed"])
    eta = status.eta_s
    tail = f"{status.fraction:6.1%}" + (f"  ETA {format_duration(eta)}" if eta is not None else "")
    bar.add_row("progress", ProgressBar(total=max(total or 1, 1), completed=done or 0, width=40), tail)
    return Group(*(Text(line) for line in status.lines()), bar)


# -- logs, cancel, wait ---------------------------------------------------------------------
def index_pod(kube: Kube, namespace: str, sweep: str, index: int) -> Obj:
    job = sweep_jobs(kube, namespace, sweep)["rollout"]
    completions = int((job.get("spec") or {}).get("completions") or 0)
    if not 0 <= index < completions:
        raise BadInput(f"--index: {index} is outside 0-{completions - 1} for sweep {sweep!r}")
    pods = [p for p in kube.list("Pod", namespace, f"{SWEEP_LABEL}={sweep},{COMPONENT_LABEL}=rollout") if pod_index(p) == index]
    if not pods:
        raise BadInput(f"--index: no pod for index {index} of sweep {sweep!r} yet (see `thicket status {sweep}`)")
    return max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")


def cancel(kube: Kube, namespace: str, sweep: str, echo: Callable[[str], None] = print) -> int:
    deleted = 0
    for kind in SWEEP_KINDS:
        for obj in kube.list(kind, namespace, f"{SWEEP_LABEL}={sweep}"):
            name = obj["metadata"]["name"]
            if kube.delete(kind, namespace, name):
                deleted += 1
                echo(f"{kind.lower()}/{name} deleted")
    if not deleted:
        raise BadInput(f"no sweep {sweep!r} in namespace {namespace!r} (nothing to cancel)")
    return deleted


def wait_job(
    kube: Kube, namespace: str, name: str, timeout_s: float = 0, interval_s: float = 10,
    echo: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Poll Job `name` until it is Complete or Failed; returns that state. timeout_s 0: no limit."""
    start = clock()
    last = None
    missing_since: float | None = None
    while True:
        job = kube.get("Job", namespace, name)
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
        if timeout_s and clock() - start >= timeout_s:
            raise Unavailable(f"job/{name} did not finish within {timeout_s:g} s")
        sleep(interval_s)


def default_namespace(kube: Kube | None, explicit: str | None) -> str:
    from thicket.cluster_spec import ClusterSpec

    return explicit or (kube.default_namespace if kube else None) or ClusterSpec().namespace


def stdout_write(chunk: bytes) -> None:
    sys.stdout.buffer.write(chunk)
    sys.stdout.buffer.flush()


__all__ = [
    "Kube", "NotFound", "Forbidden", "connect", "preflight", "apply_object", "submit", "sweep_status",
    "render_status", "index_pod", "cancel", "wait_job", "parse_index_set", "format_index_set", "WORKER",
]
