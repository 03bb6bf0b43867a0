"""The env client's lean HTTP transport over a real socket: keep-alive reuse and its expiry."""

from __future__ import annotations

import asyncio
import threading

from http_stub import QuietHandler, serving

from thicket.envs.transport import LeanExchange


class KeepAlive(QuietHandler):
    """Answers every request on a kept-alive connection with the connection's number."""

    protocol_version = "HTTP/1.1"
    opened = 0
    lock = threading.Lock()

    def setup(self) -> None:
        super().setup()
        with KeepAlive.lock:
            KeepAlive.opened += 1
            self.number = KeepAlive.opened

    def do_GET(self) -> None:
        self.answer(200, str(self.number).encode())


async def _connections_used(base_url: str, expiry_s: float, pause_s: float) -> list[bytes]:
    exchange = LeanExchange(base_url, timeout_s=5.0)
    exchange.transport.keepalive_expiry_s = expiry_s
    try:
        answers = [(await exchange("GET", "/")).content]
        await asyncio.sleep(pause_s)
        answers.append((await exchange("GET", "/")).content)
        answers.append((await exchange("GET", "/")).content)
        return answers
    finally:
        await exchange.aclose()


def test_an_idle_connection_is_reused_before_its_expiry_and_replaced_after():
    with serving(KeepAlive) as url:
        fresh = asyncio.run(_connections_used(url, expiry_s=5.0, pause_s=0.05))
        assert len(set(fresh)) == 1, fresh  # one connection for all three
        expired = asyncio.run(_connections_used(url, expiry_s=0.02, pause_s=0.1))
        first, second, third = expired
        assert first != second, expired  # idle past its expiry: a new connection
        assert second == third, expired  # which is then reused
