"""The lean HTTP transport over a real socket: keep-alive reuse and its expiry, headers, and
which exchange a URL gets."""

from __future__ import annotations

import asyncio
import threading

import httpx
import pytest

from tests.support.http_stub import QuietHandler, serving
from thicket.transport import HttpxExchange, LeanExchange, exchange_for


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


class EchoHeaders(QuietHandler):
    """Answers with the request's authorization header and body."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.answer(200, (self.headers.get("Authorization", "") + "|").encode() + body)


@pytest.mark.parametrize("lean", [True, False])
def test_headers_and_body_reach_the_server(lean: bool) -> None:
    async def post(url: str) -> bytes:
        headers = {"authorization": "Bearer k"}
        exchange = (LeanExchange(url, 5.0, headers=headers) if lean
                    else HttpxExchange(httpx.AsyncHTTPTransport(), url, 5.0, headers=headers))
        try:
            answer = await exchange("POST", "/chat", b'{"a": 1}')
            assert answer.status == 200
            return answer.content
        finally:
            await exchange.aclose()

    with serving(EchoHeaders) as url:
        assert asyncio.run(post(url + "/v1")) == b'Bearer k|{"a": 1}'


def test_a_proxy_of_the_environment_takes_the_httpx_exchange(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(exchange_for("http://vllm:8000/v1", 5.0, 8), LeanExchange)
    assert isinstance(exchange_for("https://api.example/v1", 5.0, 8), HttpxExchange)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert isinstance(exchange_for("http://vllm:8000/v1", 5.0, 8), HttpxExchange)  # through the proxy
    assert isinstance(exchange_for("http://127.0.0.1:8000/v1", 5.0, 8), LeanExchange)  # NO_PROXY
