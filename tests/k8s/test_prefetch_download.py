"""The model cache's prefetch, run for real: the rendered prefetch Job's container (`hf download`,
its args and env exactly as rendered) against a stand-in Hugging Face Hub over HTTP, then the
rendered vLLM container loading the model by its hub id from the cache that Job filled.

What is proven:
- the prefetch command line downloads the repository at its commit into HF_HOME's hub cache on the
  claim (a paginated listing followed to the end, plain and LFS files byte for byte), and skips
  `original/*`: nothing under it is even requested;
- the vLLM container, with its own HF_HOME on the same claim and HF_HUB_OFFLINE=1, loads that hub id
  from the cache and serves it without a single request to the hub. The hub stays up but answers
  nothing and records every request (a stopped hub would not do: huggingface_hub takes a refused
  connection for "offline" and quietly falls back to the cache, HF_HUB_OFFLINE or not).

What stands in for what (the only changes to the rendered containers):
- the prefetch image's `hf` and the vLLM image's `python3` -> the vLLM venv's (the same
  huggingface_hub as requirements/prefetch.txt pins; PATH names its bin folder first; the command
  lines run unchanged);
- huggingface.co -> tests.support.hub_stub, named by HF_ENDPOINT (added to both containers' env);
- the volumes -> temp folders: the model-cache claim one folder for both pods, each emptyDir its own;
  env values under a mount path are rewritten to the folder;
- a CPU node -> cluster.vllm_args / cluster.env.vllm set to thicket.vllm_server's CPU flags, rendered
  into the container as any user's would be.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.hub_stub import HubRepo, HubStub, serve_hub
from tests.support.manifests import BASE, by_kind, containers, rollout
from thicket.k8s.render import render
from thicket.spec import SweepSpec, parse_spec
from thicket.tiny_model import build_tiny_model, vllm_python
from thicket.transport import free_port
from thicket.vllm_server import CPU_ARGS, CPU_ENV

pytestmark = pytest.mark.vllm

REPO_ID = "thicket-test/tiny-llama"
SERVED_NAME = "tiny-llama"  # the policy model's last part, as thicket names it
COMMIT = "3f9c2b7a1d4e5f60718293a4b5c6d7e8f9012345"
# As in Llama repositories: the original checkpoint next to the HF one, which vLLM never reads.
ORIGINAL = {"original/params.json": b'{"dim": 64, "n_layers": 2}', "original/consolidated.00.pth": bytes(2048)}
VLLM_BIN = Path(vllm_python()).parent
DOWNLOAD_TIMEOUT_S = 180
VLLM_START_TIMEOUT_S = 300


@dataclass
class Prefetched:
    hub: HubStub
    objects: list[dict]
    root: Path  # where the pods' volumes are
    download: subprocess.CompletedProcess

    def snapshot(self) -> Path:
        return self.cache() / "snapshots" / COMMIT

    def cache(self) -> Path:
        claim = self.root / "claim-thicket-models"  # model_cache.path (/models) of every pod
        return claim / "huggingface" / "hub" / "models--thicket-test--tiny-llama"


def sweep_spec(vllm_port: int) -> SweepSpec:
    data = copy.deepcopy(BASE)
    data["policy"] = {**data["policy"], "model": REPO_ID, "revision": COMMIT}  # pinned: policy.revision
    data["cluster"] = {"vllm_port": vllm_port, "vllm_args": list(CPU_ARGS), "env": {"vllm": dict(CPU_ENV)}}
    return parse_spec(data, "s.yaml")


def pod_folders(pod: dict, container: dict, root: Path) -> dict[str, Path]:
    """The container's mount paths -> local folders (a claim's is named by the claim, so pods share it)."""
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    folders = {}
    for mount in container["volumeMounts"]:
        claim = volumes[mount["name"]].get("persistentVolumeClaim")
        name = f"claim-{claim['claimName']}" if claim else f"{container['name']}-{mount['name']}"
        folders[mount["mountPath"]] = root / name
        folders[mount["mountPath"]].mkdir(parents=True, exist_ok=True)
    return folders


def local_path(value: str, folders: dict[str, Path]) -> str:
    for mount, folder in folders.items():
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return str(folder) + value[len(mount.rstrip("/")):]
    return value


def container_env(pod: dict, container: dict, root: Path, hub_url: str) -> dict[str, str]:
    """The container's env as rendered, paths under its mounts rewritten, plus PATH and HF_ENDPOINT
    only: nothing leaks from this process (an HF_HUB_OFFLINE here would prove nothing)."""
    secret_refs = [item["name"] for item in container["env"] if "value" not in item]
    assert not secret_refs, f"the spec sets no hf_token_secret, yet {secret_refs} come from a Secret"
    folders = pod_folders(pod, container, root)
    rendered = {item["name"]: local_path(item["value"], folders) for item in container["env"]}
    return {"PATH": f"{VLLM_BIN}:/usr/bin:/bin", "HF_ENDPOINT": hub_url, **rendered}


def command_line(container: dict, env: dict[str, str]) -> list[str]:
    command = [*container["command"], *container["args"]]
    assert shutil.which(command[0], path=env["PATH"]) == str(VLLM_BIN / command[0])  # the image's stand-in
    return command


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny", python=vllm_python())


@pytest.fixture(scope="module")
def prefetched(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prefetched]:
    """The rendered prefetch container, run once against the hub stub (which stays up for the module)."""
    repo = HubRepo.from_folder(REPO_ID, COMMIT, tiny_model, ORIGINAL)
    objects = render(sweep_spec(free_port()))
    (job,) = by_kind(objects, "Job", "prefetch")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    root = tmp_path_factory.mktemp("pods")
    with serve_hub(repo) as hub:
        env = container_env(pod, container, root, hub.url)
        download = subprocess.run(command_line(container, env), env=env, cwd=root, capture_output=True,
                                  text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
        yield Prefetched(hub, objects, root, download)


def test_the_rendered_prefetch_downloads_the_repository_but_not_its_original_folder(prefetched):
    assert prefetched.download.returncode == 0, prefetched.download.stderr[-3000:]
    repo = prefetched.hub.repo
    wanted = {path: file for path, file in repo.files.items() if not path.startswith("original/")}
    snapshot = prefetched.snapshot()
    downloaded = {str(path.relative_to(snapshot)) for path in snapshot.rglob("*") if path.is_file()}
    assert downloaded == set(wanted)  # every file but original/*
    assert all((snapshot / path).read_bytes() == file.content for path, file in wanted.items())
    assert not (snapshot / "original").exists()
    assert not [path for path in prefetched.hub.paths_requested() if "/original/" in path]  # not even asked
    # The blobs carry the names the hub's ETags gave them: the git blob id, the sha256 for LFS files.
    blobs = {blob.name for blob in (prefetched.cache() / "blobs").iterdir()}
    assert blobs == {file.blob_name() for file in wanted.values()}
    # policy.revision pins the commit: every request names it, none the moving `main`.
    requested = [path for path in prefetched.hub.paths_requested() if REPO_ID in path]
    assert requested and all(f"/{COMMIT}" in path for path in requested), requested
    assert not (prefetched.cache() / "refs" / "main").exists()
    assert prefetched.hub.tree_pages_served() > 1  # the listing's pages were followed
    assert prefetched.hub.unknown == []  # the stub answered every request it got


def test_the_rendered_vllm_serves_the_prefetched_model_with_the_hub_offline(prefetched):
    assert prefetched.download.returncode == 0, "the prefetch failed (see the test above)"
    pod = rollout(prefetched.objects)["spec"]["template"]["spec"]
    vllm = containers(pod)["vllm"]
    args = vllm["args"]
    assert args[args.index("--model") + 1] == REPO_ID  # loaded by its hub id, not by a path
    assert args[args.index("--revision") + 1] == COMMIT  # the commit the prefetch downloaded
    hub = prefetched.hub
    env = container_env(pod, vllm, prefetched.root, hub.url)
    assert env["HF_HUB_OFFLINE"] == "1"
    hub.close()
    asked_before = len(hub.requests)
    url = f"http://127.0.0.1:{args[args.index('--port') + 1]}"
    with running(command_line(vllm, env), env, prefetched.root, prefetched.root / "vllm.log") as server:
        assert SERVED_NAME in wait_serving(url, server, prefetched.root / "vllm.log")
        completion = complete(url, SERVED_NAME)
    assert completion["usage"]["completion_tokens"] >= 1
    assert hub.requests[asked_before:] == []  # vLLM never asked the hub
    assert str(prefetched.snapshot()) in (prefetched.root / "vllm.log").read_text(errors="replace")  # loaded from


# -- the vLLM process ---------------------------------------------------------------------------------
@contextmanager
def running(command: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> Iterator[subprocess.Popen]:
    """The command in its own process group (stopped with all its children), output in log_path."""
    die_with_parent = [setpriv, "--pdeathsig", "TERM"] if (setpriv := shutil.which("setpriv")) else []
    with log_path.open("wb") as log:
        process = subprocess.Popen([*die_with_parent, *command], env=env, cwd=cwd, stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            yield process
        finally:
            stop(process)


def stop(process: subprocess.Popen) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=15)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # workers share the group: none may outlive the server
    process.wait()


def wait_serving(url: str, process: subprocess.Popen, log_path: Path) -> list[str]:
    """The model names /v1/models lists, once it lists any (vLLM has loaded the model)."""
    deadline = time.monotonic() + VLLM_START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"vLLM exited {process.returncode}: {log_tail(log_path)}"
        with suppress(httpx.HTTPError):
            response = httpx.get(f"{url}/v1/models", timeout=5)
            if response.is_success and response.json()["data"]:
                return [model["id"] for model in response.json()["data"]]
        time.sleep(0.5)
    raise AssertionError(f"vLLM did not serve within {VLLM_START_TIMEOUT_S} s: {log_tail(log_path)}")


def complete(url: str, model: str) -> dict:
    body = {"model": model, "prompt": "Action:", "max_tokens": 4, "temperature": 0}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.is_success, response.text
    return response.json()


def log_tail(log_path: Path, chars: int = 3000) -> str:
    return log_path.read_text(errors="replace")[-chars:] if log_path.exists() else "no log"
