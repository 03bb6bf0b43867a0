"""A spec that validates can run: `validate` and `render` ask the env whether it lists valid
actions when the policy is uniform (which picks among them), against real servers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.agentgym_textcraft import agentgym_textcraft
from tests.support.env_server import started
from tests.support.s3_server import free_port

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
MODEL_POLICY = "{kind: openai, url: 'http://127.0.0.1:9/v1', model: m}"


def thicket(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([THICKET, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=os.environ)


def spec_file(tmp_path: Path, env_server: str, policy: str = "{kind: uniform}", env: str = "textcraft") -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(
        f"name: probe\ntasks: {{env: {env}, start: 0, stop: 2, env_server: {env_server}}}\n"
        f"search: {{algorithm: sample}}\npolicy: {policy}\noutput: {tmp_path}\n"
    )
    return str(path)


def one_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_uniform_against_an_agentgym_textcraft_server_is_refused_by_validate_and_render(tmp_path):
    with agentgym_textcraft() as url:
        remote = f"{{mode: remote, url: '{url}', adapter: agentgym}}"
        for command in ("validate", "render"):
            line = one_error(thicket(command, spec_file(tmp_path, remote)))
            assert "policy.kind: uniform" in line and f"agentgym env server at {url}" in line and "lists none" in line
        with_model = spec_file(tmp_path, remote, MODEL_POLICY)
        assert thicket("validate", with_model).returncode == 0  # a model writes its own actions
        line = one_error(thicket("validate", with_model, "--policy", "uniform"))  # as `run --policy uniform`
        assert "lists none" in line


@pytest.mark.parametrize(("env", "env_server", "ok"), [
    ("textcraft", "{mode: in_process}", True),  # thicket's TextCraft lists its actions
    ("math", "{mode: in_process}", False),  # free-text answers: no list
])
def test_uniform_is_checked_against_the_family_in_process(tmp_path, env, env_server, ok):
    result = thicket("validate", spec_file(tmp_path, env_server, env=env))
    if ok:
        assert result.returncode == 0 and "ok" in result.stdout, result.stderr
    else:
        assert "env math lists none" in one_error(result)


def test_uniform_against_thickets_own_server_passes_and_an_unreachable_one_is_a_note(tmp_path):
    server = started(["textcraft"])
    try:
        result = thicket("validate", spec_file(tmp_path, f"{{mode: remote, url: '{server.url}'}}"))
        assert result.returncode == 0 and "note" not in result.stderr, result.stderr
    finally:
        server.stop()
    nobody = f"{{mode: remote, url: 'http://127.0.0.1:{free_port()}'}}"
    result = thicket("validate", spec_file(tmp_path, nobody))
    assert result.returncode == 0, result.stderr
    assert "note: could not ask whether the thicket env server" in result.stderr
