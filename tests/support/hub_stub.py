"""A stand-in for the Hugging Face Hub over real HTTP: one model repository at one commit, served as
huggingface_hub 2.4.0's `snapshot_download` (and so `hf download`) reads a repository:

- GET  /api/models/{repo}/revision/{revision}: the repository's info (`repo_info`: its commit sha);
- GET  /api/models/{repo}/tree/{revision}?recursive=true: the file listing (`list_repo_tree`), a few
  entries per page, the next page named in a `Link: <...>; rel="next"` header as the Hub does;
- HEAD /{repo}/resolve/{revision}/{path}: a file's metadata (`get_hf_file_metadata`): X-Repo-Commit,
  ETag (the git blob id), and for LFS files X-Linked-Etag (the sha256) and X-Linked-Size;
- GET  /{repo}/resolve/{revision}/{path}: the file's bytes;
- GET  /api/agent-harnesses: an empty registry of AI agents (the `hf` CLI asks, to choose how it
  prints, with or without HF_HUB_DISABLE_TELEMETRY).

No Xet headers or hashes: the client downloads over plain HTTP. Every request is recorded (`requests`);
`close()` makes every later answer a 503, so anything that still asks the hub is seen and gets nothing.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from tests.support.http_stub import QuietHandler, serving

LFS_SUFFIXES = (".safetensors", ".pth", ".bin")  # what a model repository's .gitattributes tracks in LFS
LFS_POINTER_SIZE = 134
NO_AGENT_HARNESSES = {"standardEnvVars": [], "harnesses": {}}


@dataclass(frozen=True)
class HubFile:
    path: str
    content: bytes

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def git_blob_id(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.content) + self.content).hexdigest()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    def blob_name(self) -> str:
        """The name huggingface_hub gives the file's blob in its cache (the ETag it was served with)."""
        return self.sha256 if self.lfs else self.git_blob_id

    def tree_entry(self) -> dict:
        entry = {"type": "file", "oid": self.git_blob_id, "size": len(self.content), "path": self.path}
        if self.lfs:
            entry["lfs"] = {"oid": self.sha256, "size": len(self.content), "pointerSize": LFS_POINTER_SIZE}
        return entry


@dataclass
class HubRepo:
    repo_id: str
    commit: str
    files: dict[str, HubFile]

    @classmethod
    def from_folder(cls, repo_id: str, commit: str, folder: Path, extra: dict[str, bytes]) -> HubRepo:
        """The folder's files (at any depth) and `extra` ({path in the repository: bytes})."""
        paths = sorted(path for path in folder.rglob("*") if path.is_file())
        contents = {str(path.relative_to(folder)): path.read_bytes() for path in paths}
        contents.update(extra)
        return cls(repo_id, commit, {path: HubFile(path, data) for path, data in sorted(contents.items())})

    def tree(self) -> list[dict]:
        """A recursive listing, as the Hub gives it: the folders and the files, by path."""
        folders = sorted({str(parent) for path in self.files for parent in Path(path).parents if str(parent) != "."})
        entries = [{"type": "directory", "oid": hashlib.sha1(name.encode()).hexdigest(), "path": name}
                   for name in folders]
        entries += [file.tree_entry() for file in self.files.values()]
        return sorted(entries, key=lambda entry: entry["path"])

    def knows(self, revision: str) -> bool:
        return revision in ("main", self.commit)


@dataclass
class HubStub:
    repo: HubRepo
    page_size: int = 3
    url: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path with its query)
    unknown: list[tuple[str, str]] = field(default_factory=list)  # requests no route above answers
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        """From now on answer 503 to everything (and go on recording): the hub is gone."""
        self.closed = True

    def tree_pages_served(self) -> int:
        return sum(1 for _, path in self.requests if "/tree/" in path)

    def paths_requested(self) -> list[str]:
        return [unquote(urlsplit(path).path) for _, path in self.requests]


class HubHandler(QuietHandler):
    hub: HubStub  # set on the subclass `serve` makes

    def do_GET(self) -> None:
        self.route(send_body=True)

    def do_HEAD(self) -> None:
        self.route(send_body=False)

    def route(self, send_body: bool) -> None:
        with self.hub.lock:
            self.hub.requests.append((self.command, self.path))
        if self.hub.closed:
            return self.error(503, "HubClosed", send_body)
        repo = self.hub.repo
        path = unquote(urlsplit(self.path).path)
        api = f"/api/models/{repo.repo_id}/"
        if send_body and path == "/api/agent-harnesses":
            return self.answer(200, json.dumps(NO_AGENT_HARNESSES).encode())
        if send_body and path.startswith(api + "revision/"):
            return self.repo_info(path.removeprefix(api + "revision/"))
        if send_body and path.startswith(api + "tree/"):
            return self.tree_page(path.removeprefix(api + "tree/"))
        if path.startswith(f"/{repo.repo_id}/resolve/"):
            revision, _, file_path = path.removeprefix(f"/{repo.repo_id}/resolve/").partition("/")
            return self.resolve(revision, file_path, send_body)
        with self.hub.lock:
            self.hub.unknown.append((self.command, self.path))
        self.error(404, "RepoNotFound", send_body)

    def repo_info(self, revision: str) -> None:
        repo = self.hub.repo
        if not repo.knows(revision):
            return self.error(404, "RevisionNotFound", True)
        info = {"id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit, "private": False,
                "siblings": [{"rfilename": path} for path in repo.files]}
        self.answer(200, json.dumps(info).encode())

    def tree_page(self, revision_and_folder: str) -> None:
        repo = self.hub.repo
        revision, _, folder = revision_and_folder.partition("/")
        if not repo.knows(revision):
            return self.error(404, "RevisionNotFound", True)
        if folder:
            return self.error(404, "OnlyTheRootIsListed", True)
        query = parse_qs(urlsplit(self.path).query)
        if query.get("recursive") != ["true"]:
            return self.error(400, "OnlyRecursiveListings", True)
        start = int(query.get("cursor", ["0"])[0])
        entries = repo.tree()
        page = entries[start:start + self.hub.page_size]
        headers = {}
        if start + self.hub.page_size < len(entries):
            next_url = (f"{self.hub.url}/api/models/{repo.repo_id}/tree/{quote(revision, safe='')}"
                        f"?recursive=true&expand=false&cursor={start + self.hub.page_size}")
            headers["Link"] = f'<{next_url}>; rel="next"'
        self.send(200, json.dumps(page).encode(), headers, "application/json", True)

    def resolve(self, revision: str, file_path: str, send_body: bool) -> None:
        repo = self.hub.repo
        if not repo.knows(revision):
            return self.error(404, "RevisionNotFound", send_body)
        file = repo.files.get(file_path)
        if file is None:
            return self.error(404, "EntryNotFound", send_body, {"X-Repo-Commit": repo.commit})
        headers = {"X-Repo-Commit": repo.commit, "ETag": f'"{file.git_blob_id}"', "Accept-Ranges": "bytes"}
        if file.lfs:
            headers |= {"X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(len(file.content))}
        self.send(200, file.content, headers, "application/octet-stream", send_body)

    def error(self, status: int, code: str, send_body: bool, headers: dict | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        self.send(status, body, {"X-Error-Code": code, **(headers or {})}, "application/json", send_body)

    def send(self, status: int, body: bytes, headers: dict, content_type: str, send_body: bool) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            if send_body:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


@contextmanager
def serve_hub(repo: HubRepo, page_size: int = 3) -> Iterator[HubStub]:
    """Serve `repo` on a free 127.0.0.1 port; the stub's `url` is what HF_ENDPOINT should be."""
    hub = HubStub(repo, page_size)
    handler = type("BoundHubHandler", (HubHandler,), {"hub": hub})
    with serving(handler) as url:
        hub.url = url
        yield hub
