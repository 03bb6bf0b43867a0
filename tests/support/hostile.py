"""Hostile counterparts for the fault suite, as real servers.

`HostileModel`: an OpenAI-compatible chat server (a thread in the test process) whose replies
cycle through empty, enormous, unformatted, invalid-action and valid ones.
`HostileEnv`: an env whose observations are 1 MB long, not valid UTF-8, or full of control
characters; `python tests/support/hostile.py PORT` registers it and serves it with
`thicket serve-env`'s server (it is never registered in the test process).
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from thicket.envs import register
from thicket.envs.protocol import Observation, SyncEnv, Transition

MODEL = "hostile"
MOVES = ("left", "down", "right", "up")
REPLIES = (
    "",  # empty
    "Thought: " + "blah " * 40_000 + "\nAction: right",  # enormous (200 KB)
    "I will not follow your format, here is a poem instead.",  # no Action line
    "Thought: flying is faster\nAction: fly to the goal",  # not a valid action
    "Thought: too long\nAction: " + "x" * 10_000,  # longer than the env server accepts
    "Thought: go\nAction: right",
    "Thought: go\nAction: down",
)


class _ModelHandler(BaseHTTPRequestHandler):
    server: HostileModel

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._send({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        choices = [
            {"index": i, "message": {"role": "assistant", "content": self.server.next_reply()}, "finish_reason": "stop"}
            for i in range(int(body.get("n", 1)))
        ]
        self._send({"id": "x", "object": "chat.completion", "model": MODEL, "choices": choices,
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def _send(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class HostileModel(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ModelHandler)
        self._replies = itertools.cycle(REPLIES)
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def next_reply(self) -> str:
        with self._lock:
            return next(self._replies)

    def __enter__(self) -> HostileModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


HUGE = "ice " * 262_144  # 1 MiB
INVALID_UTF8 = b"caf\xc3\xa9 \xff\xfe broken bytes".decode("utf-8", "surrogateescape")
CONTROL = "\x00\x1b[31mred\x1b[0m \x07bell\x08 \x0cform\x7f"


class HostileEnv(SyncEnv):
    """Walk right three times to succeed; every observation is hostile in its own way."""

    family = "hostile"
    can_snapshot = True

    def __init__(self) -> None:
        self.position = 0

    @property
    def instructions(self) -> str:
        return "Move right three times. Actions: left, down, right, up."

    def _observation(self) -> Observation:
        text = (HUGE, INVALID_UTF8, CONTROL)[self.position % 3]
        return Observation(f"position {self.position}: {text}", MOVES)

    def reset_sync(self, task: int) -> Observation:
        self.position = 0
        return self._observation()

    def step_sync(self, action: str) -> Transition:
        if action not in MOVES:
            return Transition(Observation("Invalid action.", MOVES), 0.0, False)
        self.position += action == "right"
        solved = self.position >= 3
        return Transition(self._observation(), 1.0 if solved else 0.0, solved, solved)

    def snapshot_sync(self) -> int:
        return self.position

    def restore_sync(self, state: int) -> None:
        self.position = state


if __name__ == "__main__":
    from thicket.envs.server import serve
    from thicket.envs.service import ServerConfig

    register("hostile")(HostileEnv)  # in the server process only: the suite's env list stays as it is
    serve(ServerConfig(("hostile",), port=int(sys.argv[1]), max_body_bytes=1 << 20))
