"""Rendering a 100,000-task sweep to Kubernetes manifests (goal: well under 1 s).

    .venv/bin/python bench/render.py

Times spec validation, `render` (with the API-rule self-check) and the YAML dump, for 10,000
indexes (per_index 10) and for 100,000 indexes (per_index 1, the most one Indexed Job takes with
per-index retries), best of 5 runs each.
"""

from __future__ import annotations

import time

from thicket.k8s.render import render, to_yaml
from thicket.spec import parse_spec


def spec_data(per_index: int) -> dict:
    return {
        "name": "bench-100k",
        "tasks": {"env": "textcraft", "start": 0, "stop": 100_000, "per_index": per_index},
        "search": {"algorithm": "mcts", "iterations": 30, "expansions": 4, "max_depth": 20},
        "policy": {"kind": "vllm", "model": "meta-llama/Llama-3.1-8B-Instruct", "concurrency": 128},
        "output": "s3://datasets/rollouts",
        "cluster": {"parallelism": 64, "gpus": 1, "max_failed_indexes": 1000},
    }


def main() -> None:
    parse_spec(spec_data(10))  # imports and env registry, once
    for per_index in (10, 1):
        best = None
        for _ in range(5):
            t0 = time.perf_counter()
            spec = parse_spec(spec_data(per_index))
            t1 = time.perf_counter()
            objects = render(spec)
            t2 = time.perf_counter()
            text = to_yaml(objects)
            t3 = time.perf_counter()
            run = (t1 - t0, t2 - t1, t3 - t2, t3 - t0)
            best = run if best is None or run[3] < best[3] else best
        completions = next(o for o in objects if o["kind"] == "Job")["spec"]["completions"]
        validate, build, dump, total = best
        print(f"100,000 tasks, {completions:>6} indexes: validate {validate * 1e3:6.1f} ms  render {build * 1e3:6.1f} ms  "
              f"yaml {dump * 1e3:6.1f} ms  total {total * 1e3:6.1f} ms  ({len(objects)} objects, {len(text):,} bytes)")


if __name__ == "__main__":
    main()
