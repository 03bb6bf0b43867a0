"""The env client (EnvClient, RemoteEnv): an instance the server lost is rebuilt by replay, a
kill -9 mid-search gives the same tree, and the lean transport reads every answer framing."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.support.env_server import TASK, remote, search, view
from thicket.envs import make_env
from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.process import EnvServerProcess
from thicket.envs.textcraft import gold_path, make_task
from thicket.policy.uniform import UniformPolicy
from thicket.search.mcts import MCTSParams


async def test_client_rebuilds_an_instance_the_server_lost(server):
    local = make_env("textcraft")
    path = gold_path(make_task(TASK)) or []
    local.reset_sync(TASK)
    expected = [view(local.step_sync(a)) for a in path]
    client, env = await remote(server, "textcraft")
    async with client:
        await env.reset(TASK)
        got = [view(await env.step(a)) for a in path[:3]]
        state = await env.snapshot()
        await client.call("POST", "/close", {"id": env.instance})  # reaped behind its back
        got += [view(await env.step(a)) for a in path[3:]]
        assert got == expected and env.recoveries == 1 and env.replayed_steps == 3
        await env.restore(state)  # a snapshot id of the lost instance: rebuilt by replay
        assert view(await env.step(path[3])) == expected[3]
        await env.close()


# --- crash recovery -------------------------------------------------------------------


class KillingPolicy(UniformPolicy):
    """Uniform; at its n-th request it kill -9s the env server and starts it again."""

    def __init__(self, server: EnvServerProcess, at_call: int) -> None:
        super().__init__()
        self.server, self.at_call, self.calls = server, at_call, 0

    async def propose(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == self.at_call:
            self.server.kill()
            self.server.start()  # same port; the client retries until it answers again
        return await super().propose(*args, **kwargs)


async def test_kill_9_mid_search_then_restart_gives_the_same_tree():
    params = MCTSParams(iterations=8, expansions=3, max_depth=8)
    reference = await search(make_env("textcraft"), params)
    async with EnvServerProcess(["textcraft"]) as crashing, EnvClient(ClientConfig(crashing.url)) as client:
        env = await client.env("textcraft")
        tree = await search(env, params, policy=KillingPolicy(crashing, at_call=5))
        assert env.recoveries >= 1 and client.connection_errors >= 1
        await env.close()
    assert len(tree) > 10 and tree == reference


async def test_the_lean_transport_reads_chunked_unsized_and_closing_answers():
    answers = [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n4\r\n[1, \r\n2\r\n2]\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\n\r\n\"until the end\"",  # no length: the body ends with the connection
    ]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            await reader.readuntil(b"\r\n\r\n")
            answer = answers.pop(0)
            writer.write(answer)
            if b"content-length" not in answer or b"close" in answer:
                break
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with EnvClient(ClientConfig(f"http://127.0.0.1:{port}")) as client, listener:
        assert await client.call("GET", "/a") == [1, 2]
        assert await client.call("GET", "/b") == {}
        assert await client.call("GET", "/c") == "until the end"
