"""The images: the Dockerfiles (uid 1000, no build tools, pinned bases, the lock files they
install), and `make images` / `make push` with a stand-in container engine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from thicket import __version__
from thicket.cluster_spec.cluster import ClusterSpec

ROOT = Path(__file__).resolve().parent.parent


def _final_stages(text: str) -> dict[str, str]:
    """A Dockerfile's stages by name, each its own text."""
    parts = re.split(r"^FROM ", text, flags=re.M)[1:]
    return {re.search(r" AS (\S+)", p.splitlines()[0]).group(1) if " AS " in p.splitlines()[0] else "": p for p in parts}


def test_images_run_as_uid_1000_without_build_tools_on_pinned_bases():
    stages = _final_stages((ROOT / "docker" / "thicket.Dockerfile").read_text())
    for target in ("worker", "env", "env-java"):
        assert re.findall(r"^USER (\S+)", stages[target], re.M) == ["1000:1000"], target
        assert "build-essential" not in stages[target] and "gcc" not in stages[target], target
    assert 'ENTRYPOINT ["thicket"]' in stages["runtime"] and "useradd --uid 1000" in stages["runtime"]
    assert "build-essential" in stages["env-deps"]  # compilers in a build stage only
    assert "openjdk-17-jre-headless" in stages["env-java"]
    for name in ("thicket.Dockerfile", "vllm-cpu.Dockerfile", "s3-local.Dockerfile"):
        text = (ROOT / "docker" / name).read_text()
        base = re.search(r"^ARG PYTHON_IMAGE=(\S+)", text, re.M).group(1)
        assert re.fullmatch(r"docker\.io/library/python:3\.11\.\d+-slim-bookworm", base), (name, base)
        if name == "vllm-cpu.Dockerfile":
            # Like upstream vllm/vllm-openai: root, no user for uid 1000; the pod spec supplies the rest.
            assert not re.findall(r"^USER ", text, re.M) and "useradd" not in text and "HOME=" not in text
        else:
            assert re.findall(r"^USER (\S+)", text, re.M)[-1] == "1000:1000", name
        for lock in re.findall(r"requirements/[\w-]+\.txt", text):
            assert (ROOT / lock).is_file(), (name, lock)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".venv-*", "tests", "out", "models"} <= set(ignored)


def _fake_engine(tmp_path: Path, fail: str | None = None) -> Path:
    """A stand-in for podman/docker that records its calls: `build` writes an image id, `image
    inspect` answers a size, `tag` records the tag; `build` of the target/file `fail` exits 1."""
    engine = tmp_path / "engine"
    engine.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {tmp_path}/calls
case $1 in
  build) [[ -n "{fail or ''}" && "$*" == *"{fail or 'never'}"* ]] && {{ echo "boom" >&2; exit 1; }}
         while [ $# -gt 0 ]; do [ "$1" = --iidfile ] && echo "sha256:$RANDOM" > "$2"; shift; done ;;
  image) echo 123000000 ;;
esac
""")
    engine.chmod(0o755)
    return engine


def test_make_images_tags_every_image_with_the_version_the_spec_defaults_to(tmp_path):
    engine = _fake_engine(tmp_path)
    run = subprocess.run(["make", "images", f"DOCKER={engine}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env={**os.environ, "LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode == 0, run.stderr
    tags = [line.split()[-1] for line in (tmp_path / "calls").read_text().splitlines() if line.startswith("tag ")]
    images = ClusterSpec().images
    assert {images.worker, images.env, images.env_java, images.prefetch} <= set(tags)
    assert all(tag.endswith(":" + __version__) for tag in tags) and len(tags) == 6
    assert re.search(r"^  worker +123 MB +\d+ s$", run.stdout, re.M), run.stdout  # size and build time


def test_make_images_tags_nothing_when_one_build_fails(tmp_path):
    engine = _fake_engine(tmp_path, fail="--target env ")
    run = subprocess.run(["make", "images", f"DOCKER={engine}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={**os.environ, "LOG_DIR": str(tmp_path / "logs")})
    assert run.returncode != 0
    assert re.search(r"make images: the env image failed to build after \d+ s; log: \S+/env\.log", run.stderr)
    assert "boom" in (tmp_path / "logs" / "env.log").read_text()
    assert not [line for line in (tmp_path / "calls").read_text().splitlines() if line.startswith("tag ")]


def test_make_push_pushes_each_image_s_version_tag(tmp_path):
    engine = _fake_engine(tmp_path)
    run = subprocess.run(["make", "push", f"DOCKER={engine}", "REGISTRY=registry.example/team"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    pushed = [line.split()[-1] for line in (tmp_path / "calls").read_text().splitlines() if line.startswith("push ")]
    names = ("thicket", "thicket-env", "thicket-env-java", "thicket-prefetch", "thicket-vllm-cpu", "thicket-s3-local")
    assert pushed == [f"registry.example/team/{name}:{__version__}" for name in names]


def test_make_images_without_an_engine_says_so(tmp_path):
    run = subprocess.run(["make", "images", "DOCKER="], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "make images: no container engine" in run.stderr
