"""Bad input, one row per case: every malformed spec or command line exits 2 with one line.

Each case is a spec (YAML text, written to a file) and/or a command line, run through the real
CLI (`thicket.cli.main`, in this process; a few also through the installed `thicket` in a child
process). Every case must exit 2 and print exactly one non-empty stderr line, `error: ...`, that
names the field or value at fault, with no traceback and no log lines. Servers are real: a port
where nothing listens, a host name that cannot resolve (.invalid), an OpenAI-compatible server
that serves another model, a moto S3 server.

In specs and arguments, `$tmp` is the test's folder, `$spec` the spec file, `$dead` an http URL
where nothing listens, `$models` the OpenAI-compatible server, `$s3` the S3 endpoint and
`$bucket` a fresh empty bucket on it.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

import pytest

from tests.support.http_stub import QuietHandler, serving
from thicket import cli

THICKET = str(Path(sys.executable).parent / "thicket")
AKIA = "AKIAIOSFODNN7EXAMPLE"  # AWS's documented example key id
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"  # AWS's documented example secret

BASE = """\
name: bad-input
tasks: {env: textcraft, start: 0, stop: 4, per_index: 2, env_server: {mode: in_process}}
search: {algorithm: sample, samples: 2, max_depth: 3}
policy: {kind: uniform}
output: $tmp/out
run: {progress: false}
"""
S3_STORAGE = "storage: {access_key_id_env: THICKET_TEST_KEY_ID, secret_access_key_env: THICKET_TEST_SECRET}\n"
S3_KEYS = {"THICKET_TEST_KEY_ID": "testing", "THICKET_TEST_SECRET": "testing"}


def variant(old: str, new: str) -> str:
    """BASE with one piece replaced (the piece must be there)."""
    assert old in BASE, old
    return BASE.replace(old, new)


@dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    needle: str  # the one error line contains it
    spec: str | None = None  # YAML text written to $spec
    env: dict[str, str | None] = field(default_factory=dict)  # None: unset
    needs: tuple[str, ...] = ()  # fixtures: "models_server", "s3_server"
    absent: str | None = None  # must appear nowhere in the output (a pasted secret)


RUN = ("run", "$spec", "--no-aggregate")

CASES = [
    # -- wrong types ---------------------------------------------------------------------------
    Case("string-for-int", RUN, "tasks.stop: Input should be a valid integer", variant("stop: 4", "stop: four")),
    Case("list-for-mapping", RUN, "tasks: Input should be a valid dictionary",
         variant("tasks: {env: textcraft, start: 0, stop: 4, per_index: 2, env_server: {mode: in_process}}",
                 "tasks: [textcraft, 0, 4]")),
    Case("bool-for-int", RUN, "tasks.per_index: Input should be a valid integer (got True)",
         variant("per_index: 2", "per_index: true")),
    Case("bool-for-number", RUN, "policy.temperature: Input should be a valid number (got True)",
         variant("{kind: uniform}", "{kind: uniform, temperature: true}")),
    Case("string-for-mapping", RUN, "search: Input should be a valid dictionary",
         variant("{algorithm: sample, samples: 2, max_depth: 3}", "sample")),
    # -- unknown names -------------------------------------------------------------------------
    Case("unknown-env", RUN, "tasks.env: unknown env 'nethack'", variant("env: textcraft", "env: nethack")),
    Case("unknown-algorithm", RUN, "search.algorithm: 'bfs' is not one of", variant("algorithm: sample", "algorithm: bfs")),
    Case("unknown-policy-kind", RUN, "policy.kind: Input should be 'vllm', 'openai' or 'uniform'",
         variant("kind: uniform", "kind: gpt")),
    Case("unknown-field", RUN, "tasks.per_idx: unknown field", variant("per_index: 2", "per_idx: 2")),
    Case("unknown-top-level-field", RUN, "sede: unknown field", BASE + "sede: 3\n"),
    Case("missing-required-field", RUN, "output: required field is missing", variant("output: $tmp/out\n", "")),
    # -- task ranges ---------------------------------------------------------------------------
    Case("empty-range", RUN, "tasks: stop (4) must be greater than start (4)", variant("start: 0", "start: 4")),
    Case("reversed-range", RUN, "tasks: stop (4) must be greater than start (9)", variant("start: 0", "start: 9")),
    Case("negative-start", RUN, "tasks.start: Input should be greater than or equal to 0 (got -1)",
         variant("start: 0", "start: -1")),
    Case("indices-garbage", (*RUN, "--indices", "two-three"), "--indices: expected task indices", BASE),
    Case("indices-reversed", (*RUN, "--indices", "3-1"), "--indices: range 3-1 is reversed", BASE),
    Case("indices-outside-range", (*RUN, "--indices", "2-9"), "--indices: 2-9 is outside the spec's tasks 0-3", BASE),
    # -- names and outputs ---------------------------------------------------------------------
    Case("name-uppercase", RUN, "name: 'Bad-Input' is not a DNS-1123 label",
         variant("name: bad-input", "name: Bad-Input")),
    Case("name-too-long", RUN, f"name: '{'a' * 64}' is not a DNS-1123 label",
         variant("name: bad-input", f"name: {'a' * 64}")),
    Case("name-underscore", RUN, "name: 'bad_input' is not a DNS-1123 label",
         variant("name: bad-input", "name: bad_input")),
    Case("output-unsupported-scheme", RUN, "output: unsupported URI scheme 'gs'",
         variant("output: $tmp/out", "output: gs://bucket/x")),
    Case("output-bad-bucket", (*RUN, "--output", "s3://A_B"), "output: 'A_B' is not a valid S3 bucket name", BASE),
    Case("output-empty", (*RUN, "--output", ""), "output: expected a non-empty path or URI", BASE),
    Case("policy-url-not-http", RUN, "policy.url: expected an http(s) URL",
         variant("{kind: uniform}", "{kind: openai, model: m, url: 'localhost:8000/v1'}")),
    Case("policy-openai-without-model", RUN, "policy: kind openai needs both `url` and `model`",
         variant("{kind: uniform}", "{kind: openai, url: 'http://127.0.0.1:8000/v1'}")),
    # -- the spec file itself ------------------------------------------------------------------
    Case("not-yaml", RUN, "not valid YAML at line 2", "name: [bad-input\n"),
    Case("yaml-list", RUN, "expected a YAML mapping at the top level, got list", "- name: bad-input\n- tasks: {}\n"),
    Case("empty-spec", RUN, "the spec is empty", ""),
    Case("binary-spec", ("validate", "$tmp/spec.bin"), "spec.bin: not a YAML text file (byte 1 is not UTF-8)"),
    Case("missing-spec-file", ("run", "$tmp/nowhere.yaml"), "nowhere.yaml: cannot read the spec (No such file"),
    # -- endpoints at start-up -----------------------------------------------------------------
    Case("policy-url-nothing-listens", RUN, "policy.url: nothing answers at $dead/v1 (connection refused",
         variant("{kind: uniform}", "{kind: openai, model: m, url: '$dead/v1', startup_connect_s: 0.5}")),
    Case("policy-url-host-not-found", RUN,
         "policy.url: nothing answers at http://thicket-no-such-host.invalid:8000/v1 (host name not found",
         variant("{kind: uniform}",
                 "{kind: openai, model: m, url: 'http://thicket-no-such-host.invalid:8000/v1', startup_connect_s: 0.5}")),
    Case("unknown-model", RUN, "policy.model: 'tiny' is not served at $models/v1; it serves: other",
         variant("{kind: uniform}", "{kind: openai, model: tiny, url: '$models/v1'}"), needs=("models_server",)),
    Case("policy-url-wrong-path", RUN, "policy.url: $models/models answered HTTP 404",
         variant("{kind: uniform}", "{kind: openai, model: tiny, url: '$models'}"), needs=("models_server",)),
    Case("policy-url-not-an-api", RUN, "policy.url: $models/html/models is not an OpenAI-compatible model list",
         variant("{kind: uniform}", "{kind: openai, model: tiny, url: '$models/html'}"), needs=("models_server",)),
    Case("storage-endpoint-nothing-listens", RUN, "storage.endpoint_url: nothing answers at $dead (connection refused",
         variant("output: $tmp/out", "output: s3://bad-input-bucket/runs")
         + S3_STORAGE.replace("}", ", endpoint_url: '$dead', startup_connect_s: 0.5}"), env=S3_KEYS),
    # -- credentials ---------------------------------------------------------------------------
    Case("credentials-env-unset", RUN, "storage.access_key_id_env: environment variable THICKET_TEST_KEY_ID is not set",
         variant("output: $tmp/out", "output: s3://$bucket/runs") + S3_STORAGE,
         env={"AWS_ENDPOINT_URL": "$s3"}, needs=("s3_server",)),
    Case("no-aws-credentials", RUN, "no usable AWS credentials for bucket",
         variant("output: $tmp/out", "output: s3://$bucket/runs"), env={"AWS_ENDPOINT_URL": "$s3"}, needs=("s3_server",)),
    Case("key-id-pasted-as-env-name", RUN, "storage.access_key_id_env: expected the NAME of an environment variable",
         variant("output: $tmp/out", "output: s3://bad-input-bucket/runs")
         + S3_STORAGE.replace("THICKET_TEST_KEY_ID", AKIA), absent=AKIA),
    Case("secret-pasted-as-env-name", RUN, "storage.secret_access_key_env: expected the NAME of an environment variable",
         variant("output: $tmp/out", "output: s3://bad-input-bucket/runs")
         + S3_STORAGE.replace("THICKET_TEST_SECRET", SECRET), absent=SECRET),
    # -- other commands ------------------------------------------------------------------------
    Case("worker-index-out-of-range", ("worker", "$spec", "--index", "2"), "--index: 2 is outside 0-1", BASE),
    Case("worker-without-index", ("worker", "$spec"), "JOB_COMPLETION_INDEX is not set", BASE,
         env={"JOB_COMPLETION_INDEX": None}),
    Case("aggregate-nothing-committed", ("aggregate", "$tmp"), "no committed trees there"),
    Case("aggregate-missing-sweep", ("aggregate", "$tmp/no-such-sweep"), "no-such-sweep: no committed trees there"),
    Case("aggregate-verifier-half", ("aggregate", "$tmp", "--verifier-url", "http://127.0.0.1:1/v1"),
         "--verifier-url and --verifier-model go together"),
    Case("pull-nothing-committed", ("pull", "s3://$bucket/sweep", "$tmp/pulled"),
         "s3://$bucket/sweep: no committed trees or datasets there",
         env={"AWS_ENDPOINT_URL": "$s3", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
         needs=("s3_server",)),
    Case("pull-missing-bucket", ("pull", "s3://bad-input-no-such-bucket/sweep", "$tmp/pulled"),
         "bucket 'bad-input-no-such-bucket' does not exist",
         env={"AWS_ENDPOINT_URL": "$s3", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"},
         needs=("s3_server",)),
    Case("serve-env-unknown-env", ("serve-env", "nethack", "--port", "0"), "serve-env: unknown env 'nethack'"),
    Case("unknown-option", (*RUN, "--bogus"), "No such option '--bogus'", BASE),
    Case("bad-option-value", ("worker", "$spec", "--index", "two"), "Invalid value for '--index'", BASE),
    Case("unknown-command", ("frobnicate",), "No such command 'frobnicate'"),
]
BY_ID = {case.id: case for case in CASES}
# Through the installed entry point too: a spec error, a usage error, and the start-up checks
# whose retries must stay out of the log.
SUBPROCESS_CASES = ("not-yaml", "unknown-option", "policy-url-nothing-listens", "storage-endpoint-nothing-listens")


# -- servers ---------------------------------------------------------------------------------


class _Models(QuietHandler):
    """/v1: an OpenAI-compatible API root that serves one model, "other"; /html: a web page."""

    def do_GET(self) -> None:
        path = self.path.rstrip("/")
        if path == "/v1/models":
            self.answer(200, json.dumps({"object": "list", "data": [{"id": "other"}]}).encode())
        elif path.startswith("/html"):
            self.answer(200, b"<html><body>a web page</body></html>", "text/html")
        else:
            self.answer(404, json.dumps({"error": {"message": "not found"}}).encode())


@pytest.fixture(scope="module")
def models_server() -> Iterator[str]:
    with serving(_Models) as url:
        yield url


def dead_url() -> str:
    """An http URL where nothing listens (a port just released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


# -- running a case --------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    code: int | None
    out: str
    err: str


def places(case: Case, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    found = {"tmp": str(tmp_path), "spec": str(tmp_path / "spec.yaml"), "dead": dead_url()}
    if "models_server" in case.needs:
        found["models"] = request.getfixturevalue("models_server")
    if "s3_server" in case.needs:
        s3 = request.getfixturevalue("s3_server")
        found |= {"s3": s3.endpoint, "bucket": s3.make_bucket("bad-input")}
    return found


def prepare(case: Case, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[list[str], dict[str, str | None], str]:
    """Write the spec; return the argv, the environment changes and the expected needle."""
    where = places(case, tmp_path, request)
    fill = lambda text: Template(text).substitute(where)  # noqa: E731
    if case.spec is not None:
        (tmp_path / "spec.yaml").write_text(fill(case.spec))
    (tmp_path / "spec.bin").write_bytes(b"\x00\xff\xfe not text")
    # No AWS setup of the machine's may leak in: only what the case sets.
    env: dict[str, str | None] = {name: None for name in os.environ if name.startswith("AWS_")}
    env |= {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_REGION": "us-east-1"}
    env |= {name: None if value is None else fill(value) for name, value in case.env.items()}
    return [fill(arg) for arg in case.argv], env, fill(case.needle)


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture):
    """Run `thicket ARGV` through cli.main here; logging at INFO, as the CLI configures it, is
    captured by caplog (pytest owns the root logger) and returned with stderr."""
    sigterm = signal.getsignal(signal.SIGTERM)  # main() installs its own

    def run(argv: list[str], env: dict[str, str | None]) -> Outcome:
        for name, value in env.items():
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        monkeypatch.setattr(sys, "argv", ["thicket", *argv])
        caplog.set_level(logging.INFO)
        try:
            cli.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        captured = capsys.readouterr()
        logged = "".join(f"{r.levelname} {r.name}: {r.getMessage()}\n" for r in caplog.records)
        return Outcome(code, captured.out, captured.err + logged)

    yield run
    signal.signal(signal.SIGTERM, sigterm)


def child(argv: list[str], env: dict[str, str | None], cwd: Path) -> Outcome:
    merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    done = subprocess.run([THICKET, *argv], cwd=cwd, env=merged, capture_output=True, text=True, timeout=120)
    return Outcome(done.returncode, done.stdout, done.stderr)


def assert_one_line_error(outcome: Outcome, needle: str, absent: str | None) -> None:
    everything = outcome.out + outcome.err
    assert outcome.code == 2, everything
    assert "Traceback" not in everything
    lines = outcome.err.splitlines()
    assert len(lines) == 1 and lines[0].strip(), everything
    assert lines[0].startswith("error: "), everything
    assert needle in lines[0], everything
    assert outcome.out == "", everything
    if absent is not None:
        assert absent not in everything


# -- tests -----------------------------------------------------------------------------------


def test_the_table_covers_at_least_25_distinct_cases() -> None:
    assert len(BY_ID) == len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_exits_2_with_one_line_naming_it(case: Case, tmp_path: Path, request: pytest.FixtureRequest,
                                                   in_process) -> None:
    argv, env, needle = prepare(case, tmp_path, request)
    assert_one_line_error(in_process(argv, env), needle, case.absent)


@pytest.mark.parametrize("case_id", SUBPROCESS_CASES)
def test_the_installed_entry_point_answers_the_same(case_id: str, tmp_path: Path,
                                                    request: pytest.FixtureRequest) -> None:
    case = BY_ID[case_id]
    argv, env, needle = prepare(case, tmp_path, request)
    assert_one_line_error(child(argv, env, tmp_path), needle, case.absent)
