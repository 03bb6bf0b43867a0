"""The math env's sandbox (thicket.envs.math.sandbox): no network, no writes outside its folder, no
new processes, and limits on CPU time, wall-clock time, memory and output."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from thicket.envs.math.sandbox import Limits, probe, run_cells


@pytest.fixture(scope="module")
def layers() -> tuple[str, ...]:
    found = probe()
    assert "rlimits" in found and "audit-hook" in found
    return found


def test_sandbox_refuses_the_network(layers: tuple[str, ...]) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        code = (f"import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {port}))\n"
                "print('CONNECTED')")
        r = run_cells([], code)
        assert r.status == "error" and "CONNECTED" not in r.output
        assert "PermissionError" in r.output, r.output
        r = run_cells([], f"import urllib.request\nurllib.request.urlopen('http://127.0.0.1:{port}', timeout=2)")
        assert r.status == "error" and "not allowed" in r.output
        if "netns" in layers or "userns+netns" in layers:
            # Below the hook: the namespace has no interface but a loopback that is down.
            r = run_cells([], "print(open('/proc/net/dev').read())")
            devices = [line.split(":")[0].strip() for line in r.output.splitlines()[2:]]
            assert devices == ["lo"], r.output
    finally:
        server.close()


def test_sandbox_refuses_writes_outside_its_folder(tmp_path: Path, layers: tuple[str, ...]) -> None:
    target = tmp_path / "escaped.txt"
    attempts = [
        f"open({str(target)!r}, 'w').write('x')",
        f"import os\nos.symlink({str(tmp_path)!r}, 'link')\nopen('link/escaped.txt', 'w').write('x')",
        f"import shutil\nopen('a.txt', 'w').write('x')\nshutil.copy('a.txt', {str(target)!r})",
        f"import os\nos.rename('nothing', {str(target)!r})",
    ]
    if any(layer.startswith("landlock") for layer in layers):
        # A path relative to a directory fd escapes the hook; the kernel still refuses it.
        attempts.append(f"import os\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
                        "os.close(os.open('escaped.txt', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))")
    for code in attempts:
        r = run_cells([], code)
        assert r.status == "error" and ("PermissionError" in r.output or "FileNotFoundError" in r.output), (code, r.output)
        assert not target.exists(), code
    r = run_cells([], "open('inside.txt', 'w').write('hello')\nimport os, tempfile\n"
                      "print(open('inside.txt').read(), os.getcwd() == os.environ['HOME'])\n"
                      "print(tempfile.mkstemp()[1].startswith(os.getcwd()))")
    assert r.output.split() == ["hello", "True", "True"], r.output


def test_sandbox_refuses_new_processes(layers: tuple[str, ...]) -> None:
    for code in ("import os\nos.system('echo hi')", "import subprocess\nsubprocess.run(['echo', 'hi'])",
                 "import os\nos.fork()", "import ctypes\nctypes.CDLL('libc.so.6').fork()",
                 "import os\nos.execv('/bin/echo', ['echo', 'hi'])"):
        r = run_cells([], code)
        assert r.status == "error" and "not allowed" in r.output and "hi" not in r.output.split(), (code, r.output)
    if "seccomp-noproc" in layers:
        # _posixsubprocess raises no audit event: the kernel filter stops it.
        code = ("import _posixsubprocess, os\nr, w = os.pipe()\n"
                "_posixsubprocess.fork_exec(['/bin/echo', 'hi'], [b'/bin/echo'], True, (), None, None,"
                " -1, -1, -1, -1, -1, -1, r, w, True, False, 0, None, None, None, -1, None, False)")
        r = run_cells([], code)
        assert r.status == "error" and "Operation not permitted" in r.output, r.output


def test_sandbox_stops_a_runaway_loop() -> None:
    started = time.monotonic()
    r = run_cells(["x = 1"], "while True:\n    x += 1", Limits(cpu_s=0.5))
    assert r.status == "cpu_limit" and r.stopped and "CPU time" in r.output
    assert time.monotonic() - started < 15
    started = time.monotonic()
    r = run_cells([], "import time\ntime.sleep(60)", Limits(cpu_s=1, wall_factor=1))
    assert r.status == "timeout" and time.monotonic() - started < 10


def test_sandbox_stops_a_memory_bomb() -> None:
    for code in ("x = bytearray(8 * 1024**3)", "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024**2))"):
        r = run_cells([], code, Limits(memory_mb=512))
        assert "MemoryError" in r.output or r.status == "killed", r.output
    r = run_cells([], "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))")
    assert r.status == "error" and "not allowed" in r.output


def test_sandbox_caps_its_output() -> None:
    r = run_cells([], "print('a' * 100_000)\nprint('end')", Limits(max_output_chars=300))
    assert r.status == "ok" and len(r.output) < 400 and r.truncated > 99_000
    assert r.output.rstrip().endswith("end") or "left out" in r.output
