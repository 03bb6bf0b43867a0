"""`thicket serve-env` and its client over real HTTP, for every registered env: a RemoteEnv walks,
branches and succeeds as the env does in process."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.env_server import FAMILIES, TASK, remote, view, walk
from thicket.envs import SyncEnv, make_env
from thicket.envs.textcraft import gold_path, make_task


@pytest.fixture(scope="module")
def local_envs() -> Iterator[dict[str, SyncEnv]]:
    """One in-process env per family, shared by the tests (a JVM each for sciworld)."""
    envs: dict[str, SyncEnv] = {}
    yield envs
    for env in envs.values():
        asyncio.run(env.close())


def local_env(envs: dict[str, SyncEnv], family: str) -> SyncEnv:
    if family not in envs:
        env = make_env(family)
        assert isinstance(env, SyncEnv)
        envs[family] = env
    return envs[family]


def replays_alike(env: SyncEnv, actions: list[str]) -> bool:
    """Whether the env gives the same episode twice after resets of one instance."""
    episodes = []
    for _ in range(2):
        env.reset_sync(TASK)
        episodes.append([view(env.step_sync(a)) for a in actions])
    return episodes[0] == episodes[1]


def gold_paths(family: str, env: SyncEnv) -> list[list[str]]:
    """The env's own gold paths (TextCraft's planner, a walkthrough, a solution), unchecked."""
    env.reset_sync(TASK)
    candidates: list[Any] = [gold_path(make_task(TASK))] if family == "textcraft" else []
    for attribute in ("walkthrough", "solution"):
        value = getattr(env, attribute, None)
        candidates.append(value() if callable(value) else value)
    return [list(path) for path in candidates if path]


def succeeds(env: SyncEnv, path: list[str]) -> bool:
    env.reset_sync(TASK)
    return [env.step_sync(a) for a in path][-1].success


def breadth_first(env: SyncEnv, budget_s: float) -> list[str] | None:
    first = env.reset_sync(TASK)
    frontier = deque([((), env.snapshot_sync(), first.valid_actions or ())])
    seen, deadline = {first.text}, time.monotonic() + budget_s
    while frontier:
        path, state, valid = frontier.popleft()
        for action in valid:
            if time.monotonic() > deadline:
                return None
            env.restore_sync(state)
            t = env.step_sync(action)
            if t.success:
                return [*path, action]
            if not t.done and t.observation.text not in seen:
                seen.add(t.observation.text)
                frontier.append(((*path, action), env.snapshot_sync(), t.observation.valid_actions or ()))
    return None


# --- every env over HTTP ------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
async def test_env_over_http_matches_in_process_and_branches_alike(server, local_envs, family):
    local = local_env(local_envs, family)
    client, env = await remote(server, family)
    async with client:
        # a fresh instance on each side (started together: a JVM each for sciworld)
        reference, first = await asyncio.gather(asyncio.to_thread(walk, local, random.Random(7), 6), env.reset(TASK))
        assert env.instructions == local.instructions and env.can_snapshot == local.can_snapshot
        assert first == reference.first
        actions = reference.actions
        assert [view(await env.step(a)) for a in actions] == reference.transitions
        # branch mid-episode: restore a snapshot (or reset + replay the prefix), go on again
        cut = len(actions) // 2
        await env.reset(TASK)
        for a in actions[:cut]:
            await env.step(a)
        state = await env.snapshot() if env.can_snapshot else None
        once = [view(await env.step(a)) for a in actions[cut:]]
        if state is not None:
            await env.restore(state)
        else:
            await env.reset(TASK)
            for a in actions[:cut]:
                await env.step(a)
        again = [view(await env.step(a)) for a in actions[cut:]]
        if again != once and state is None and not await asyncio.to_thread(replays_alike, local, actions):
            pytest.xfail(f"{family} is not deterministic across resets of one instance, in process too")
        assert again == once
        await env.close()


@pytest.mark.parametrize("family", FAMILIES)
async def test_env_over_http_reaches_a_known_success(server, local_envs, family):
    """A path that succeeds in process (the env's own gold path, else one breadth-first search
    finds) succeeds over HTTP, step for step the same. Every family has one: finding none is the
    test's own failure, never a skip."""
    local = local_env(local_envs, family)
    candidates = await asyncio.to_thread(gold_paths, family, local)
    path = None
    for candidate in candidates:
        if await asyncio.to_thread(succeeds, local, candidate):
            path = candidate
            break
    if path is None and local.can_snapshot:
        path = await asyncio.to_thread(breadth_first, local, 10.0)
    assert path, f"{family}: no path succeeds in process (neither a gold path nor breadth-first search)"
    local.reset_sync(TASK)
    expected = [view(local.step_sync(a)) for a in path]
    client, env = await remote(server, family)
    async with client:
        await env.reset(TASK)
        transitions = [await env.step(a) for a in path]
        await env.close()
    assert [view(t) for t in transitions] == expected
    assert transitions[-1].success and transitions[-1].done and transitions[-1].reward > 0
    assert not any(t.done for t in transitions[:-1])
