"""Lean HTTP/1.1 for the env client and the policy: keep-alive connections on asyncio
protocols, responses parsed by httptools (the C parser uvicorn uses), requests encoded
straight to bytes.

httpx's default transport (httpcore on anyio) and its Request/Response objects cost most of
an env step's client CPU; env steps are tiny requests to one local server, many per second.
For the policy, httpcore's pool scans every connection to place each request (a tenth of the
worker's CPU with 60 requests in flight). LeanExchange speaks plain http:// only and raises
httpx's errors; HttpxExchange gives the same interface over any httpx transport (https://,
tests); exchange_for picks one for a URL, and get() makes a single request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import httptools
import httpx

Origin = tuple[str, int]
# An idle connection is not reused past this: a server closes idle ones on its own clock
# (uvicorn's default keep-alive is 5 s), and a request written as it closes is lost.
KEEPALIVE_EXPIRY_S = 4.0
_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its response gathered in memory."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self._response: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._headers_seen = False
        self._delimited_by_eof = True
        self._body: list[bytes] = []
        self._keep_alive = True
        self.idle_since = 0.0  # time.monotonic() when it last went back to the pool

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as err:
            self._fail(httpx.RemoteProtocolError(f"malformed HTTP response: {err}"))

    def eof_received(self) -> bool:
        if self._response is not None and not self._response.done() and self._headers_seen and self._delimited_by_eof:
            self.on_message_complete()
        return False  # anything else still expected is lost: connection_lost fails the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(httpx.RemoteProtocolError("server closed the connection without a complete response"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._delimited_by_eof = False  # the body's end is announced: EOF before it is a loss

    def on_headers_complete(self) -> None:
        self._headers_seen = True
        self._keep_alive = self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        if self._response is not None and not self._response.done():
            status = self.parser.get_status_code()
            self._response.set_result((status, self._headers, b"".join(self._body)))
        if not self._keep_alive:
            self.close()

    # use
    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive and self.transport is not None and not self.transport.is_closing()

    async def exchange(self, head: bytes, body: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        assert self.transport is not None
        self._response = asyncio.get_running_loop().create_future()
        self._headers, self._body, self._headers_seen, self._delimited_by_eof = [], [], False, True
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)
        return await self._response

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _fail(self, error: Exception) -> None:
        if self._response is not None and not self._response.done():
            self._response.set_exception(error)
        self.close()


class LeanTransport:
    """HTTP/1.1 over plain TCP with pooled keep-alive connections (idle ones reused LIFO, none
    idle for longer than keepalive_expiry_s)."""

    def __init__(self, max_idle_per_origin: int = 64, keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S) -> None:
        self.max_idle = max_idle_per_origin
        self.keepalive_expiry_s = keepalive_expiry_s
        self._idle: defaultdict[Origin, list[_Connection]] = defaultdict(list)

    async def send(self, origin: Origin, head: bytes, body: bytes, connect_timeout: float | None,
                   read_timeout: float | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One request already encoded (head and body) -> (status, headers, body)."""
        connection = await self._connection(origin, connect_timeout)
        try:
            async with asyncio.timeout(read_timeout):
                answer = await connection.exchange(head, body)
        except TimeoutError:
            connection.close()
            raise httpx.ReadTimeout(f"no response within {read_timeout} s") from None
        except BaseException:  # a transport error, or cancelled mid-exchange: the connection's state is unknown
            connection.close()
            raise
        self._release(origin, connection)
        return answer

    async def _connection(self, origin: Origin, timeout: float | None) -> _Connection:
        idle = self._idle[origin]
        while idle:
            connection = idle.pop()
            if time.monotonic() - connection.idle_since > self.keepalive_expiry_s:
                for stale in [connection, *idle]:  # LIFO: the ones below are older still
                    stale.close()
                idle.clear()
            elif connection.reusable:
                return connection
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(_Connection, *origin)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"cannot connect to {origin[0]}:{origin[1]} within {timeout} s") from None
        except OSError as err:
            raise httpx.ConnectError(f"cannot connect to {origin[0]}:{origin[1]}: {err.strerror or err}") from None
        return connection

    def _release(self, origin: Origin, connection: _Connection) -> None:
        idle = self._idle[origin]
        if connection.reusable and len(idle) < self.max_idle:
            connection.idle_since = time.monotonic()
            idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                with contextlib.suppress(Exception):
                    connection.close()
        self._idle.clear()


# --- whole requests to one base URL -----------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    """A whole HTTP answer."""

    status: int
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    @property
    def reason(self) -> str:
        return httpx.codes.get_reason_phrase(self.status)


class Exchange(Protocol):
    """Sends one request to a base URL and returns the whole answer (httpx's errors on failure)."""

    async def __call__(self, method: str, path: str, content: bytes | None = None,
                       params: dict[str, Any] | None = None) -> Answer: ...

    async def aclose(self) -> None: ...


class LeanExchange:
    """Requests to an http:// base URL encoded straight to bytes for a LeanTransport: no
    httpx.Request or Response objects on the way (building them was half of a step's client CPU).
    headers: sent with every request (e.g. authorization)."""

    def __init__(self, base_url: str, timeout_s: float, max_idle: int = 64, headers: dict[str, str] | None = None,
                 connect_timeout_s: float | None = None) -> None:
        url = httpx.URL(base_url)
        if url.scheme != "http":
            raise ValueError(f"LeanExchange speaks http:// only, not {url.scheme}://")
        self.transport = LeanTransport(max_idle_per_origin=max_idle)
        self.origin = (url.host, url.port or 80)
        self.base_path = url.raw_path.rstrip(b"/")
        self.header_lines = [b"host: " + url.netloc] + [f"{k}: {v}".encode() for k, v in (headers or {}).items()]
        self.timeout_s = timeout_s
        self.connect_timeout_s = timeout_s if connect_timeout_s is None else connect_timeout_s

    async def __call__(self, method: str, path: str, content: bytes | None = None,
                       params: dict[str, Any] | None = None) -> Answer:
        target = self.base_path + path.encode()
        if params:
            target += b"?" + urlencode(params).encode()
        lines = [method.encode() + b" " + target + b" HTTP/1.1", *self.header_lines]
        if content is not None:
            lines += [b"content-type: application/json", b"content-length: " + str(len(content)).encode()]
        elif method in ("POST", "PUT", "PATCH"):
            lines.append(b"content-length: 0")
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        status, _, body = await self.transport.send(self.origin, head, content or b"", self.connect_timeout_s,
                                                    self.timeout_s)
        return Answer(status, body)

    async def aclose(self) -> None:
        await self.transport.aclose()


class HttpxExchange:
    """The same over any httpx transport (https://, or a test's transport)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, base_url: str, timeout_s: float,
                 headers: dict[str, str] | None = None, connect_timeout_s: float | None = None) -> None:
        self.transport = transport
        self.base = base_url.rstrip("/")
        self.headers = headers or {}
        connect_s = timeout_s if connect_timeout_s is None else connect_timeout_s
        self.extensions = {"timeout": httpx.Timeout(timeout_s, connect=connect_s).as_dict()}

    async def __call__(self, method: str, path: str, content: bytes | None = None,
                       params: dict[str, Any] | None = None) -> Answer:
        headers = self.headers | {"content-type": "application/json"} if content is not None else self.headers
        request = httpx.Request(method, self.base + path, params=params, content=content, headers=headers,
                                extensions=self.extensions)
        response = await self.transport.handle_async_request(request)
        try:
            body = await response.aread()
        finally:
            await response.aclose()
        return Answer(response.status_code, body)

    async def aclose(self) -> None:
        await self.transport.aclose()


def exchange_for(base_url: str, timeout_s: float, max_connections: int, headers: dict[str, str] | None = None,
                 connect_timeout_s: float | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> Exchange:
    """LeanExchange for an http:// URL that no proxy of the environment applies to; else
    HttpxExchange (https://, a proxy, or a given transport)."""
    proxy = proxy_for(base_url)
    if transport is None and base_url.startswith("http://") and proxy is None:
        return LeanExchange(base_url, timeout_s, max_connections, headers, connect_timeout_s)
    if transport is None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        transport = httpx.AsyncHTTPTransport(limits=limits, socket_options=_NODELAY, proxy=proxy)
    return HttpxExchange(transport, base_url, timeout_s, headers, connect_timeout_s)


async def get(url: str, timeout_s: float) -> Answer:
    """One GET of url (e.g. a server's /metrics) on a connection of its own."""
    exchange = exchange_for(url, timeout_s, max_connections=1)
    try:
        return await exchange("GET", "")
    finally:
        await exchange.aclose()


def proxy_for(url: str) -> str | None:
    """The proxy that the environment (HTTP_PROXY, HTTPS_PROXY, NO_PROXY, ...) sets for url."""
    parsed = httpx.URL(url)
    if urllib.request.proxy_bypass(parsed.host):
        return None
    return urllib.request.getproxies().get(parsed.scheme)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
