"""Fixtures of the Kubernetes tests."""

from __future__ import annotations

import os
import sys

import pytest

from tests.support.fake_kube import FakeKube, serve, write_kubeconfig


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    """A fake API server (real HTTP) with what `submit` checks first (the S3 Secret, the model-cache
    PVC), whose prefetch Jobs complete at once, and a kubeconfig pointing at it in KUBECONFIG (also as `fake.kubeconfig`)."""
    fake = FakeKube()
    fake.put("secrets", {"metadata": {"name": "thicket-s3", "namespace": "thicket"},
                         "data": {"AWS_ACCESS_KEY_ID": "a2V5", "AWS_SECRET_ACCESS_KEY": "c2VjcmV0"}})
    fake.put("persistentvolumeclaims", {"metadata": {"name": "thicket-models", "namespace": "thicket"}})
    fake.job_ends["prefetch"] = "Complete"  # the model is in the cache at once
    fake.put("localqueues", {"metadata": {"name": "gpu", "namespace": "thicket"}})  # Kueue's, for cluster.queue: gpu
    with serve(fake) as url:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", url)))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        fake.kubeconfig = os.environ["KUBECONFIG"]
        yield fake


@pytest.fixture()
def cli(monkeypatch, capsys):
    """Run `thicket ARGS...` in this process (as main() does: one-line errors, exit codes)."""
    from thicket.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["thicket", *args])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err

    return run
