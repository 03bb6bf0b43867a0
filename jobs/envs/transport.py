"""A lean HTTP/1.1 transport for httpx: keep-alive connections on asyncio protocols, responses
parsed by httptools (the C parser uvicorn uses).

httpx's default transport (httpcore on anyio) costs ~1-2 ms of CPU per request on a small
machine and grows with the number of pooled connections; env steps are tiny requests to one
local server, many per second, so that overhead was most of a step. This transport keeps
httpx's API (requests, responses, timeouts, errors) and speaks plain http:// only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict

import httptools
import httpx

Origin = tuple[str, int]


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


class LeanTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over plain TCP with pooled keep-alive connections (idle ones reused LIFO)."""

    def __init__(self, max_idle_per_origin: int = 64) -> None:
        self.max_idle = max_idle_per_origin
        self._idle: defaultdict[Origin, list[_Connection]] = defaultdict(list)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"LeanTransport speaks http:// only, not {request.url.scheme}://")
        origin = (request.url.host, request.url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        connection = await self._connection(origin, request, timeouts.get("connect"))
        try:
            async with asyncio.timeout(timeouts.get("read")):
                status, headers, content = await connection.exchange(_head(request, len(body)), body)
        except TimeoutError:
            connection.close()
            raise httpx.ReadTimeout(f"no response within {timeouts.get('read')} s", request=request) from None
        except httpx.TransportError as err:
            connection.close()
            raise type(err)(str(err), request=request) from None
        except BaseException:  # cancelled mid-exchange: the connection's state is unknown
            connection.close()
            raise
        self._release(origin, connection)
        return httpx.Response(status, headers=headers, content=content, request=request)

    async def _connection(self, origin: Origin, request: httpx.Request, timeout: float | None) -> _Connection:
        idle = self._idle[origin]
        while idle:
            connection = idle.pop()
            if connection.reusable:
                return connection
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                _, connection = await loop.create_connection(_Connection, *origin)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"cannot connect to {origin[0]}:{origin[1]} within {timeout} s", request=request) from None
        except OSError as err:
            raise httpx.ConnectError(f"cannot connect to {origin[0]}:{origin[1]}: {err.strerror or err}", request=request) from None
        return connection

    def _release(self, origin: Origin, connection: _Connection) -> None:
        idle = self._idle[origin]
        if connection.reusable and len(idle) < self.max_idle:
            idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                with contextlib.suppress(Exception):
                    connection.close()
        self._idle.clear()


def _head(request: httpx.Request, length: int) -> bytes:
    target = request.url.raw_path
    lines = [request.method.encode() + b" " + target + b" HTTP/1.1"]
    has_length = False
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered == b"content-length":
            has_length = True
        elif lowered == b"transfer-encoding":
            continue  # the body was read whole: send it with a length
        lines.append(name + b": " + value)
    if not has_length and (length or request.method in ("POST", "PUT", "PATCH")):
        lines.append(b"content-length: " + str(length).encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"
