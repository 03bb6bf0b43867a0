"""Shard upload throughput to a local S3 server (moto_server): through S3Store.put versus a plain
boto3 put_object of the same bytes. Goal: the store at >= 0.9x the plain client for shard sizes.
    .venv/bin/python bench/s3_upload.py [--sizes-mib 0.25,2,16,64] [--big-mib 160] [--mib-per-size 96]
The last row (--big-mib, 0 to skip) is past the store's multipart threshold: it goes up in parallel
parts, which a real network rewards and a local one-process server does not; it is shown, not judged.
Each repetition alternates the two clients, and the median time counts, to damp a noisy machine.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import httpx

from thicket.storage.s3 import MULTIPART_THRESHOLD, S3Store

MiB = 2**20
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    moto = str(Path(sys.executable).parent / "moto_server")
    command = [moto, "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(endpoint, timeout=1)
            return server, endpoint
        except httpx.HTTPError:
            time.sleep(0.05)
    server.kill()
    raise SystemExit("moto_server did not start")


def seconds(upload: Callable[[], object]) -> float:
    started = time.perf_counter()
    upload()
    return time.perf_counter() - started


def compare(store: S3Store, plain, bucket: str, size: int, reps: int) -> tuple[float, float]:
    """Median seconds per upload: (store, plain boto3)."""
    data = os.urandom(size)
    store_times, plain_times = [], []
    for rep in range(reps):
        store_times.append(seconds(lambda: store.put(f"store/{size}/{rep}", data)))
        plain_times.append(seconds(lambda: plain.put_object(Bucket=bucket, Key=f"plain/{size}/{rep}", Body=data)))
    return statistics.median(store_times), statistics.median(plain_times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mib", default="0.25,2,16,64", help="shard sizes to upload, in MiB")
    parser.add_argument("--big-mib", type=float, default=160, help="one object past the multipart threshold")
    parser.add_argument("--mib-per-size", type=float, default=96, help="bytes uploaded per size and client")
    args = parser.parse_args()
    server, endpoint = start_moto()
    os.environ.update(CREDENTIALS | {"AWS_ENDPOINT_URL": endpoint})
    try:
        plain = boto3.client("s3")
        plain.create_bucket(Bucket="bench")
        store = S3Store("s3://bench/sweep")
        print(f"local S3 server: moto_server at {endpoint}; multipart from {MULTIPART_THRESHOLD // MiB} MiB")
        print(f"{'shard':>9} {'reps':>5} {'store MB/s':>11} {'boto3 MB/s':>11} {'ratio':>6}")
        sizes = [float(s) for s in args.sizes_mib.split(",")] + ([args.big_mib] if args.big_mib else [])
        for size in (int(mib * MiB) for mib in sizes):
            reps = max(3, int(args.mib_per_size * MiB // size))
            store_s, plain_s = compare(store, plain, "bench", size, reps)
            kind = "multipart" if size >= MULTIPART_THRESHOLD else ""
            print(f"{size / MiB:>6.2f}MiB {reps:>5} {size / store_s / 1e6:>11.1f} {size / plain_s / 1e6:>11.1f} "
                  f"{plain_s / store_s:>5.2f}x {kind}")
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
