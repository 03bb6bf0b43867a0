"""Where a run's envs come from: in process, a `thicket serve-env` child, or a running server.

    async with open_envs(spec.tasks) as new_env:   # new_env() -> a fresh Env for one tree
        ...

`mode: sidecar` (the default) starts `thicket serve-env ENV` as a child process, exactly as
the pod's env container runs it, waits for /ready and stops it at the end. Where
THICKET_ENV_URL is set (the pod), sidecar mode uses that server instead of starting one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable

from thicket.envs import EnvNotInstalled, make_env, require
from thicket.envs.client import Adapter, ClientConfig, EnvClient
from thicket.envs.process import EnvServerProcess
from thicket.envs.protocol import Env
from thicket.envs.remote import RemoteEnv
from thicket.errors import BadInput
from thicket.spec import EnvServerSpec, TasksSpec

NewEnv = Callable[[], Env]


ENV_URL_VARIABLE = "THICKET_ENV_URL"


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
