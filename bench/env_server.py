"""Env server throughput: TextCraft round-trip steps/s through one `thicket serve-env` process
with 32 concurrent clients, and the server's overhead per step (time in the /step handler,
from the Server-Timing header, minus the env's own step time, against the in-process step).

    .venv/bin/python bench/env_server.py [--clients 32] [--seconds 5]

Client kinds:
  raw      minimal asyncio HTTP/1.1 keep-alive clients (like wrk): the server's capacity
  thicket  thicket's RemoteEnv (httpx + the lean transport): what a worker gets, plain steps
  search   RemoteEnv as a tree search drives it: restore + step + snapshot in one round trip
Every client holds its own env instance, steps random valid actions, resets when done.
The clients share the machine with the server: on 2 cores they take CPU from it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from dataclasses import dataclass, field

import orjson

from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.process import EnvServerProcess
from thicket.envs.remote import RemoteEnv
from thicket.envs.textcraft import TextCraftEnv

TASKS = 8  # tasks cycled through (their generation is paid before timing)


@dataclass
class Tally:
    steps: int = 0
    rtt_ms: list[float] = field(default_factory=list)
    handler_ms: list[float] = field(default_factory=list)
    env_ms: list[float] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else float("nan")


# --- in process ---------------------------------------------------------------------


def in_process_step_ms(seconds: float) -> tuple[float, float]:
    env, rng = TextCraftEnv(), random.Random(0)
    valid = env.reset_sync(0).valid_actions or ()
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        started = time.perf_counter()
        t = env.step_sync(rng.choice(valid))
        times.append((time.perf_counter() - started) * 1000)
        if t.done:
            valid = env.reset_sync(len(times) % TASKS).valid_actions or ()
    return statistics.median(times), len(times) / seconds


# --- raw HTTP clients ---------------------------------------------------------------


class RawClient:
    """One keep-alive connection speaking just enough HTTP/1.1 for the env routes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> RawClient:
        return cls(*await asyncio.open_connection(host, port))

    async def post(self, path: str, body: dict) -> tuple[dict, dict[str, str]]:
        data = orjson.dumps(body)
        self.writer.write(b"POST %s HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                          b"content-length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
        head = await self.reader.readuntil(b"\r\n\r\n")
        headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
        headers = {k.lower(): v for k, v in headers.items()}
        payload = orjson.loads(await self.reader.readexactly(int(headers["content-length"])))
        return payload, headers


def server_timing(header: str) -> dict[str, float]:
    parts = (p.strip().split(";dur=") for p in header.split(","))
    return {name: float(value) for name, value in parts}


async def raw_client(server: EnvServerProcess, i: int, stop: float, tally: Tally) -> None:
    client = await RawClient.open(server.host, server.port)
    rng = random.Random(i)
    created, _ = await client.post("/textcraft/create", {"data_idx": i % TASKS})
    env_id, valid = created["id"], created["valid_actions"]
    while time.perf_counter() < stop:
        started = time.perf_counter()
        step, headers = await client.post("/step", {"id": env_id, "action": rng.choice(valid)})
        tally.rtt_ms.append((time.perf_counter() - started) * 1000)
        timing = server_timing(headers["server-timing"])
        tally.handler_ms.append(timing["handler"])
        tally.env_ms.append(timing["env"])
        tally.steps += 1
        if step["done"]:
            valid = (await client.post("/reset", {"id": env_id, "data_idx": rng.randrange(TASKS)}))[0]["valid_actions"]
    await client.post("/close", {"id": env_id})
    client.writer.close()


# --- thicket's client ---------------------------------------------------------------


async def remote_client(env: RemoteEnv, i: int, stop: float, tally: Tally, search: bool) -> None:
    rng = random.Random(i)
    valid = (await env.reset(i % TASKS)).valid_actions or ()
    state = await env.snapshot() if search else None
    while time.perf_counter() < stop:
        started = time.perf_counter()
        if search and rng.random() < 0.5:
            await env.restore(state)  # branch from an earlier node, as a tree search does
        t = await env.step(rng.choice(valid))
        if search:
            state = await env.snapshot()
        tally.rtt_ms.append((time.perf_counter() - started) * 1000)
        tally.steps += 1
        if t.done:
            valid = (await env.reset(rng.randrange(TASKS))).valid_actions or ()
            state = await env.snapshot() if search else None


async def run_remote(server: EnvServerProcess, clients: int, seconds: float, tally: Tally, search: bool) -> float:
    async with EnvClient(ClientConfig(server.url, max_connections=clients)) as client:
        envs = [await client.env("textcraft") for _ in range(clients)]
        started = time.perf_counter()
        await asyncio.gather(*(remote_client(e, i, started + seconds, tally, search) for i, e in enumerate(envs)))
        elapsed = time.perf_counter() - started
        for env in envs:
            await env.close()
    return elapsed


async def run_raw(server: EnvServerProcess, clients: int, seconds: float, tally: Tally) -> float:
    started = time.perf_counter()
    await asyncio.gather(*(raw_client(server, i, started + seconds, tally) for i in range(clients)))
    return time.perf_counter() - started


async def warm(server: EnvServerProcess) -> None:
    client = await RawClient.open(server.host, server.port)
    for task in range(TASKS):  # task generation happens once per process: not a step cost
        created, _ = await client.post("/textcraft/create", {"data_idx": task})
        await client.post("/close", {"id": created["id"]})
    client.writer.close()


def report(kind: str, tally: Tally, elapsed: float, env_p50_ms: float) -> None:
    line = (f"{kind:<8} {tally.steps / elapsed:>9,.0f} steps/s   round trip p50 {percentile(tally.rtt_ms, 50):6.2f} ms"
            f"  p99 {percentile(tally.rtt_ms, 99):6.2f} ms")
    if tally.handler_ms:
        overhead = [h - e for h, e in zip(tally.handler_ms, tally.env_ms, strict=True)]
        line += (f"   handler p50 {percentile(tally.handler_ms, 50) * 1000:5.0f} us  p99 "
                 f"{percentile(tally.handler_ms, 99) * 1000:5.0f} us   env step p50 {percentile(tally.env_ms, 50) * 1000:4.0f} us"
                 f"   server overhead p50 {percentile(overhead, 50) * 1000:4.0f} us"
                 f" (vs in-process step {env_p50_ms * 1000:.0f} us)")
    print(line)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    env_p50_ms, in_process_rate = in_process_step_ms(min(args.seconds, 2.0))
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; {args.clients} clients, "
          f"{args.seconds:.0f} s each; TextCraft in process: {in_process_rate:,.0f} steps/s, p50 {env_p50_ms * 1000:.0f} us")
    async with EnvServerProcess(["textcraft"], args=["--max-instances", str(4 * args.clients)]) as server:
        await warm(server)
        tally = Tally()
        report("raw", tally, await run_raw(server, args.clients, args.seconds, tally), env_p50_ms)
        tally = Tally()
        report("thicket", tally, await run_remote(server, args.clients, args.seconds, tally, False), env_p50_ms)
        tally = Tally()
        report("search", tally, await run_remote(server, args.clients, args.seconds, tally, True), env_p50_ms)


if __name__ == "__main__":
    asyncio.run(main())
