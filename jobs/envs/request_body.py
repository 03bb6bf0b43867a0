"""A request's body as the env server reads it: bounded in size, then parsed as JSON."""

from __future__ import annotations

from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from thicket.envs.wire import ApiError, ErrorCode, parse_json


async def read_body(receive: Receive, declared: str | None, limit: int) -> bytes:
    """A request's body off the ASGI channel, refused past `limit` bytes."""
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(ErrorCode.BODY_TOO_LARGE, f"request body of {declared} bytes exceeds {limit}")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(ErrorCode.BODY_TOO_LARGE, f"request body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    return parse_json(await read_body(request.receive, request.headers.get("content-length"), limit))
