"""The env server's wire format, as both ends read it: error codes, JSON in and out, the
fields of requests and answers, and the errors each end raises over them.

An error answer is `{"error": message, "code": ErrorCode, "status": http_status}`; the server
raises ApiError to send one, the client turns one into EnvServerError (or a subclass) with
`classify`, which also reads AgentGym's errors (a 200 answer with an `error` field).
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any

import orjson

from thicket.envs.protocol import Observation, Transition
from thicket.errors import ThicketError


class ErrorCode(StrEnum):
    BAD_JSON = "bad_json"
    BAD_REQUEST = "bad_request"
    BODY_TOO_LARGE = "body_too_large"
    ACTION_TOO_LONG = "action_too_long"
    UNKNOWN_FAMILY = "unknown_family"
    BAD_ENV_ARGS = "bad_env_args"
    UNSUPPORTED = "unsupported"
    UNKNOWN_INSTANCE = "unknown_instance"
    UNKNOWN_SNAPSHOT = "unknown_snapshot"
    CANNOT_SNAPSHOT = "cannot_snapshot"
    EPISODE_DONE = "episode_done"
    CAPACITY = "capacity"
    DRAINING = "draining"
    ENV_ERROR = "env_error"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INTERNAL = "internal"


STATUS: dict[ErrorCode, int] = {
    ErrorCode.BAD_JSON: 400,
    ErrorCode.BAD_REQUEST: 422,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.ACTION_TOO_LONG: 413,
    ErrorCode.UNKNOWN_FAMILY: 404,
    ErrorCode.BAD_ENV_ARGS: 422,
    ErrorCode.UNSUPPORTED: 422,
    ErrorCode.UNKNOWN_INSTANCE: 404,
    ErrorCode.UNKNOWN_SNAPSHOT: 404,
    ErrorCode.CANNOT_SNAPSHOT: 409,
    ErrorCode.EPISODE_DONE: 409,
    ErrorCode.CAPACITY: 503,
    ErrorCode.DRAINING: 503,
    ErrorCode.ENV_ERROR: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.INTERNAL: 500,
}


# --- the server's side --------------------------------------------------------------


class ApiError(Exception):
    """Raised by the server's handlers: answered as an error with `code`."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return STATUS[self.code]


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object (an empty body is an empty object)."""
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise ApiError(ErrorCode.BAD_JSON, f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.BAD_JSON, f"expected a JSON object, got {type(body).__name__}")
    return body


def dumps(payload: Any) -> bytes:
    """An answer's JSON, whatever text an env produced."""
    try:
        return orjson.dumps(payload, default=str, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:  # text that is not valid UTF-8 (lone surrogates) from an env
        return json.dumps(payload, default=str, ensure_ascii=False).encode(errors="replace")


def int_field(body: dict[str, Any], *names: str, default: int | None = None) -> int:
    """The first of `names` present (AgentGym spells the instance `id` or `env_idx`)."""
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(ErrorCode.BAD_REQUEST, f"`{name}` must be an integer, got {value!r}")
        return value
    if default is None:
        raise ApiError(ErrorCode.BAD_REQUEST, f"missing `{names[0]}`")
    return default


def task_field(body: dict[str, Any]) -> int:
    task = int_field(body, "data_idx", "task", default=0)
    if task < 0:
        raise ApiError(ErrorCode.BAD_REQUEST, f"`data_idx` must be >= 0, got {task}")
    return task


def action_field(body: dict[str, Any], limit: int) -> str:
    action = body.get("action")
    if not isinstance(action, str):
        raise ApiError(ErrorCode.BAD_REQUEST, f"`action` must be a string, got {action!r}"[:200])
    if len(action) > limit:
        raise ApiError(ErrorCode.ACTION_TOO_LONG, f"action of {len(action)} characters exceeds {limit}")
    return action


def env_args_field(body: dict[str, Any]) -> dict[str, Any]:
    env_args = body.get("env_args") or {}
    if not isinstance(env_args, dict):
        raise ApiError(ErrorCode.BAD_REQUEST, f"`env_args` must be an object, got {env_args!r}"[:200])
    return env_args


def request_id(body: dict[str, Any]) -> str | None:
    value = body.get("request_id")
    return None if value is None else str(value)


def observation_fields(observation: Observation) -> dict[str, Any]:
    return {"observation": observation.text, "valid_actions": observation.valid_actions}


def transition_fields(transition: Transition) -> dict[str, Any]:
    return {
        **observation_fields(transition.observation),
        "reward": transition.reward,
        "done": transition.done,
        "success": transition.success,
        "info": transition.info,
    }


# --- the client's side --------------------------------------------------------------


class EnvServerError(ThicketError):
    """The server answered with an error (HTTP status >= 400, or AgentGym's 200 + {"error": ...})."""

    def __init__(self, message: str, status: int = 200, code: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class InstanceGone(EnvServerError):
    """The server does not know the instance (restarted, reaped or closed)."""


class SnapshotGone(EnvServerError):
    """The snapshot id is no longer kept by the server (evicted, or a restart)."""


class ConnectionLost(ThicketError):
    """A request to a server that reuses instance ids failed mid-way: the instance is suspect."""


# How AgentGym's servers say that an instance id is unknown (they send no error code).
_GONE = re.compile(r"\bid\b.*\b(not valid|invalid|deleted|not found|does not exist)", re.IGNORECASE)


def loads(content: bytes) -> Any:
    """JSON from a server that may send text that is not UTF-8 (replaced, not refused)."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return orjson.loads(content.decode(errors="replace"))


def classify(payload: Any, status: int) -> EnvServerError | None:
    """The error an answer carries, if any."""
    if status < 400 and not (isinstance(payload, dict) and "error" in payload):
        return None
    body = payload if isinstance(payload, dict) else {}
    message = str(body.get("error") or body.get("detail") or payload)[:500]
    code = str(body.get("code") or "")
    if code == ErrorCode.UNKNOWN_INSTANCE or (not code and _GONE.search(message)):
        return InstanceGone(message, status, code)
    if code == ErrorCode.UNKNOWN_SNAPSHOT:
        return SnapshotGone(message, status, code)
    return EnvServerError(message, status, code)
