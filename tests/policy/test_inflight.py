"""Requests in flight: the adjustable limit, the tuner's rule, and auto-tuning against real vLLM."""

from __future__ import annotations

import asyncio

import pytest

from thicket.policy.inflight import (
    AdjustableLimit,
    InFlightTuner,
    ServerLoad,
    parse_server_load,
)
from thicket.rollout.served_policy import AUTO_FIRST, serve_policy
from thicket.rollout.sweep import run_tasks
from thicket.spec import PolicySpec, parse_spec


async def test_a_lowered_limit_lets_holders_finish_and_holds_new_acquirers():
    limit = AdjustableLimit(3)
    entered = 0

    async def hold(release: asyncio.Event) -> None:
        nonlocal entered
        async with limit:
            entered += 1
            await release.wait()

    first = asyncio.Event()
    holders = [asyncio.create_task(hold(first)) for _ in range(3)]
    await asyncio.sleep(0)
    assert limit.in_use == 3
    limit.set_limit(1)
    later = asyncio.Event()
    waiting = [asyncio.create_task(hold(later)) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert entered == 3  # nobody new while 3 >= 1
    first.set()
    await asyncio.gather(*holders)
    await asyncio.sleep(0.01)
    assert limit.in_use == 1 and entered == 4  # one at a time now
    limit.set_limit(5)
    await asyncio.sleep(0.01)
    assert entered == 5
    later.set()
    await asyncio.gather(*waiting)
    assert limit.in_use == 0


async def test_a_cancelled_waiter_does_not_swallow_a_wake_up():
    limit = AdjustableLimit(1)
    release = asyncio.Event()

    async def hold() -> None:
        async with limit:
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0)
    doomed, patient = asyncio.create_task(hold()), asyncio.create_task(hold())
    await asyncio.sleep(0)
    release.set()
    await asyncio.sleep(0)  # the holder leaves and wakes `doomed`...
    doomed.cancel()  # ...which is cancelled before it runs
    await asyncio.wait_for(asyncio.gather(holder, patient), 1)  # `patient` still gets in
    assert limit.in_use == 0


def test_followers_move_with_their_leader_up_to_their_ceiling():
    requests = AdjustableLimit(16, ceiling=1024)
    trees = AdjustableLimit(1).follow(requests, 2)
    assert (trees.limit, trees.ceiling) == (32, 2048)
    requests.set_limit(100)
    assert trees.limit == 200
    requests.set_limit(5000)
    assert (requests.limit, trees.limit) == (1024, 2048)


def tuner_at(limit: int, in_use: int) -> InFlightTuner:
    slots = AdjustableLimit(limit, ceiling=1024)
    slots.in_use = in_use
    return InFlightTuner("http://unused/metrics", slots)


def test_the_tuner_grows_while_the_server_has_room_and_every_slot_is_busy():
    assert tuner_at(16, 16).next_limit(ServerLoad(running=64, waiting=0)) == 21
    assert tuner_at(16, 8).next_limit(ServerLoad(running=32, waiting=0)) == 16  # we are not using them all
    assert tuner_at(1024, 1024).next_limit(ServerLoad(running=4000, waiting=0)) == 1024  # ceiling


def test_the_tuner_backs_off_when_a_full_batch_has_a_queue_beyond_a_margin():
    assert tuner_at(100, 100).next_limit(ServerLoad(running=128, waiting=60)) == 90
    assert tuner_at(100, 100).next_limit(ServerLoad(running=128, waiting=10)) == 100  # a small queue is fine
    assert tuner_at(4, 4).next_limit(ServerLoad(running=8, waiting=50)) == 4  # floor


def test_requests_waiting_beside_a_half_empty_batch_are_not_a_full_server():
    tuner = tuner_at(40, 40)
    tuner.next_limit(ServerLoad(running=120, waiting=0))
    assert tuner.next_limit(ServerLoad(running=10, waiting=8)) == 40  # e.g. grammars compiling
    assert tuner.next_limit(ServerLoad(running=0, waiting=4)) == 40
    assert tuner.next_limit(ServerLoad(running=118, waiting=30)) == 36


def test_server_load_is_read_from_vllm_gauges_summed_over_engines():
    text = (
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0",model_name="m"} 7.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 5.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0\n'
    )
    assert parse_server_load(text) == ServerLoad(running=12.0, waiting=3.0)
    assert parse_server_load("other_metric 1\n") is None


async def test_auto_without_vllm_gauges_keeps_a_fixed_level():
    async with serve_policy(PolicySpec(kind="uniform")) as served:
        assert served.policy.slots.limit == 64


@pytest.mark.vllm
async def test_auto_concurrency_climbs_from_the_real_servers_load(vllm_server, tmp_path):
    spec = parse_spec({
        "name": "auto",
        "tasks": {"env": "frozenlake", "env_args": {"size": 4}, "start": 0, "stop": 48, "per_index": 48,
                  "env_server": {"mode": "in_process"}},
        "search": {"algorithm": "mcts", "iterations": 3, "expansions": 2, "max_depth": 4},
        "policy": {"kind": "openai", "url": vllm_server.url, "model": vllm_server.served_name,
                   "max_tokens": 16, "max_thought_chars": 8},
        "run": {"progress": False},
        "output": str(tmp_path),
    })
    assert spec.policy.concurrency == "auto"
    summary = await run_tasks(spec, list(range(48)), progress=False)
    assert len(summary.report.grown) == 48
    # the tuner raised its first limit from the server's gauges (the mean in flight also counts
    # the ramp and the drain: on a fast machine the sweep ended before it passed the first limit)
    assert summary.in_flight_limit > AUTO_FIRST
