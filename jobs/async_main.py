"""`run_main`: asyncio.run for the commands' main coroutine, stopped cleanly by SIGTERM and Ctrl-C.

While the loop runs, SIGTERM and SIGINT are the loop's own signal handlers (`add_signal_handler`):
the signal wakes the loop, which cancels the main task as a plain callback, so the run unwinds
through its `finally` blocks (child servers stop, growing trees are saved) and run_main then raises
`Terminated` or KeyboardInterrupt for the command's last line. A handler that raised in whatever
frame the signal met could land inside asyncio's own bookkeeping (a future's result being copied
from its thread: "InvalidStateError" logged with a traceback) or leave a thread's future never
completed, and the run hung at its end. A handler installed on top (the checkpoints' SIGTERM save)
still runs first, synchronously, as Python calls handlers; the loop is woken all the same.

Asyncio leaves an exception that ended the main task set on it, never retrieved, and logs "Task
exception was never retrieved" when the task is collected: it is retrieved here.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Terminated(KeyboardInterrupt):
    """SIGTERM (Kubernetes' preemption and drain signal): unwinds as an interrupt does."""


def run_main(main: Coroutine[Any, Any, T]) -> T:
    task: asyncio.Task[Any] | None = None
    stops: list[signal.Signals] = []
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} if on_main_thread else {}

    def stop(sig: signal.Signals) -> None:
        stops.append(sig)
        if task is not None:
            task.cancel()

    async def tracked() -> T:
        nonlocal task
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in previous:
            loop.add_signal_handler(sig, stop, sig)
        try:
            return await main
        finally:
            for sig in previous:
                loop.remove_signal_handler(sig)

    try:
        result = asyncio.run(tracked())
    except BaseException as err:
        if task is not None and task.done() and not task.cancelled():
            task.exception()  # retrieved: it goes on up from here, once
        if stops and isinstance(err, (asyncio.CancelledError, KeyboardInterrupt)):
            raise interrupt_for(stops[0]) from None
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # asyncio leaves SIG_DFL / default_int_handler behind
    if stops:  # the main coroutine swallowed the cancellation: the run was stopped all the same
        raise interrupt_for(stops[0])
    return result


def interrupt_for(sig: signal.Signals) -> KeyboardInterrupt:
    """What a stop by `sig` raises for the command's last line."""
    return Terminated() if sig is signal.SIGTERM else KeyboardInterrupt()
