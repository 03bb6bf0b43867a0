"""`thicket serve-env` as a child process: started in its own process group with its log in a file,
ready once /ready answers, stopped gracefully (SIGTERM, then SIGKILL). `thicket run` runs its envs so
when the spec's env server is a sidecar, exactly as the pod's env container runs it."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from thicket.envs.client import ClientConfig, EnvClient
from thicket.errors import Unavailable
from thicket.transport import free_port


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
