"""The env registry: every family by name, each with its instructions; the built-in families
known without importing their game packages (the worker image carries none of them), and which
extra to install when one is missing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.env_cases import CASES
from thicket.envs import env_names, make_env

BLOCK_TEXTCRAFT = "import sys; sys.modules['textcraft'] = None  # as if not installed\n"


def run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_TEXTCRAFT + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)


def test_names_and_specs_need_no_game_package():
    done = run("""
        from thicket.envs import env_names
        from thicket.spec import parse_spec
        assert "textcraft" in env_names() and "sciworld" in env_names()
        parse_spec({"name": "x", "tasks": {"env": "textcraft", "stop": 2}, "search": {"algorithm": "sample"},
                    "policy": {"kind": "uniform"}, "output": "out"})
        heavy = [m for m in ("textcraft", "scienceworld", "textworld", "minigrid", "textarena") if sys.modules.get(m)]
        assert not heavy, heavy
        print("ok")
    """)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_missing_game_package_names_the_extra_to_install():
    done = run("""
        from thicket.envs import EnvNotInstalled, make_env
        try:
            make_env("textcraft")
        except EnvNotInstalled as err:
            print(err)
    """)
    assert "env 'textcraft' needs the package 'textcraft'" in done.stdout and "thicket[envs]" in done.stdout, done.stderr


def test_serve_env_without_the_package_is_bad_input_in_one_line():
    done = run("""
        import sys
        from thicket.cli import main
        sys.argv = ["thicket", "serve-env", "textcraft", "--port", "0"]
        main()
    """)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'thicket[envs]'" in lines[0], done.stderr


def test_registry_lists_every_env() -> None:
    assert {"textcraft", "frozenlake", "cliffwalking", "taxi"} <= set(env_names())
    for name, args in CASES:
        assert make_env(name, **args).instructions.strip()


def test_registry_lists_the_new_envs() -> None:
    assert {"sciworld", "textworld", "babyai", "textarena", "math"} <= set(env_names())
    for name in ("sciworld", "textworld", "babyai", "textarena", "math"):
        env = make_env(name)  # no JVM, no game generation until the first reset
        assert env.family == name and env.instructions.strip()
    assert not make_env("sciworld").can_snapshot
    assert all(make_env(n).can_snapshot for n in ("textworld", "babyai", "textarena", "math"))
