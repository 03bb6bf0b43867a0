"""How a Kube request (thicket.k8s.client) reaches the API server: through the official
`kubernetes` client with a kubeconfig, or straight over urllib3 with the pod's service account."""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import urlencode

import urllib3

from thicket.errors import Unavailable
from thicket.k8s.api_retry import pool_retries

NO_CLUSTER = (
    "no Kubernetes cluster configured: set KUBECONFIG (or create ~/.kube/config), or run inside a cluster"
)


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

    def __init__(self, sa_dir: str, retries: Any = None) -> None:
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
        tls: dict[str, Any] = {"cert_reqs": "CERT_REQUIRED", "ca_cert_data": ca,
                               "retries": pool_retries() if retries is None else retries}
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
