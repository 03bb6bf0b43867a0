"""Faults in the env server a sweep steps through: killed mid-episode, and hung.

The server is a real `thicket serve-env` process on a fixed port; the sweep is a real
`thicket run` child process reaching it as a remote env server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.support.harness import (
    NAME,
    THICKET,
    assert_each_task_committed_once,
    commits,
    dataset_fingerprint,
    run_with_fault,
    sweep_spec,
    thicket,
    tree_fingerprint,
    undisturbed,
    wait_until,
)
from tests.support.s3_server import free_port
from thicket.storage import open_store

pytestmark = pytest.mark.slow  # the slow tier: `make test-slow` (and CI)

TASKS = list(range(6))


@dataclass
class EnvServer:
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EnvServer:
        self.process = subprocess.Popen([THICKET, "serve-env", "frozenlake", "--port", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._ready, 60, "the env server")
        return self

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        os.kill(self.process.pid, sig)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture
def env_server() -> Iterator[EnvServer]:
    server = EnvServer(free_port()).start()
    try:
        yield server
    finally:
        server.kill()


def remote(server: EnvServer, **settings: float) -> dict[str, object]:
    return {"env_server": {"mode": "remote", "url": server.url, **settings}}


def test_env_server_killed_mid_episode_and_restarted_gives_the_same_datasets(tmp_path, env_server):
    reference = undisturbed(tmp_path, sweep_spec(tmp_path, policy={"latency_s": 0.01}))
    spec = sweep_spec(tmp_path, policy={"latency_s": 0.01}, tasks=remote(env_server))

    def kill_and_restart() -> None:
        env_server.kill()  # SIGKILL with episodes open: every instance is lost
        time.sleep(1)
        env_server.start()

    result = run_with_fault(spec, str(tmp_path / "disturbed"), kill_and_restart)
    assert result.returncode == 0, result.stderr
    assert "0 failed" in result.stdout
    named = [line for line in result.stderr.splitlines() if f"env server {env_server.url}" in line]
    assert any("instance lost" in line or "retrying" in line for line in named), result.stderr  # the fault, named
    uri = str(tmp_path / "disturbed" / NAME)
    assert_each_task_committed_once(uri, TASKS)
    assert (tree_fingerprint(uri), dataset_fingerprint(uri)) == reference


def test_a_hung_env_server_fails_the_index_within_its_deadline_and_a_rerun_completes(tmp_path, env_server):
    reference = undisturbed(tmp_path, sweep_spec(tmp_path, policy={"latency_s": 0.01}))
    hung = sweep_spec(tmp_path, policy={"latency_s": 0.01},
                      tasks=remote(env_server, timeout_s=1, retry_deadline_s=3))
    out = tmp_path / "disturbed"
    hung_at: list[float] = []

    def hang() -> None:
        env_server.signal(signal.SIGSTOP)  # still accepts connections (the kernel does), never answers
        hung_at.append(time.monotonic())

    try:
        result = run_with_fault(hung, str(out), hang, timeout=120)
    finally:
        env_server.signal(signal.SIGCONT)
    waited = time.monotonic() - hung_at[0]
    done_before = commits(open_store(str(out / NAME)))
    assert result.returncode == 3, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and env_server.url in last and "unavailable" in last
    assert "retrying" in result.stderr  # the timeouts were logged as they happened
    # The trees growing gave up after their deadline (1 s per request, 3 s of retries); no
    # more were started.
    assert waited < 30, f"took {waited:.0f} s to give up"
    assert done_before < len(TASKS)

    rerun = thicket("run", str(hung), "--no-aggregate", "--output", str(out))
    assert rerun.returncode == 0, rerun.stderr
    assert f"{done_before} already committed, 0 failed" in rerun.stdout
    uri = str(out / NAME)
    assert_each_task_committed_once(uri, TASKS)
    assert (tree_fingerprint(uri), dataset_fingerprint(uri)) == reference


async def test_a_response_cut_off_by_a_dying_server_is_a_transport_error_not_an_empty_answer():
    """What a kill -9 between a response's headers and its body looks like on the wire."""
    import asyncio

    from thicket.transport import LeanExchange

    async def headers_then_die(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{\"obs")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(headers_then_die, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    exchange = LeanExchange(f"http://127.0.0.1:{port}", timeout_s=10)
    async with server:
        with pytest.raises(httpx.RemoteProtocolError):
            await exchange("POST", "/step", b'{"action": "x"}')
        await exchange.aclose()
