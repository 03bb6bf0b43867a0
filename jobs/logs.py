"""Log setup for the `thicket` command: human-readable text, or one JSON object per line.

JSON lines carry time, level, logger and message, plus every field a call site attaches
with `extra=` (task, tree, node, seconds, nodes, llm_requests, status, ...), so a log
pipeline can filter and aggregate without parsing messages.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any, Literal

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
FORMAT_VARIABLE = "THICKET_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NOISY_LOGGERS = ("httpx", "httpcore", "botocore", "boto3", "s3transfer", "urllib3", "py4j")

# Whether text logs keep to warnings and errors while a progress bar is shown (set by
# setup_logging: text without -v; -v and JSON logs keep every line).
_quiet_under_bar = False

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per record; values JSON cannot hold are written as their str()."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= extra_fields(record)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def setup_logging(log_format: LogFormat = "text", verbose: bool = False) -> None:
    """Log to stderr in `log_format` (a no-op where the root logger already has handlers,
    as under pytest)."""
    global _quiet_under_bar
    _quiet_under_bar = log_format == "text" and not verbose
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler])
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _WarningsAndErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


@contextlib.contextmanager
def under_progress_bar(stream: Any = None) -> Iterator[None]:
    """While a progress bar is shown on a terminal: text logs carry warnings and errors only
    (per-task INFO lines would scroll the bar away: three a task), unless -v or JSON logs; a
    `stream` given (the bar's stderr proxy) takes the root's stderr handlers' lines, printed
    above the bar."""
    quiet = _WarningsAndErrors() if _quiet_under_bar else None
    moved: list[tuple[logging.StreamHandler[Any], Any]] = []
    for handler in logging.getLogger().handlers:
        if quiet is not None:
            handler.addFilter(quiet)
        if stream is not None and type(handler) is logging.StreamHandler and handler.stream is sys.__stderr__:
            moved.append((handler, handler.setStream(stream)))
    try:
        yield
    finally:
        for handler, old in moved:
            handler.setStream(old)
        if quiet is not None:
            for handler in logging.getLogger().handlers:
                handler.removeFilter(quiet)
