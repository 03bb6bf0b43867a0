"""The Kubernetes API client: a thin JSON client for the few REST paths thicket needs.

Talks to the API server on plain JSON dicts, the same dicts `thicket.k8s.render` renders: through the
official `kubernetes` client with a kubeconfig, or straight over urllib3 with the pod's service account
in a cluster (so an image that only waits on Jobs needs no `kubernetes` package). Failures become
one-line errors: no cluster configured or reachable (exit 3), forbidden / unauthorized / rejected
objects / conflicts (exit 2). A 429 (honouring Retry-After), a 5xx and a dropped connection are
retried a few times (thicket.k8s.api_retry: RETRY_TRIES tries within RETRY_BUDGET_S seconds) before they fail.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote

import urllib3

from thicket.errors import BadInput, ThicketError, Unavailable
from thicket.k8s.api_retry import (
    RETRY_BUDGET_S,
    RETRY_STATUSES,
    RETRY_TRIES,
    Transient,
    dropped,
    pool_retries,
    retrying,
)
from thicket.k8s.api_transport import NO_CLUSTER, ApiClientTransport, InClusterTransport, Transport

__all__ = ["ApiClientTransport", "InClusterTransport", "Kube", "Transport", "connect", "default_namespace"]

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
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "PodMonitor": ("/apis/monitoring.coreos.com/v1", "podmonitors"),
    "Event": ("/api/v1", "events"),  # read only: why a pod is stuck (thicket status)
    "Workload": ("/apis/kueue.x-k8s.io/v1beta1", "workloads"),  # a queued Job's, stopped the Kueue way
    "LocalQueue": ("/apis/kueue.x-k8s.io/v1beta1", "localqueues"),  # read only: preflight of cluster.queue
}


SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # the pod's service account (tests point it elsewhere)


NEEDS_CLIENT = "thicket's cluster commands need the kubernetes client: pip install 'thicket[cluster]'"


PAGE_SIZE = 500  # objects per list request (limit / continue)


class NotFound(Exception):
    pass


class Conflict(BadInput):
    """409: the object exists already, or changed since it was read (exit 2, one line)."""


class Forbidden(BadInput):
    """The API server refused the request (403): the account lacks a permission."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class Kube:
    """A thin JSON client for the few REST paths thicket needs."""

    def __init__(self, client: Any, namespace: str | None = None, timeout: tuple[float, float] = (5, 30)) -> None:
        """client: a Transport, or a `kubernetes.client.ApiClient`."""
        self.transport: Transport = client if isinstance(client, Transport) else ApiClientTransport(client)
        self.host = self.transport.host
        self.default_namespace = namespace
        self.timeout = timeout
        self.sleep: Callable[[float], None] = time.sleep  # between retries (tests record instead)
        self.retry_tries = RETRY_TRIES
        self.retry_budget_s = RETRY_BUDGET_S

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
        tries = retrying(self.retry_tries, self.retry_budget_s, self.sleep)
        try:
            response = tries(self._send_once, method, path, query or [], headers, body, timeout or self.timeout)
        except Transient as last:
            if last.response is None:
                raise Unavailable(f"cannot reach the Kubernetes API at {self.host}: {last.error} "
                                  f"(tried {tries.statistics.get('attempt_number', 1)} times)") from None
            response = last.response
        if 200 <= response.status < 300:
            if stream:
                return response
            data = response.data
            return json.loads(data) if data else {}
        raise self._error(method, path, response.status, response.data)

    def _send_once(self, method: str, path: str, query: list[tuple[str, str]], headers: dict[str, str], body: Any,
                   timeout: Any) -> Any:
        """One try: the response, or Transient for one worth repeating."""
        try:
            response = self.transport.send(method, path, query, headers, body, timeout)
        except (urllib3.exceptions.HTTPError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            if dropped(err):
                raise Transient(error=_one_line(reason)) from None
            raise Unavailable(f"cannot reach the Kubernetes API at {self.host}: {_one_line(reason)}") from None
        except Exception as err:  # ApiException(status=0) for TLS failures, and the like
            if type(err).__name__ == "ApiException":
                raise Unavailable(f"cannot reach the Kubernetes API at {self.host}: {_one_line(err.reason)}") from None
            raise
        if response.status in RETRY_STATUSES:
            raise Transient(response)
        return response

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
            return Conflict(f"conflict (409) on {method} {path}: {message}")
        if status == 401:
            return BadInput(f"the Kubernetes API at {self.host} did not accept the credentials (401 Unauthorized): "
                            f"{self.transport.auth_hint}")
        if status == 403:
            return Forbidden(f"forbidden (403): {message or method + ' ' + path}")
        if status in (400, 422):
            return BadInput(f"the API server rejected {method} {path}: {message}")
        if status >= 500 or status == 429:
            tries = f" (after {self.retry_tries} tries)" if status in RETRY_STATUSES else ""
            return Unavailable(f"the Kubernetes API at {self.host} answered {status}{tries}: {message}")
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

    def list(self, kind: str, namespace: str, selector: str, fields: str | None = None,
             page_size: int = PAGE_SIZE) -> list[Obj]:
        """Objects matching a label selector (and a field selector, such as `type=Warning`), read
        page_size at a time (limit / continue)."""
        return list(self.pages(self.path(kind, namespace), selector, fields, page_size))

    def pages(self, path: str, selector: str = "", fields: str | None = None,
              page_size: int = PAGE_SIZE) -> Iterator[Obj]:
        """A list's items, one request per page_size of them (limit / continue)."""
        base = ([("labelSelector", selector)] if selector else []) + ([("fieldSelector", fields)] if fields else [])
        token: str | None = None
        while True:
            query = base + [("limit", str(page_size))] + ([("continue", token)] if token else [])
            answer = self.request("GET", path, query=query)
            yield from answer.get("items") or []
            token = (answer.get("metadata") or {}).get("continue")
            if not token:
                return

    def server_version(self) -> tuple[int, int, str]:
        """The API server's (major, minor, gitVersion), from /version (what VersionApi.get_code reads)."""
        info = self.request("GET", "/version")
        major = "".join(ch for ch in str(info.get("major", "")) if ch.isdigit())
        minor = "".join(ch for ch in str(info.get("minor", "")) if ch.isdigit())
        git = str(info.get("gitVersion") or f"v{major}.{minor}")
        if not (major and minor):  # some distributions leave major/minor empty: read gitVersion
            parts = git.lstrip("v").split(".")
            major, minor = (parts + ["0", "0"])[0], "".join(ch for ch in (parts + ["0", "0"])[1] if ch.isdigit())
        return int(major or 0), int(minor or 0), git

    def storage_class(self, name: str) -> Obj | None:
        try:
            return self.request("GET", f"/apis/storage.k8s.io/v1/storageclasses/{quote(name)}")
        except NotFound:
            return None

    def storage_classes(self) -> list[Obj]:
        return list(self.pages("/apis/storage.k8s.io/v1/storageclasses"))

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

    def evict(self, namespace: str, pod: str) -> None:
        """Evict a pod through the Eviction API (it gets the DisruptionTarget condition and ends,
        https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/); gone already is fine."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
        try:
            self.request("POST", f"{self.path('Pod', namespace, pod)}/eviction", body=body)
        except NotFound:
            pass

    def logs(self, namespace: str, pod: str, container: str, follow: bool, tail: int | None,
             previous: bool = False) -> Iterator[bytes]:
        """A container's log; `previous`: its previous instance's, the one that crashed before the restart
        (pods/log `previous=true`, https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/pod-v1/#get-read-log-of-the-specified-pod)."""
        query = [("container", container)]
        if previous:
            query.append(("previous", "true"))
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
    config_file = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    _check_kubeconfig_exists(config_file)
    try:
        config.load_kube_config(config_file=config_file, context=context, client_configuration=configuration)
        namespace = _context_namespace(config, config_file, context)
    except ConfigException as err:
        detail = _one_line(err)
        if context is not None and "context" in detail.lower():
            raise BadInput(f"--context: {detail}") from None
        raise Unavailable(f"{NO_CLUSTER} ({detail})") from None
    except (OSError, TypeError, ValueError, KeyError) as err:
        raise Unavailable(f"{NO_CLUSTER} (kubeconfig unusable: {_one_line(err)})") from None
    configuration.retries = pool_retries()
    return Kube(client.ApiClient(configuration), namespace)


def _check_kubeconfig_exists(config_file: str) -> None:
    """A kubeconfig that is not there is a user mistake (exit 2), not an unreachable cluster:
    BadInput naming the path(s) tried and where they came from (KUBECONFIG, else ~/.kube/config)."""
    paths = [p for p in config_file.split(os.pathsep) if p]
    if any(os.path.exists(p) for p in paths):
        return
    tried = ", ".join(paths) or repr(config_file)
    source = "from KUBECONFIG" if os.environ.get("KUBECONFIG") else "the default; KUBECONFIG is not set"
    raise BadInput(
        f"no kubeconfig at {tried} ({source}): set KUBECONFIG to your cluster's kubeconfig "
        "(or create ~/.kube/config), or run inside a cluster"
    )


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


def default_namespace(kube: Kube | None, explicit: str | None) -> str:
    from thicket.cluster_spec.cluster import ClusterSpec

    return explicit or (kube.default_namespace if kube else None) or ClusterSpec().namespace
