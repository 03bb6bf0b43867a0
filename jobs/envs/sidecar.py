"""Where a run's envs come from: in process, a `thicket serve-env` child, or a running server.

    async with open_envs(spec.tasks) as new_env:   # new_env() -> a fresh Env for one tree
        ...

`mode: sidecar` (the default) starts `thicket serve-env ENV` as a child process, exactly as
the pod's env container runs it, waits for /ready and stops it at the end. Where
THICKET_ENV_URL is set (the pod), sidecar mode uses that server instead of starting one.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import IO

from thicket.envs import EnvNotInstalled, make_env, require
from thicket.envs.client import Adapter, ClientConfig, EnvClient, RemoteEnv
from thicket.envs.protocol import Env
from thicket.errors import BadInput, Unavailable
from thicket.spec import EnvServerSpec, TasksSpec
from thicket.vllm_server import free_port

NewEnv = Callable[[], Env]
ENV_URL_VARIABLE = "THICKET_ENV_URL"


class EnvServerProcess:
    """`thicket serve-env` as a child process in its own process group, logging to a file."""

    def __init__(
        self,
        families: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        args: Sequence[str] = (),
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 60.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.families = tuple(families)
        self.host = host
        self.port = port or free_port(host)
        self.args = tuple(args)
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._own_log = self.log_path is None  # a temporary log, removed after a clean stop

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "thicket.cli", "serve-env", *self.families,
                "--host", self.host, "--port", str(self.port), "--parent-pid", str(os.getpid()), *self.args]

    def start(self) -> EnvServerProcess:
        """Start the process (does not wait: see wait_ready)."""
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="thicket-env-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        atexit.register(self.stop)
        return self

    async def wait_ready(self) -> None:
        async with EnvClient(ClientConfig(self.url)) as client:
            ready = asyncio.create_task(client.wait_ready(self.startup_timeout_s))
            while not ready.done():
                if self.proc is None or self.proc.poll() is not None:
                    ready.cancel()
                    code = None if self.proc is None else self.proc.returncode
                    raise Unavailable(f"env server exited with code {code} before it was ready: {self.log_gist()}")
                await asyncio.wait({ready}, timeout=0.05)
            ready.result()

    def log_gist(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "no log"
        lines = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
        return f"{(lines or ['empty log'])[-1][:300]} (log: {self.log_path})"

    def kill(self) -> None:
        """SIGKILL, no goodbye (tests of crash recovery)."""
        if self.proc is not None:
            self._signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        """SIGTERM (graceful: in-flight steps finish, envs close), SIGKILL after stop_timeout_s."""
        proc = self.proc
        if proc is not None:
            atexit.unregister(self.stop)
            if proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=self.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    proc.wait()
            self.proc = None
            if self._own_log and proc.returncode == 0 and self.log_path is not None:
                self.log_path.unlink(missing_ok=True)
        if self._log is not None:
            self._log.close()
            self._log = None

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    async def __aenter__(self) -> EnvServerProcess:
        self.start()
        try:
            await self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.stop)


def in_process(tasks: TasksSpec) -> NewEnv:
    try:
        require(tasks.env)
    except EnvNotInstalled as err:
        raise BadInput(f"tasks.env_server.mode in_process: {err}") from None
    return lambda: make_env(tasks.env, **tasks.env_args)


def client_config(url: str, server: EnvServerSpec) -> ClientConfig:
    return ClientConfig(url, timeout_s=server.timeout_s, retry_deadline_s=server.retry_deadline_s)


@contextlib.asynccontextmanager
async def remote_envs(tasks: TasksSpec, url: str, adapter: Adapter) -> AsyncIterator[NewEnv]:
    async with EnvClient(client_config(url, tasks.env_server)) as client:
        if adapter is Adapter.THICKET:
            await client.wait_ready(tasks.env_server.startup_timeout_s)
        dialect = await client.dialect(tasks.env, tasks.env_args, adapter)
        yield lambda: RemoteEnv(client, dialect)


@contextlib.asynccontextmanager
async def open_envs(tasks: TasksSpec) -> AsyncIterator[NewEnv]:
    """A factory of fresh envs for the spec's tasks, with whatever server it needs running."""
    server = tasks.env_server
    if server.mode == "in_process":
        yield in_process(tasks)
    elif server.mode == "remote":
        assert server.url is not None
        async with remote_envs(tasks, server.url, Adapter(server.adapter)) as new_env:
            yield new_env
    elif url := os.environ.get(ENV_URL_VARIABLE):
        async with remote_envs(tasks, url, Adapter.THICKET) as new_env:
            yield new_env
    else:
        args = ["--max-instances", str(server.max_instances), "--idle-timeout", str(server.idle_timeout_s)]
        process = EnvServerProcess([tasks.env], port=server.port, args=args,
                                   startup_timeout_s=server.startup_timeout_s)
        async with process, remote_envs(tasks, process.url, Adapter.THICKET) as new_env:
            yield new_env
