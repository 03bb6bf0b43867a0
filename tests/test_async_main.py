"""run_main's stop: SIGTERM and SIGINT cancel the main task through the event loop (no exception
raised inside asyncio's own callbacks), the coroutine's `finally` runs, the caller gets Terminated
or KeyboardInterrupt, and the process's previous handlers are back afterwards. The signal is sent
once the coroutine is busy with threads, as a run is (checkpoints and shards go through to_thread)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest

from thicket.async_main import Terminated, run_main


async def busy_with_threads(started: asyncio.Event, unwound: list[str]) -> None:
    try:
        while True:
            await asyncio.to_thread(time.sleep, 0.001)
            started.set()
    finally:
        unwound.append("finally")


@pytest.mark.parametrize(("sig", "raised"), [(signal.SIGTERM, Terminated), (signal.SIGINT, KeyboardInterrupt)])
def test_a_signal_cancels_the_main_task_and_raises_for_the_command(sig, raised, caplog):
    def mark(signum, frame):
        raise AssertionError("the previous handler ran while the loop did")

    before = signal.signal(sig, mark)
    try:
        for _ in range(20):  # each a fresh loop, the signal at a random point of a to_thread's round trip
            unwound: list[str] = []

            async def main() -> None:
                started = asyncio.Event()
                runner = asyncio.create_task(busy_with_threads(started, unwound))
                await started.wait()
                asyncio.get_running_loop().call_later(0.002, os.kill, os.getpid(), sig)
                await runner

            with caplog.at_level(logging.ERROR, logger="asyncio"), pytest.raises(raised) as stopped:
                run_main(main())
            assert stopped.type is raised and unwound == ["finally"]
            assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text  # no callback traceback
            assert signal.getsignal(sig) is mark  # the previous handler is back
    finally:
        signal.signal(sig, before)


def test_a_run_that_is_not_stopped_returns_its_result():
    async def main() -> int:
        return await asyncio.to_thread(lambda: 7)

    assert run_main(main()) == 7
