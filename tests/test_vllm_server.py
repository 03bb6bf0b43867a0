"""thicket.vllm_server without vLLM: reading the prefix-cache counters, failing fast where vLLM is
not installed."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

from thicket.errors import Unavailable
from thicket.vllm_server import VLLMServer, parse_prefix_cache_counters


def test_parse_prefix_cache_counters() -> None:
    text = (
        "# HELP vllm:prefix_cache_hits_total hits\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m{x}"} 512.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 128.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2000.0\n'
        'vllm:external_prefix_cache_hits_total{engine="0"} 99.0\n'
    )
    assert parse_prefix_cache_counters(text) == (640.0, 2000.0)
    assert parse_prefix_cache_counters("vllm:prefix_cache_hits_total 3\n") is None


def test_server_fails_fast_without_vllm(tmp_path: Any) -> None:
    server = VLLMServer(tmp_path, served_name="x", python=sys.executable, log_path=tmp_path / "log")
    started_at = time.perf_counter()
    with pytest.raises(Unavailable, match="exited with code 1 .*No module named 'vllm'"):
        server.start()
    assert time.perf_counter() - started_at < 10 and not server.running
