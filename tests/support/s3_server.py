"""Real S3-compatible servers for the tests, as pytest fixtures (registered from conftest.py).

`s3_server`: a `moto_server` process for the whole session (data in memory).
`s3_auth_server`: a second moto_server with authentication on (every key is unknown).
`persistent_s3`: a `ministack` process with S3_PERSIST=1 that survives `kill -9` and restarts.
`fault_proxy`: a small HTTP proxy in front of moto that answers some requests with S3 errors.
`aws_env`: the AWS_* variables pointing at `s3_server`, in this process (a dict for subprocesses).
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest

BIN = Path(sys.executable).parent
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def aws_env_for(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


# Variables of a developer's own AWS setup that would override the test server.
FOREIGN_AWS_VARS = (
    "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION",
)


def wait_until_up(url: str, process: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"S3 test server exited with {process.returncode}")
        try:
            httpx.get(url, timeout=1)  # any HTTP answer will do
            return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError(f"S3 test server at {url} did not answer within {timeout:.0f} s")


@dataclass
class S3Server:
    """One S3-compatible server process; `start` again after `kill` to restart it on the same port."""

    command: list[str]
    port: int
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    process: subprocess.Popen | None = None
    _client: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, **self.env}
        self.process = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until_up(self.endpoint, self.process)
        return self

    def kill(self) -> None:
        """SIGKILL: no chance to flush or say goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def client(self) -> Any:
        if self._client is None:
            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint, region_name=REGION,
                aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
            )
        return self._client

    def make_bucket(self, stem: str = "t") -> str:
        name = f"{stem}-{uuid.uuid4().hex[:10]}"
        self.client().create_bucket(Bucket=name)
        return name


def moto(port: int, **env: str) -> S3Server:
    return S3Server([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], port, env)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = moto(free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_auth_server() -> Iterator[S3Server]:
    server = moto(free_port(), INITIAL_NO_AUTH_ACTION_COUNT="0").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def persistent_s3(tmp_path: Path) -> Iterator[S3Server]:
    env = {
        "GATEWAY_PORT": str(port := free_port()),
        "BIND_HOST": "127.0.0.1",
        "SERVICES": "s3",
        "S3_PERSIST": "1",
        "S3_DATA_DIR": str(tmp_path / "ministack-s3"),
        "LOG_LEVEL": "WARNING",
    }
    server = S3Server([str(BIN / "ministack")], port, env, log_path=tmp_path / "ministack.log").start()
    try:
        yield server
    finally:
        server.stop()


def use_endpoint(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> dict[str, str]:
    """Point AWS_* at `endpoint` in this process; returns them for subprocesses."""
    for name in FOREIGN_AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    env = aws_env_for(endpoint)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def aws_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """AWS_* pointing at the moto server, set here and returned for subprocesses."""
    return use_endpoint(monkeypatch, s3_server.endpoint)


# -- a proxy that injects S3 errors ---------------------------------------------------------


@dataclass
class Fault:
    """Answer matching requests with an S3 error: every `every`-th one, at most `limit` times.
    With `lose_answer`, the request reaches the server first and only its answer is replaced.
    With `hold`, the request waits until the event is set and then fails without reaching
    the server (a client killed meanwhile never learns either way)."""

    status: int
    code: str
    every: int = 1
    limit: int | None = None
    match: Callable[[str, str], bool] = lambda method, path: True
    lose_answer: bool = False
    hold: threading.Event | None = None
    seen: int = 0
    injected: int = 0

    def fires(self, method: str, path: str) -> bool:
        if not self.match(method, path) or (self.limit is not None and self.injected >= self.limit):
            return False
        self.seen += 1
        if self.seen % self.every:
            return False
        self.injected += 1
        return True


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream_port: int) -> None:
        super().__init__(("127.0.0.1", 0), ProxyHandler)
        self.upstream_port = upstream_port
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def injected(self) -> int:
        return sum(f.injected for f in self.faults)

    def fault_for(self, method: str, path: str) -> Fault | None:
        with self.lock:
            self.requests.append((method, path))
            return next((f for f in self.faults if f.fires(method, path)), None)


class ProxyHandler(BaseHTTPRequestHandler):
    server: FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def forward(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = self.server.fault_for(self.command, self.path)
        if fault is not None and fault.hold is not None:
            fault.hold.wait(timeout=120)
        elif fault is None or fault.lose_answer:
            reply, data = self.upstream(body)
        if fault is not None:
            xml = f"<?xml version='1.0'?><Error><Code>{fault.code}</Code><Message>injected</Message></Error>"
            return self.answer(fault.status, [("Content-Type", "application/xml")], xml.encode())
        skip = {"content-length", "transfer-encoding", "connection"}
        headers = [(k, v) for k, v in reply.getheaders() if k.lower() not in skip]
        self.answer(reply.status, headers, data, head=self.command == "HEAD", length=reply.getheader("Content-Length"))

    def upstream(self, body: bytes) -> tuple[http.client.HTTPResponse, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        try:
            connection.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
            reply = connection.getresponse()
            return reply, reply.read()
        finally:
            connection.close()

    def answer(
        self, status: int, headers: list[tuple[str, str]], data: bytes, head: bool = False, length: str | None = None
    ) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", length if head and length else str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward


@pytest.fixture
def fault_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.port)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()
