"""Image sizes and clean build times (`make images` with no cache), and the pod rehearsal's wall time.

    .venv/bin/python bench/images.py [--images "worker env"] [--cached] [--no-pod-demo]

Sizes are as the engine reports them, and as layers above the base (the development machines build
on a stand-in for python:3.11-slim that is larger than the official one: add the official base's
size to the layers to compare with a target). The pod-demo row is `thicket rehearse` of
sweeps/demo.yaml's index 0, models/tiny, through the aggregation pod.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THICKET = str(Path(sys.executable).parent / "thicket")


def base_image() -> str:
    text = (ROOT / "docker" / "thicket.Dockerfile").read_text()
    return re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M).group(1)


def size_mb(image: str) -> float:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", image],
                         capture_output=True, text=True, check=True).stdout
    return int(out) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", default="worker env env-java vllm-cpu s3-local")
    parser.add_argument("--cached", action="store_true", help="Reuse the engine's layer cache.")
    parser.add_argument("--no-pod-demo", action="store_true")
    args = parser.parse_args()
    env = {**os.environ, **({} if args.cached else {"NO_CACHE": "1"})}
    done = subprocess.run(["make", "images", f"IMAGES={args.images}"], cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(done.stderr.strip().splitlines()[-1])
    base = size_mb(base_image())
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; base {base_image()}: {base:.0f} MB")
    print(f"{'image':<10} {'size MB':>8} {'layers MB':>10} {'build s':>8}")
    for line in done.stdout.splitlines():
        match = re.match(r"^  (\S+) +(\d+) MB +(\d+) s$", line)
        if match:
            name, size, seconds = match.group(1), int(match.group(2)), int(match.group(3))
            print(f"{name:<10} {size:>8} {size - base:>10.0f} {seconds:>8}")
    if not args.no_pod_demo:
        started = time.monotonic()
        run = subprocess.run([THICKET, "rehearse", "sweeps/demo.yaml", "--index", "0"], cwd=ROOT,
                             capture_output=True, text=True)
        print(f"pod-demo (rollout pod of index 0 + aggregation pod): exit {run.returncode}, "
              f"{time.monotonic() - started:.0f} s")
        for line in run.stdout.splitlines():
            if line.startswith("pod "):
                print(f"  {line}")


if __name__ == "__main__":
    main()
