"""podman, as the rehearsal uses it: one-line errors for its commands, the images and network a
rehearsal needs, and the local S3 (moto_server in a container) its pods write to."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

from thicket.errors import BadInput, ThicketError, Unavailable

S3_PORT = 5000
S3_ACCESS = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal", "AWS_DEFAULT_REGION": "us-east-1"}
NO_PODMAN = "thicket rehearse needs podman (apt-get install podman), not found on PATH"


@dataclass(frozen=True)
class LocalS3:
    """moto_server in a container on the pods' network."""

    container: str
    host_url: str  # from this machine (thicket pull)
    pod_url: str  # from the pods
    bucket: str


# -- podman --------------------------------------------------------------------------------------
def podman(*args: str, timeout: float = 600, stdin: str | None = None) -> str:
    try:
        done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, input=stdin)
    except FileNotFoundError:
        raise BadInput(NO_PODMAN) from None
    except subprocess.TimeoutExpired:
        raise Unavailable(f"podman {args[0]} did not answer in {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        raise ThicketError(f"podman {' '.join(args[:2])} failed: {lines[-1]}")
    return done.stdout


def require_images(images: list[str]) -> None:
    if shutil.which("podman") is None:
        raise BadInput(NO_PODMAN)
    missing = [image for image in images if subprocess.run(
        ["podman", "image", "exists", image], capture_output=True).returncode != 0]
    if missing:
        raise BadInput(f"image {missing[0]} is not built here: run `make images` first")


def ensure_network(name: str) -> None:
    """The pods' and the local S3's bridge network (a fresh podman has none until asked)."""
    if subprocess.run(["podman", "network", "exists", name], capture_output=True).returncode != 0:
        podman("network", "create", name)


# -- the local S3 ----------------------------------------------------------------------------------
def start_s3(image: str, network: str, bucket: str, name: str = "thicket-rehearsal-s3") -> LocalS3:
    """moto_server in a container (reused when running and answering), its port published on
    127.0.0.1 only."""
    running = podman("ps", "--filter", f"name=^{name}$", "--format", "{{.Names}}").split()
    if name in running and not _published_port_answers(name):
        running = []  # its port forwarding is gone (the host's network was reset): start it again
    if name not in running:
        podman("rm", "--force", "--ignore", name)
        podman("run", "--detach", "--name", name, "--network", network, "--publish", f"127.0.0.1::{S3_PORT}", image)
    host_port = podman("port", name, str(S3_PORT)).strip().rsplit(":", 1)[-1]
    address = podman("inspect", name, "--format", f'{{{{(index .NetworkSettings.Networks "{network}").IPAddress}}}}')
    s3 = LocalS3(name, f"http://127.0.0.1:{host_port}", f"http://{address.strip()}:{S3_PORT}", bucket)
    _make_bucket(s3)
    return s3


def _published_port_answers(container: str) -> bool:
    host_port = podman("port", container, str(S3_PORT)).strip().rsplit(":", 1)[-1]
    try:
        socket.create_connection(("127.0.0.1", int(host_port)), timeout=2).close()
        return True
    except (OSError, ValueError):
        return False


def _make_bucket(s3: LocalS3, deadline_s: float = 60) -> None:
    import boto3
    import botocore.exceptions

    client = boto3.client("s3", endpoint_url=s3.host_url, aws_access_key_id=S3_ACCESS["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=S3_ACCESS["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
    until = time.monotonic() + deadline_s
    while True:
        try:
            client.create_bucket(Bucket=s3.bucket)
            return
        except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            return
        except botocore.exceptions.EndpointConnectionError:
            if time.monotonic() > until:
                raise Unavailable(f"the local S3 at {s3.host_url} did not start in {deadline_s:.0f} s: "
                                  f"podman logs {s3.container}") from None
            time.sleep(0.5)


def s3_secret(name: str, s3: LocalS3) -> None:
    """The cluster.s3_secret Secret as a podman secret: JSON of base64 values, as podman 4.3 reads it."""
    data = {**S3_ACCESS, "AWS_ENDPOINT_URL": s3.pod_url}
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    if name in podman("secret", "ls", "--format", "{{.Name}}").split():
        podman("secret", "rm", name)
    podman("secret", "create", name, "-", stdin=json.dumps(encoded))
