"""`run_main`: asyncio.run for the commands' main coroutine, quiet when an interrupt ends it.

thicket's SIGTERM handler raises `Terminated` (a KeyboardInterrupt) in whatever frame runs, so that
context managers unwind: child servers stop, growing trees are saved. Raised inside the main task,
asyncio re-raises it out of the loop but leaves it set on the task as well, never retrieved, and
logs "Task exception was never retrieved" with a ~40-line traceback when the task is collected,
after the command's own last line. Retrieving it here keeps the end of a stopped run to what the
command says: the save line and how to resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_main(main: Coroutine[Any, Any, T]) -> T:
    task: asyncio.Task[Any] | None = None

    async def tracked() -> T:
        nonlocal task
        task = asyncio.current_task()
        return await main

    try:
        return asyncio.run(tracked())
    except BaseException:
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # retrieved: it goes on up from here, once
        raise
