"""thicket.vllm_server without vLLM: reading the prefix-cache counters, failing fast where vLLM is
not installed, the logprobs mode every server is started with."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from thicket.errors import BadInput, Unavailable
from thicket.vllm_server import LOGPROBS_MODE, VLLMServer, logprobs_mode_problem, parse_prefix_cache_counters

ROOT = Path(__file__).resolve().parent.parent


def test_parse_prefix_cache_counters() -> None:
    text = (
        "# HELP vllm:prefix_cache_hits_total hits\n"
        'vllm:prefix_cache_hits_total{engine="0",model_name="m{x}"} 512.0\n'
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 128.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2000.0\n'
        'vllm:external_prefix_cache_hits_total{engine="0"} 99.0\n'
    )
    assert parse_prefix_cache_counters(text) == (640.0, 2000.0)
    assert parse_prefix_cache_counters("vllm:prefix_cache_hits_total 3\n") is None


def test_server_fails_fast_without_vllm(tmp_path: Any) -> None:
    server = VLLMServer(tmp_path, served_name="x", python=sys.executable, log_path=tmp_path / "log")
    started_at = time.perf_counter()
    with pytest.raises(Unavailable, match="exited with code 1 .*No module named 'vllm'"):
        server.start()
    assert time.perf_counter() - started_at < 10 and not server.running


# -- the logprobs mode: what every stored logprob means ---------------------------------------------


def test_the_command_line_asks_for_the_sampling_distribution_s_logprobs(tmp_path: Any) -> None:
    command = VLLMServer(tmp_path, served_name="x", python="py").command()
    assert command[command.index("--logprobs-mode") + 1] == LOGPROBS_MODE == "processed_logprobs"
    for same in (["--logprobs-mode", LOGPROBS_MODE], [f"--logprobs_mode={LOGPROBS_MODE}"]):
        command = VLLMServer(tmp_path, python="py", extra_args=[*same, "--max-model-len", "64"]).command()
        assert [a for a in command if "logprobs" in a] == ["--logprobs-mode", LOGPROBS_MODE]  # once, not repeated
        assert command[-2:] == ["--max-model-len", "64"]


@pytest.mark.parametrize("args", [["--logprobs-mode", "raw_logprobs"], ["--logprobs-mode=processed_logits"],
                                  ["--logprobs_mode", "raw_logits"], ["--logprobs", "raw_logprobs"],
                                  ["--logprobs-mode"]])
def test_extra_args_with_another_logprobs_mode_are_bad_input(tmp_path: Any, args: list[str]) -> None:
    assert logprobs_mode_problem(args) is not None
    with pytest.raises(BadInput, match="thicket sets --logprobs-mode processed_logprobs"):
        VLLMServer(tmp_path, python="py", extra_args=args)
    assert logprobs_mode_problem(["--max-logprobs", "20", "--logprobs-mode", LOGPROBS_MODE]) is None


@pytest.mark.parametrize("section", ["policy", "cluster"])
def test_validate_rejects_another_logprobs_mode_in_one_line_with_exit_2(tmp_path: Any, section: str) -> None:
    spec = yaml.safe_load((ROOT / "sweeps" / "demo.yaml").read_text())
    model = tmp_path / "model"  # validate refuses a model folder that is not there (a fresh clone has no models/)
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec["policy"]["model"] = str(model)
    if section == "policy":
        spec["policy"]["server"] = {"args": ["--max-model-len", "2048", "--logprobs-mode", "raw_logprobs"]}
        field = "policy.server.args"
    else:
        spec["cluster"]["vllm_args"] = ["--logprobs-mode=raw_logits"]
        field = "cluster.vllm_args"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    thicket = str(Path(sys.executable).parent / "thicket")
    out = subprocess.run([thicket, "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and f"{path}: {field}: --logprobs-mode raw_" in out.stderr, out.stderr
    assert "thicket sets --logprobs-mode processed_logprobs" in out.stderr
    spec["policy"]["server"] = {"args": [f"--logprobs-mode={LOGPROBS_MODE}"]}  # the same mode is fine
    spec["cluster"]["vllm_args"] = ["--logprobs-mode", LOGPROBS_MODE]
    path.write_text(yaml.safe_dump(spec))
    out = subprocess.run([thicket, "validate", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# -- the child's environment ------------------------------------------------------------------------


def test_the_child_may_write_bytecode_unless_told_not_to(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's venv (uv installs no bytecode) gets its bytecode written at the first start, whatever
    PYTHONDONTWRITEBYTECODE the caller has: else every start compiles its imports in three processes."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("THICKET_TEST_KEPT", "yes")
    env = VLLMServer(tmp_path, python="py", cpu=True)._child_env()
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["THICKET_TEST_KEPT"] == "yes" and env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["HF_HUB_OFFLINE"] == "1"
    given = VLLMServer(tmp_path, python="py", cpu=True, env={"PYTHONDONTWRITEBYTECODE": "1"})._child_env()
    assert given["PYTHONDONTWRITEBYTECODE"] == "1"


# -- what a run says about the vLLM it starts, and its log ------------------------------------------

FAKE_VLLM = '''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[sys.argv.index("-m") + 2:]
port, name = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"data": [{"id": name}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        print("fake vLLM:", *a, flush=True)
print("fake vLLM up", flush=True)
HTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


def fake_vllm_python(tmp_path: Path) -> Path:
    """An interpreter stand-in that serves /v1/models as vLLM's api_server would."""
    script = tmp_path / "fake_vllm.py"
    script.write_text(FAKE_VLLM)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    python.chmod(0o755)
    return python


def test_a_started_server_says_what_starts_where_it_logs_when_it_is_ready_and_removes_its_log(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="thicket.vllm")
    server = VLLMServer(tmp_path / "demo", served_name="demo", python=fake_vllm_python(tmp_path), cpu=True)
    with server:
        log_path = server.log_path
        assert log_path is not None and log_path.exists()
        messages = [r.getMessage() for r in caplog.records if r.name == "thicket.vllm"]
        assert messages[0] == f"starting vLLM: model {tmp_path / 'demo'} on port {server.port} (log: {log_path})"
        assert messages[1].startswith(f"vLLM ready at {server.url} after ") and messages[1].endswith(" s")
    assert not log_path.exists()  # a clean end: the temporary log is gone


def test_a_failed_server_keeps_its_log_and_names_it(tmp_path: Any) -> None:
    server = VLLMServer(tmp_path, served_name="x", python=sys.executable)  # no vLLM there: exits at once
    with pytest.raises(Unavailable, match=r"No module named 'vllm'.*\(log: .*vllm-x-.*\.log\)") as failed:
        server.start()
    assert server.log_path is not None and server.log_path.exists()
    assert str(server.log_path) in str(failed.value)
    server.log_path.unlink()


def test_a_block_that_fails_keeps_the_log_and_a_given_log_is_never_removed(tmp_path: Any) -> None:
    server = VLLMServer(tmp_path / "m", served_name="m", python=fake_vllm_python(tmp_path), cpu=True)
    with pytest.raises(RuntimeError), server:
        raise RuntimeError("the run failed")
    assert server.log_path is not None and server.log_path.exists()
    server.log_path.unlink()
    given = tmp_path / "given.log"
    with VLLMServer(tmp_path / "m", served_name="m", python=fake_vllm_python(tmp_path), cpu=True, log_path=given):
        pass
    assert given.exists()
