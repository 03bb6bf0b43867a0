"""The in-cluster path of thicket.k8s.client.connect: the pod's service account straight over urllib3,
with no `kubernetes` package, against the in-memory API server (tests/support/fake_kube.py) served over
real TLS on 127.0.0.1 with a certificate made here."""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import tests.support.http_stub
import thicket.k8s.client
from tests.support.fake_kube import FakeKube, serve, status
from thicket.errors import BadInput, Unavailable
from thicket.k8s.client import InClusterTransport, connect
from thicket.k8s.job_wait import wait_job

ROOT = Path(__file__).resolve().parents[2]
PROXY_VARS = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (its own CA); returns (cert, key) files."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / f"{name}.crt", tmp / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


@dataclass
class Api:
    fake: FakeKube
    port: int  # set once the server listens
    sa_dir: Path
    accepted: set[str] = field(default_factory=lambda: {"Bearer token-1"})
    seen: list[str] = field(default_factory=list)  # each request's Authorization header

    def put_job(self, name: str, namespace: str = "team-a", state: str = "Complete") -> None:
        self.fake.put("jobs", {"metadata": {"name": name, "namespace": namespace}, "spec": {"completions": 2},
                               "status": {"completedIndexes": "0-1", "conditions": [{"type": state, "status": "True"}]}})


def tls_server(api: Api, context: ssl.SSLContext) -> type[ThreadingHTTPServer]:
    """http_stub's server class made to speak TLS and to check each request's bearer token."""

    class TLSServer(ThreadingHTTPServer):
        def __init__(self, address: tuple[str, int], handler: type) -> None:
            class Checked(handler):  # type: ignore[misc, valid-type]
                def parse_request(self) -> bool:
                    if not super().parse_request():
                        return False
                    api.seen.append(self.headers.get("Authorization", ""))
                    if api.seen[-1] in api.accepted:
                        return True
                    self.answer(401, json.dumps(status(401, "Unauthorized")).encode())
                    return False

            super().__init__(address, Checked)
            self.socket = context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

        def handle_error(self, request: object, client_address: object) -> None:
            if not isinstance(sys.exc_info()[1], ssl.SSLError):  # a client refusing the certificate: expected
                super().handle_error(request, client_address)  # type: ignore[arg-type]

    return TLSServer


@pytest.fixture()
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Api]:
    cert, key = self_signed(tmp_path, "apiserver")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "token").write_text("token-1\n")
    (sa_dir / "ca.crt").write_bytes(cert.read_bytes())
    (sa_dir / "namespace").write_text("team-a")
    api = Api(FakeKube(namespaces=("team-a",)), 0, sa_dir)
    monkeypatch.setattr(tests.support.http_stub, "ThreadingHTTPServer", tls_server(api, context))
    with serve(api.fake) as url:
        api.port = int(url.rsplit(":", 1)[1])
        for name in ("KUBECONFIG", *PROXY_VARS):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        monkeypatch.setattr(thicket.k8s.client, "SA_DIR", str(sa_dir))
        yield api


# -- connect in a cluster ----------------------------------------------------------------------------
def test_connect_in_a_cluster_uses_the_service_account(api):
    api.put_job("tc")
    api.fake.put("pods", {"metadata": {"name": "tc-0-abcde", "namespace": "team-a", "labels": {"a": "b", "d": "e f"}}})
    api.fake.logs[("tc-0-abcde", "worker")] = "line one\nline two\n"
    kube = connect()
    assert isinstance(kube.transport, InClusterTransport)
    assert kube.default_namespace == "team-a" and kube.host == f"https://127.0.0.1:{api.port}"
    assert kube.get("Job", "team-a", "tc")["status"]["completedIndexes"] == "0-1"
    assert kube.get("Job", "team-a", "nope") is None
    assert [p["metadata"]["name"] for p in kube.list("Pod", "team-a", "a=b,d=e f")] == ["tc-0-abcde"]
    assert kube.list("Pod", "team-a", "a=b&d=x") == []  # one query value, not two
    lines: list[str] = []
    assert wait_job(kube, kube.default_namespace, "tc", interval_s=0, echo=lines.append) == "Complete"
    assert lines == ["job/tc: Complete, 2 of 2 completed, 0 failed"]
    config = {"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "team-a"}, "data": {"k": "v ü"}}
    assert kube.create(config)["data"] == {"k": "v ü"}  # a JSON body
    assert kube.patch("ConfigMap", "team-a", "c", {"data": {"k": None, "j": "w"}})["data"] == {"j": "w"}
    assert b"".join(kube.logs("team-a", "tc-0-abcde", "worker", follow=False, tail=5)) == b"line one\nline two\n"
    assert kube.delete("ConfigMap", "team-a", "c") and not kube.delete("ConfigMap", "team-a", "c")
    assert set(api.seen) == {"Bearer token-1"} and len(api.seen) == len(api.fake.requests)


def test_a_rotated_token_is_used_from_the_next_request(api):
    api.put_job("tc")
    kube = connect()
    assert kube.get("Job", "team-a", "tc") is not None
    (api.sa_dir / "token").write_text("token-2")
    api.accepted = {"Bearer token-2"}  # the old token no longer works
    assert kube.get("Job", "team-a", "tc") is not None
    assert api.seen == ["Bearer token-1", "Bearer token-2"]
    api.accepted = set()
    with pytest.raises(BadInput, match=r"401 Unauthorized\): check the pod's service account$"):
        kube.get("Job", "team-a", "tc")


def test_the_server_certificate_is_checked_against_the_service_account_ca(api, tmp_path):
    other, _ = self_signed(tmp_path, "other")
    (api.sa_dir / "ca.crt").write_bytes(other.read_bytes())
    with pytest.raises(Unavailable, match=rf"^cannot reach the Kubernetes API at https://127.0.0.1:{api.port}: .*CERTIFICATE_VERIFY_FAILED"):
        connect().get("Job", "team-a", "tc")
    assert api.seen == []  # the token never left


@pytest.mark.parametrize("name", ["token", "ca.crt"])
def test_a_missing_service_account_file_is_a_one_line_unavailable(api, name):
    (api.sa_dir / name).unlink()
    with pytest.raises(Unavailable) as err:
        connect()
    assert str(err.value).startswith(f"in-cluster Kubernetes config: cannot read {api.sa_dir / name} (No such file")
    assert "\n" not in str(err.value)
    (api.sa_dir / name).write_text("")
    with pytest.raises(Unavailable, match=rf"{api.sa_dir / name} is empty$"):
        connect()


def test_no_namespace_file_leaves_the_namespace_to_the_caller(api):
    (api.sa_dir / "namespace").unlink()
    assert connect().default_namespace is None


def test_a_token_gone_after_connect_is_unavailable_not_a_crash(api):
    kube = connect()
    (api.sa_dir / "token").unlink()
    with pytest.raises(Unavailable, match=f"cannot read {api.sa_dir / 'token'}"):
        kube.get("Job", "team-a", "tc")


def test_ipv6_service_hosts_are_bracketed(api, monkeypatch):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "::1")
    assert connect().host == f"https://[::1]:{api.port}"
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    with pytest.raises(Unavailable, match="KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set"):
        connect()


# -- without the kubernetes package ------------------------------------------------------------------
BLOCKED = textwrap.dedent("""
    import sys
    sys.modules["kubernetes"] = None  # any import of it fails
    import thicket.k8s.client
    thicket.k8s.client.SA_DIR = sys.argv[1]
    from thicket.cli import main
    sys.argv = ["thicket", *sys.argv[2:]]
    try:
        main()
    finally:
        print("imported:", sorted(m for m in sys.modules if m.startswith("kubernetes") and sys.modules[m]), file=sys.stderr)
""")


def thicket_without_kubernetes(api: Api, *args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    full = {k: v for k, v in os.environ.items() if k not in PROXY_VARS} | env
    return subprocess.run([sys.executable, "-c", BLOCKED, str(api.sa_dir), *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


def test_wait_job_in_a_cluster_needs_no_kubernetes_package(api):
    api.put_job("tc-aggregate-wait", state="Failed")
    result = thicket_without_kubernetes(api, "wait-job", "tc-aggregate-wait", "--interval", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "job/tc-aggregate-wait: Failed, 2 of 2 completed, 0 failed\n"
    assert "imported: []" in result.stderr and "going on with the tasks it committed" in result.stderr
    assert set(api.seen) == {"Bearer token-1"}


def test_a_kubeconfig_without_the_kubernetes_package_says_what_to_install(api, tmp_path):
    result = thicket_without_kubernetes(api, "wait-job", "tc", KUBECONFIG=str(tmp_path / "kubeconfig"))
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        "error: thicket's cluster commands need the kubernetes client: pip install 'thicket[cluster]'")
