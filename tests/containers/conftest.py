"""The images, built once a session, and `thicket rehearse` run from the repository root."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thicket.k8s.rehearsal import Images

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
POD_IMAGES = "worker env vllm-cpu s3-local"


@pytest.fixture(scope="session")
def images() -> Images:
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: .ci/run installs it (../shared/podman/setup.sh)", pytrace=False)
    started = time.monotonic()
    done = subprocess.run(["make", "images", f"IMAGES={POD_IMAGES}", "DOCKER=podman"], cwd=ROOT,
                          capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"make images ({POD_IMAGES}): {time.monotonic() - started:.0f} s\n{done.stdout}")
    from thicket import __version__

    return Images.local(__version__)


def rehearse(spec: Path, workdir: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run([THICKET, "rehearse", str(spec), "--workdir", str(workdir), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    print(f"thicket rehearse: exit {done.returncode} after {time.monotonic() - started:.0f} s\n{done.stdout}{done.stderr}")
    return done
