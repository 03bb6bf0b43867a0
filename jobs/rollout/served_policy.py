"""The spec's policy section -> a running Policy (starting a local vLLM if asked)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from thicket.errors import BadInput
from thicket.policy.base import DEFAULT_CONCURRENCY, Policy
from thicket.policy.inflight import InFlightTuner, serves_load_metrics
from thicket.policy.openai import OpenAIConfig, OpenAIPolicy
from thicket.policy.uniform import UniformPolicy
from thicket.spec import PolicySpec
from thicket.spec_notes import model_folder_hint
from thicket.vllm_server import VLLMServer, metrics_url

log = logging.getLogger("thicket.policies")

# A policy server silent this long at start-up gets a line saying what is waited for, and how long.
QUIET_WAIT_S = 1.0

# concurrency: auto starts this many requests in flight and lets the tuner go up to the ceiling.
AUTO_FIRST, AUTO_CEILING = 16, 1024


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
        concurrency=AUTO_FIRST if spec.concurrency == "auto" else spec.concurrency,
        concurrency_ceiling=AUTO_CEILING if spec.concurrency == "auto" else None,
        timeout_s=spec.timeout_s,
        max_retries=spec.max_retries,
        retry_deadline_s=spec.retry_deadline_s,
        startup_connect_s=spec.startup_connect_s,
        render_once=spec.render_once,
        url_field="policy.url" if spec.url else "the vLLM server started for policy.model",
        )
    )


@contextlib.asynccontextmanager
async def started(spec: PolicySpec, base_url: str, model: str) -> AsyncIterator[OpenAIPolicy]:
    """A started OpenAI-compatible policy; with `concurrency: auto` its requests in flight
    are tuned from the server's load while it is in use."""
    policy = openai_policy(spec, base_url, model)
    await start_saying_what_it_waits_for(policy, spec, base_url)
    try:
        if spec.concurrency != "auto":
            yield policy
        elif await serves_load_metrics(metrics_url(base_url)):
            async with InFlightTuner(metrics_url(base_url), policy.slots).running():
                yield policy
        else:
            log.info("no vLLM load gauges at %s: keeping %d requests in flight", metrics_url(base_url),
                     DEFAULT_CONCURRENCY)
            policy.slots.set_limit(DEFAULT_CONCURRENCY)
            yield policy
    finally:
        await policy.close()


async def start_saying_what_it_waits_for(policy: OpenAIPolicy, spec: PolicySpec, base_url: str) -> None:
    """policy.start(), with a line once the server has not answered for QUIET_WAIT_S (an
    unreachable URL is given up only after startup_connect_s: a minute of silence otherwise)."""
    starting = asyncio.ensure_future(policy.start())
    done, _ = await asyncio.wait({starting}, timeout=QUIET_WAIT_S)
    if not done:
        log.info("waiting up to %g s for the policy server at %s", spec.startup_connect_s, base_url,
                 extra={"url": base_url, "seconds": spec.startup_connect_s})
    try:
        await starting
    except BaseException:
        starting.cancel()
        await policy.close()
        raise


@contextlib.asynccontextmanager
async def serve_policy(spec: PolicySpec) -> AsyncIterator[ServedPolicy]:
    """Yield a started policy; a vLLM server started here is stopped on exit."""
    if spec.kind == "uniform":
        concurrency = DEFAULT_CONCURRENCY if spec.concurrency == "auto" else spec.concurrency
        yield ServedPolicy(UniformPolicy(latency_s=spec.latency_s, concurrency=concurrency), "uniform", None)
        return
    if not spec.launches_server:
        assert spec.url is not None and spec.model is not None
        async with started(spec, spec.url, spec.model) as policy:
            yield ServedPolicy(policy, spec.model, spec.url)
        return
    assert spec.model is not None
    folder = Path(spec.model)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise BadInput(
            f"policy.model: {spec.model!r} is not a local model folder (no config.json); "
            f"{model_folder_hint(spec.model)}, or give policy.url"
        )
    server = VLLMServer(
        model=str(folder),
        served_name=folder.name,
        port=spec.server.port,
        extra_args=spec.server.args,
        startup_timeout_s=spec.server.startup_timeout_s,
        python=spec.server.python,
    )
    async with server, started(spec, server.url, server.served_name) as policy:
        yield ServedPolicy(policy, folder.name, server.url)
