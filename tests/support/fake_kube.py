"""A tiny in-memory stand-in for the Kubernetes API server (no real one can run here).

It speaks the REST paths thicket's controller uses (namespaced CRUD for ConfigMaps, Secrets,
ServiceAccounts, PVCs, Pods, Events, Roles, RoleBindings and Jobs; label and field selectors; paged
lists (limit / continue); JSON merge patch; pod logs (and `previous=true`: 400 when the container
has not restarted); owner references collected at once; /version; StorageClasses; PriorityClasses;
Kueue Workloads and LocalQueues; scripted failures: 429 with Retry-After, 5xx, dropped connections) with the status codes of the real server (404, 409, 403, 422 for a changed Job
template), so the controller's real client code runs end to end against it. Not a validator:
schema and semantic checks live in the manifest tests.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from tests.support.http_stub import QuietHandler, serving

PATH = re.compile(
    r"^/(?:api/v1|apis/batch/v1|apis/rbac\.authorization\.k8s\.io/v1|apis/networking\.k8s\.io/v1"
    r"|apis/monitoring\.coreos\.com/v1|apis/kueue\.x-k8s\.io/v1beta1)/namespaces/(?P<ns>[^/]+)"
    r"(?:/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>log|status|eviction))?)?)?$"
)


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def selects(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def field_value(obj: dict, path: str) -> Any:
    """A field selector's value: 'involvedObject.kind' -> obj["involvedObject"]["kind"]."""
    for key in path.split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def selects_fields(selector: str, obj: dict) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        if str(field_value(obj, key)) != value:
            return False
    return True


class FakeKube:
    def __init__(self, namespaces: tuple[str, ...] = ("thicket",)) -> None:
        self.namespaces = set(namespaces)
        self.objects: dict[tuple[str, str, str], dict] = {}  # (plural, ns, name) -> object
        self.logs: dict[tuple[str, str], str] = {}  # (pod, container) -> text
        self.previous_logs: dict[tuple[str, str], str] = {}  # (pod, container) -> its previous instance's text
        self.priority_classes: dict[str, int] = {}  # PriorityClass name -> value (cluster-scoped)
        self.forbidden: set[tuple[str, str]] = set()  # (method, plural)
        self.requests: list[tuple[str, str]] = []
        # Jobs that end as soon as they are created, by component label: {"prefetch": "Complete"}.
        self.job_ends: dict[str, str] = {}
        self.version = 0
        self.lock = threading.Lock()
        self.server_version = {"major": "1", "minor": "33", "gitVersion": "v1.33.1"}  # GET /version
        self.storage_classes: dict[str, dict] = {  # GKE's: a default class, and Filestore's for ReadWriteMany
            "standard": {"metadata": {"name": "standard", "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}}, "provisioner": "pd.csi.storage.gke.io"},
            "standard-rwx": {"metadata": {"name": "standard-rwx"}, "provisioner": "filestore.csi.storage.gke.io"},
        }
        # Scripted answers, taken before the real one, by (method, plural): [(status, headers), ...];
        # status None drops the connection without an answer.
        self.failures: dict[tuple[str, str], list[tuple[int | None, dict[str, str]]]] = {}
        self.list_limits: list[tuple[str, int | None]] = []  # (plural, limit) of each list request
        self.evictions: list[str] = []  # pods evicted through pods/{name}/eviction

    def put(self, plural: str, obj: dict) -> dict:
        meta = obj.setdefault("metadata", {})
        self.version += 1
        meta.setdefault("uid", f"uid-{self.version}")
        meta.setdefault("creationTimestamp", f"2026-01-01T00:00:{self.version % 60:02d}Z")
        meta["resourceVersion"] = str(self.version)
        self.objects[(plural, meta.get("namespace", ""), meta["name"])] = obj
        return obj

    def get(self, plural: str, ns: str, name: str) -> dict | None:
        return self.objects.get((plural, ns, name))

    def collect_garbage(self) -> None:
        """As Kubernetes' garbage collector does (here at once): delete every object whose owner
        references all name objects that no longer exist."""
        while True:
            uids = {o["metadata"]["uid"] for o in self.objects.values()}
            orphans = [key for key, o in self.objects.items() if (refs := o["metadata"].get("ownerReferences"))
                       and not any(ref["uid"] in uids for ref in refs)]
            if not orphans:
                return
            for key in orphans:
                del self.objects[key]

    def handle(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        parsed = urlparse(url)
        query = parse_qs(parsed.query)
        with self.lock:
            self.requests.append((method, parsed.path))
            if parsed.path == "/version":
                return 200, dict(self.server_version)
            if parsed.path.startswith("/apis/storage.k8s.io/v1/storageclasses"):
                if ("GET", "storageclasses") in self.forbidden:
                    return 403, status(403, 'storageclasses.storage.k8s.io is forbidden: User "test" cannot get '
                                            'resource "storageclasses" at the cluster scope')
                name = parsed.path.removeprefix("/apis/storage.k8s.io/v1/storageclasses").strip("/")
                if not name:
                    return 200, {"kind": "List", "items": [copy.deepcopy(o) for _, o in sorted(self.storage_classes.items())]}
                if name in self.storage_classes:
                    return 200, copy.deepcopy(self.storage_classes[name])
                return 404, status(404, f'storageclasses.storage.k8s.io "{name}" not found')
            if parsed.path.startswith("/apis/scheduling.k8s.io/v1/priorityclasses/"):  # cluster-scoped
                name = parsed.path.rsplit("/", 1)[1]
                if ("GET", "priorityclasses") in self.forbidden:
                    return 403, status(403, f'priorityclasses.scheduling.k8s.io "{name}" is forbidden: User "test" '
                                            'cannot get resource "priorityclasses" at the cluster scope')
                if name in self.priority_classes:
                    return 200, {"kind": "PriorityClass", "metadata": {"name": name}, "value": self.priority_classes[name]}
                return 404, status(404, f'priorityclasses.scheduling.k8s.io "{name}" not found')
            if parsed.path.startswith("/api/v1/namespaces/") and parsed.path.count("/") == 4:
                ns = parsed.path.rsplit("/", 1)[1]
                if ("GET", "namespaces") in self.forbidden:
                    return 403, status(403, f'namespaces "{ns}" is forbidden: User "test" cannot get resource "namespaces"')
                if ns in self.namespaces:
                    return 200, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                return 404, status(404, f'namespaces "{ns}" not found')
            match = PATH.match(parsed.path)
            if not match:
                return 404, status(404, f"no route {parsed.path}")
            ns, plural, name, sub = match["ns"], match["plural"], match["name"], match["sub"]
            if self.failures.get((method, plural)):
                code, headers = self.failures[(method, plural)].pop(0)
                if code is None:
                    return DROP, None
                return code, status(code, "scripted failure"), headers
            if (method, plural) in self.forbidden:
                return 403, status(403, f'{plural} is forbidden: User "test" cannot {method.lower()} resource "{plural}" in the namespace "{ns}"')
            if sub == "log":
                pod = self.get("pods", ns, name)
                if pod is None:
                    return 404, status(404, f'pods "{name}" not found')
                container = query.get("container", [""])[0]
                if query.get("previous", [""])[0] == "true":  # the API's answer when it has not restarted
                    if (name, container) not in self.previous_logs:
                        return 400, status(400, f'previous terminated container "{container}" in pod "{name}" not found')
                    return 200, self.previous_logs[(name, container)]
                return 200, self.logs.get((name, container), "")
            if sub == "eviction" and method == "POST":  # the Eviction API: DisruptionTarget, then the pod ends
                pod = self.get("pods", ns, name)
                if pod is None:
                    return 404, status(404, f'pods "{name}" not found')
                self.evictions.append(name)
                conditions = pod.setdefault("status", {}).setdefault("conditions", [])
                conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"})
                pod["status"]["phase"] = "Failed"
                return 201, status(201, "evicted")
            if name is None and method == "GET":
                selector, fields = query.get("labelSelector", [""])[0], query.get("fieldSelector", [""])[0]
                items = [copy.deepcopy(o) for (p, n, _), o in sorted(self.objects.items())
                         if p == plural and n == ns and selects(selector, o["metadata"].get("labels") or {})
                         and selects_fields(fields, o)]
                limit = int(query["limit"][0]) if query.get("limit") else None
                self.list_limits.append((plural, limit))
                start = int(query.get("continue", ["0"])[0])
                if not limit:
                    return 200, {"kind": "List", "metadata": {}, "items": items[start:]}
                more = start + limit < len(items)
                return 200, {"kind": "List", "metadata": {"continue": str(start + limit)} if more else {},
                             "items": items[start:start + limit]}
            if name is None and method == "POST":
                if ns not in self.namespaces:
                    return 404, status(404, f'namespaces "{ns}" not found')
                key = (plural, ns, body["metadata"]["name"])
                if key in self.objects:
                    return 409, status(409, f'{plural} "{key[2]}" already exists')
                obj = copy.deepcopy(body)
                obj["metadata"]["namespace"] = ns
                if plural == "jobs":
                    component = (obj["metadata"].get("labels") or {}).get("app.kubernetes.io/component")
                    ends = self.job_ends.get(component)
                    obj.setdefault("status", {"conditions": [{"type": ends, "status": "True"}]} if ends else {})
                return 201, copy.deepcopy(self.put(plural, obj))
            live = self.get(plural, ns, name)
            if live is None:
                return 404, status(404, f'{plural} "{name}" not found')
            if method == "GET":
                return 200, copy.deepcopy(live)
            if method == "DELETE":
                del self.objects[(plural, ns, name)]
                if plural == "jobs":  # the garbage collector takes the Job's pods with it
                    for key in [k for k, o in self.objects.items() if k[0] == "pods" and
                                (o["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name") == name]:
                        del self.objects[key]
                self.collect_garbage()
                return 200, status(200, "deleted")
            if method == "PUT":
                if plural == "jobs" and body.get("spec", {}).get("template") != live.get("spec", {}).get("template"):
                    return 422, status(422, f'Job.batch "{name}" is invalid: spec.template: Invalid value: field is immutable')
                if body["metadata"].get("resourceVersion") not in (None, live["metadata"]["resourceVersion"]):
                    return 409, status(409, "the object has been modified")
                obj = copy.deepcopy(body)
                obj["metadata"] = {**live["metadata"], **obj["metadata"]}
                return 200, copy.deepcopy(self.put(plural, obj))
            if method == "PATCH":
                merged = merge_patch(live, body)
                if plural == "jobs" and merged.get("spec", {}).get("template") != live.get("spec", {}).get("template"):
                    return 422, status(422, "spec.template: field is immutable")
                return 200, copy.deepcopy(self.put(plural, merged))
        return 405, status(405, "method not allowed")


DROP = -1  # handle()'s code for "close the connection without an answer"


def status(code: int, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure" if code >= 400 else "Success",
            "message": message, "code": code}


@contextmanager
def serve(fake: FakeKube) -> Iterator[str]:
    class Handler(QuietHandler):
        def _do(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            code, payload, *extra = fake.handle(self.command, self.path, body)
            if code == DROP:
                self.close_connection = True
                self.connection.shutdown(2)  # the client sees the connection dropped, no answer
                return
            if extra and extra[0]:
                data = json.dumps(payload).encode()
                self.send_response(code)
                for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)), **extra[0]}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)
            elif isinstance(payload, str):
                self.answer(code, payload.encode(), "text/plain")
            else:
                self.answer(code, json.dumps(payload).encode())

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _do

    with serving(Handler) as url:
        yield url


def write_kubeconfig(path: Path, server: str, namespace: str | None = None) -> Path:
    context: dict[str, Any] = {"cluster": "fake", "user": "test"}
    if namespace:
        context["namespace"] = namespace
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "fake", "context": context}],
    }))
    return path
