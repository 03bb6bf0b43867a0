"""The controls of docs/security.md, each proved here (the sandbox's are in envs/math/test_sandbox.py).

- credentials: only env var NAMES in specs, secretKeyRef in manifests, no secret value in any
  manifest, ConfigMap, log line, shard or dataset;
- no shell: no module under jobs/ or storage/ hands a string to a shell, and the Makefile passes
  user values as quoted environment variables;
- the env server listens on 127.0.0.1 unless told otherwise;
- every container of every rendered pod is locked down.
"""

from __future__ import annotations

import ast
import fcntl
import os
import re
import secrets
import socket
import string
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.support.manifests import BASE, SWEEPS
from thicket.k8s.render import render, to_yaml
from thicket.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent
THICKET = str(Path(sys.executable).parent / "thicket")
AWS_KEY_ID = re.compile(rb"(AKIA|ASIA)[A-Z0-9]{16}")


def fake_secrets() -> dict[str, str]:
    """Credential-shaped values, new for each test: a hit can only be a leak."""
    upper = string.ascii_uppercase + string.digits
    return {
        "AWS_ACCESS_KEY_ID": "AKIA" + "".join(secrets.choice(upper) for _ in range(16)),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "AWS_SESSION_TOKEN": secrets.token_urlsafe(40),
        "HF_TOKEN": "hf_" + secrets.token_hex(17),
        "TEAM_KEY_ID": "AKIA" + "".join(secrets.choice(upper) for _ in range(16)),
        "TEAM_SECRET": secrets.token_urlsafe(30),
        "TEAM_TOKEN": secrets.token_urlsafe(40),
    }


def leaks(data: bytes, values: dict[str, str]) -> list[str]:
    """The names of the secrets found in data, and any AWS-key-shaped string."""
    found = [name for name, value in values.items() if value.encode() in data]
    return found + [m.group().decode() for m in AWS_KEY_ID.finditer(data)]


def readable(name: str, data: bytes) -> bytes:
    """The bytes as written plus, for Parquet, every decoded value (pages may be compressed)."""
    if name.endswith(".parquet"):
        return data + repr(pq.read_table(pa.BufferReader(data)).to_pylist()).encode()
    return data


# -- credentials: manifests ----------------------------------------------------------------------

S3_SPEC = {
    **BASE,
    "name": "sec",
    "tasks": {**BASE["tasks"], "stop": 20},
    "storage": {"endpoint_url": "http://minio:9000", "access_key_id_env": "TEAM_KEY_ID",
                "secret_access_key_env": "TEAM_SECRET", "session_token_env": "TEAM_TOKEN"},
    "cluster": {"hf_token_secret": "hf-token", "envs": [{"family": "textcraft", "port": 8100}]},
}
SECRETISH = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|CREDENTIAL", re.IGNORECASE)


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) for every container and init container of every pod template."""
    def walk(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if "containers" in node:
                yield node
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)

    for obj in objects:
        for pod in walk(obj):
            for container in [*pod.get("initContainers", []), *pod["containers"]]:
                yield pod, container


def test_manifests_carry_credentials_as_secret_refs_and_never_their_values(monkeypatch):
    values = fake_secrets()
    for name, value in values.items():  # rendering must not read them
        monkeypatch.setenv(name, value)
    objects = render(parse_spec(S3_SPEC))
    text = to_yaml(objects).encode()
    assert leaks(text, values) == []
    configmap = next(o for o in objects if o["kind"] == "ConfigMap")
    assert "TEAM_SECRET" in configmap["data"]["spec.yaml"]  # the name travels, not the value
    worker_env = {}
    for _, container in containers(objects):
        for var in container.get("env", []):
            if SECRETISH.search(var["name"]):
                assert "value" not in var and "secretKeyRef" in var["valueFrom"], var
            if container["name"] == "worker":
                worker_env[var["name"]] = var
    refs = {name: worker_env[name]["valueFrom"]["secretKeyRef"] for name in ("TEAM_KEY_ID", "TEAM_SECRET", "TEAM_TOKEN")}
    assert refs["TEAM_KEY_ID"] == {"name": "thicket-s3", "key": "AWS_ACCESS_KEY_ID"}
    assert refs["TEAM_SECRET"] == {"name": "thicket-s3", "key": "AWS_SECRET_ACCESS_KEY"}
    assert refs["TEAM_TOKEN"] == {"name": "thicket-s3", "key": "AWS_SESSION_TOKEN", "optional": True}


# -- credentials: a real sweep -------------------------------------------------------------------


def run_demo(output: str, env: dict[str, str], spec: Path | None = None, *extra: str) -> subprocess.CompletedProcess:
    argv = [THICKET, "-v", "run", str(spec or ROOT / "sweeps/demo.yaml"), "--policy", "uniform", "--output", output,
            "--no-progress", *extra]
    return subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300)


def test_a_local_sweep_writes_no_secret_to_its_logs_shards_or_spec(tmp_path):
    values = fake_secrets()
    result = run_demo(str(tmp_path), values, None, "--no-aggregate")
    assert result.returncode == 0, result.stderr
    assert leaks((result.stdout + result.stderr).encode(), values) == []
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".parquet" for p in written) and any(p.name == "spec.yaml" for p in written)
    for path in written:
        assert leaks(readable(path.name, path.read_bytes()), values) == [], path


def test_a_sweep_on_s3_uses_the_named_credentials_and_stores_none(tmp_path, s3_server, monkeypatch):
    """Credentials really used (spec-named variables), datasets built too; nothing stored holds them."""
    values = fake_secrets()
    bucket = s3_server.make_bucket("sec")
    spec = tmp_path / "spec.yaml"
    storage = {"endpoint_url": s3_server.endpoint, "access_key_id_env": "TEAM_KEY_ID",
               "secret_access_key_env": "TEAM_SECRET", "session_token_env": "TEAM_TOKEN"}
    spec.write_text((ROOT / "sweeps/demo.yaml").read_text() + yaml.safe_dump({"storage": storage}))
    isolated = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                "AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "us-east-1"}
    result = run_demo(f"s3://{bucket}/runs", {**values, **isolated}, spec)
    assert result.returncode == 0, result.stderr
    assert leaks((result.stdout + result.stderr).encode(), values) == []
    client = s3_server.client()
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
            for o in page.get("Contents", [])]
    assert any(k.endswith(".parquet") and "/trees/" in k for k in keys) and any("/datasets/" in k for k in keys)
    for key in keys:
        data = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        assert leaks(readable(key, data), values) == [], key


# -- no shell ------------------------------------------------------------------------------------

SHELL_CALLS = frozenset({"os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput"})


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str | None:
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def shell_uses(source: str, filename: str = "<source>") -> list[str]:
    """Where the code hands a string to a shell: shell= other than False, os.system, os.popen,
    subprocess.getoutput / getstatusoutput (also through `import ... as` and `from ... import`)."""
    tree = ast.parse(source, filename)
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname: a.name for a in node.names if a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module:
            aliases |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    found.append(f"{filename}:{node.lineno}: shell=")
        if isinstance(node, (ast.Name, ast.Attribute)) and _dotted(node, aliases) in SHELL_CALLS:
            found.append(f"{filename}:{node.lineno}: {_dotted(node, aliases)}")
    return found


@pytest.mark.parametrize("source", [
    "import subprocess\nsubprocess.run('ls', shell=True)",
    "import subprocess as sp\nflag = True\nsp.Popen(['ls'], shell=flag)",
    "import os\nos.system('ls')",
    "import os as o\nrun = o.popen\n",
    "from subprocess import getoutput\ngetoutput('ls')",
    "from os import system as s\ns('ls')",
])
def test_the_shell_detector_finds_each_form(source):
    assert shell_uses(source)


def test_the_shell_detector_passes_argv_lists():
    assert shell_uses("import subprocess\nsubprocess.run(['ls', '-l'], shell=False)\n# os.system('x')\n"
                      "NAMES = ['os.system']") == []


def test_no_module_under_jobs_or_storage_reaches_a_shell():
    modules = sorted([*(ROOT / "jobs").rglob("*.py"), *(ROOT / "storage").rglob("*.py")])
    assert len(modules) > 40
    found = [hit for path in modules for hit in shell_uses(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize("target,variable", [
    ("status", "SWEEP"), ("aggregate", "SWEEP_URI"), ("pull", "SWEEP_URI"), ("rollout", "SPEC"),
])
def test_make_targets_pass_user_values_as_one_argument(tmp_path, target, variable):
    """A value full of shell syntax reaches thicket as one argv entry, and runs nothing. (Make's
    own syntax, `$(shell ...)`, is make's to expand: see docs/security.md.)"""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "argv.log"
    stub = bin_dir / "thicket"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    stub.chmod(0o755)
    marker = tmp_path / "PWNED"
    hostile = f"""x"; touch {marker}; echo "`touch {marker}`' | touch {marker} & """
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    done = subprocess.run(["make", "-s", "-o", "venv", target, f"{variable}={hostile}", f"BIN={bin_dir}",
                           "NAMESPACE=a b;c", f"DEST={tmp_path}/d e", "KUBECTL=false"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
    calls = [yaml.safe_load(line) for line in log.read_text().splitlines()]
    assert calls and all(hostile in call for call in calls), calls
    if target == "status":
        assert calls == [["status", hostile, "-n", "a b;c"]]
    if target == "pull":
        assert calls == [["pull", hostile, f"{tmp_path}/d e"]]


# -- the env server binds loopback -----------------------------------------------------------------


def test_serve_env_defaults_to_loopback():
    from thicket.cli import serve_env
    from thicket.envs.process import EnvServerProcess
    from thicket.envs.service import ServerConfig

    host = next(p for p in serve_env.params if p.name == "host")
    assert host.default == "127.0.0.1"
    assert ServerConfig(("frozenlake",)).host == "127.0.0.1"
    assert EnvServerProcess(("frozenlake",)).host == "127.0.0.1"  # `thicket run`'s own server


def non_loopback_ipv4() -> str | None:
    """An IPv4 address of this machine that is not loopback (None if it has none)."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue
        address = socket.inet_ntoa(packed[20:24])
        if not address.startswith("127."):
            return address
    return None


@pytest.fixture
def default_env_server() -> Iterator[int]:
    """`thicket serve-env frozenlake --port P`: every other option left at its default."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([THICKET, "serve-env", "frozenlake", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "serve-env did not start"
            time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_default_env_server_is_not_reachable_off_loopback(default_env_server):
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    with pytest.raises(ConnectionRefusedError), socket.create_connection((address, default_env_server), timeout=5):
        pass
    with socket.create_connection(("127.0.0.1", default_env_server), timeout=5):
        pass  # while loopback answers


# -- pods are locked down ------------------------------------------------------------------------

def all_rendered() -> list[dict[str, Any]]:
    specs = [load_spec(path) for path in SWEEPS]
    full = {**S3_SPEC, "cluster": {**S3_SPEC["cluster"], "gpus": 2, "image_pull_secrets": ["regcred"],
                                   "envs": [{"family": "textcraft", "port": 8100}, {"family": "sciworld", "port": 8101}]}}
    return [o for spec in [*specs, parse_spec(full)] for o in render(spec)]


def test_every_container_of_every_rendered_pod_is_locked_down():
    objects = all_rendered()
    seen: set[str] = set()
    for pod, container in containers(objects):
        seen.add(container["name"])
        pod_sc = pod["securityContext"]
        assert pod_sc["runAsNonRoot"] is True and pod_sc["runAsUser"] != 0
        assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
        assert all("hostPath" not in volume for volume in pod.get("volumes", []))
        sc = container["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, container["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, container["name"]
        assert sc["runAsNonRoot"] is True and not sc.get("privileged"), container["name"]
        assert "seccompProfile" not in sc  # the pod's RuntimeDefault holds
        assert sc["readOnlyRootFilesystem"] is True, container["name"]  # vLLM's caches too: on /tmp
    assert {"worker", "vllm", "env-textcraft", "env-sciworld"} <= seen and len(seen) >= 6
    # Only the aggregation's waiter reads the API (the rollout Job; it releases the aggregation Job).
    for job in (o for o in objects if o["kind"] == "Job" and not o["metadata"]["name"].endswith("-aggregate-wait")):
        assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, job["metadata"]["name"]


# -- docs/security.md points at tests that exist ----------------------------------------------------


def test_every_test_the_security_doc_cites_exists():
    doc = (ROOT / "docs" / "security.md").read_text()
    cited = set(re.findall(r"(tests/[\w/]+\.py)::(\w+)", doc))
    assert len(cited) >= 10
    for path, name in sorted(cited):
        tree = ast.parse((ROOT / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert name in names, f"docs/security.md cites {path}::{name}, which does not exist"


# -- cloud credentials: the worker's only ----------------------------------------------------------

EKS_TOKEN = "var/run/secrets/eks.amazonaws.com/serviceaccount/token"


def test_the_math_sandbox_reads_what_its_user_can_read_so_no_token_may_be_in_its_container(tmp_path):
    """Measured: model code in the math sandbox reads a file outside its folder (here a stand-in for
    the token EKS's webhook would mount), while it cannot write there nor reach the network. So the
    defence is that the token never enters the env sidecar's container (the rendered annotation),
    as docs/security.md says; if the sandbox ever refuses reads, update that section."""
    from thicket.envs.math.sandbox import run_cells

    token = tmp_path / EKS_TOKEN
    token.parent.mkdir(parents=True)
    value = secrets.token_urlsafe(24)
    token.write_text(value)
    read = run_cells([], f"print(open({str(token)!r}).read())")
    assert read.status == "ok" and value in read.output, read.output
    write = run_cells([], f"open({str(token)!r}, 'w').write('x')")
    assert write.status == "error" and token.read_text() == value
    # Every rendered rollout pod keeps the webhook's token to the worker, the NetworkPolicy closes
    # the metadata addresses (tests/k8s/test_network.py holds the rest).
    from thicket.k8s.network import credential_problems

    for path in SWEEPS:
        assert credential_problems(render(load_spec(path))) == [], path.name
