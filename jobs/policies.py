"""The spec's policy section -> a running Policy (starting a local vLLM if asked)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from thicket.errors import BadInput
from thicket.policy.base import Policy
from thicket.policy.openai import OpenAIConfig, OpenAIPolicy
from thicket.policy.uniform import UniformPolicy
from thicket.spec import PolicySpec
from thicket.vllm_server import VLLMServer


@dataclass
class ServedPolicy:
    policy: Policy
    model_name: str  # recorded in every shard row
    base_url: str | None  # the OpenAI-compatible server, where there is one


def openai_policy(spec: PolicySpec, base_url: str, model: str) -> OpenAIPolicy:
    return OpenAIPolicy(
        OpenAIConfig(
        base_url=base_url,
        model=model,
        temperature=spec.temperature,
        top_p=spec.top_p,
        max_tokens=spec.max_tokens,
        constrain_actions=spec.constrain_actions,
        max_thought_chars=spec.max_thought_chars,
        concurrency=spec.concurrency,
        timeout_s=spec.timeout_s,
        max_retries=spec.max_retries,
        )
    )


@contextlib.asynccontextmanager
async def serve_policy(spec: PolicySpec) -> AsyncIterator[ServedPolicy]:
    """Yield a started policy; a vLLM server started here is stopped on exit."""
    if spec.kind == "uniform":
        yield ServedPolicy(UniformPolicy(latency_s=spec.latency_s, concurrency=spec.concurrency), "uniform", None)
        return
    if not spec.launches_server:
        assert spec.url is not None and spec.model is not None
        policy = openai_policy(spec, spec.url, spec.model)
        await policy.start()
        try:
            yield ServedPolicy(policy, spec.model, spec.url)
        finally:
            await policy.close()
        return
    assert spec.model is not None
    folder = Path(spec.model)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise BadInput(
            f"policy.model: {spec.model!r} is not a local model folder (no config.json); "
            "build the demo model with `thicket make-model models/tiny`, or give policy.url"
        )
    server = VLLMServer(
        model=str(folder),
        served_name=folder.name,
        port=spec.server.port,
        extra_args=spec.server.args,
        startup_timeout_s=spec.server.startup_timeout_s,
        python=spec.server.python,
    )
    async with server:
        policy = openai_policy(spec, server.url, server.served_name)
        await policy.start()
        try:
            yield ServedPolicy(policy, folder.name, server.url)
        finally:
            await policy.close()
