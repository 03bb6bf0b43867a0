"""Nothing answers at an address: the connection failure that, at start-up, means a wrong URL.

A server that refuses connections, or a host name that does not resolve, for a whole start-up
window is a mistake in the spec (exit 2). Once a run has reached a server, the same failures are
an outage: they are retried, and end as "unavailable" (exit 3) when they last.
"""

from __future__ import annotations

import errno
import socket

_NO_ROUTE = frozenset({errno.EHOSTUNREACH, errno.ENETUNREACH})


def nobody_listens(exc: BaseException) -> str | None:
    """Why nothing answers ('connection refused', 'host name not found', 'no route to host'),
    read from exc or the exceptions it was raised from; None for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, socket.gaierror):
            return "host name not found"
        if isinstance(current, ConnectionRefusedError):
            return "connection refused"
        if isinstance(current, OSError) and current.errno in _NO_ROUTE:
            return "no route to host"
        current = current.__cause__ or current.__context__
    return None
