"""The settings of a policy served by an OpenAI-compatible server: what its requests sample
(request_bodies.py), how it talks to the server (server_connection.py) and how many
requests it keeps in flight (openai.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OpenAIConfig:
    base_url: str  # ends with the API root, e.g. http://127.0.0.1:8000/v1
    model: str
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    constrain_actions: bool = False
    max_thought_chars: int = 0  # constrained thoughts: at most this many characters (0: a line of any length)
    concurrency: int = 64  # requests in flight (where the limit moves: the first limit)
    concurrency_ceiling: int | None = None  # where an InFlightTuner moves it: the highest it goes
    timeout_s: float = 120.0
    max_retries: int = 4  # 5xx answers
    retry_deadline_s: float = 300.0  # connection errors (a restarting server) are retried this long
    startup_connect_s: float = 60.0  # start(): nothing listening this long means a wrong URL (BadInput)
    url_field: str = "policy.url"  # what points here, named in start()'s errors
    retry_backoff_s: float = 0.5
    api_key: str | None = None
    action_max_tokens: int = 64  # unconstrained act(): the action is one line
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every request
    render_once: bool = True  # a server with /tokenize renders each prompt once, its samples go to /completions
