"""The offline envs beyond TextCraft/toy text: ScienceWorld, TextWorld, BabyAI, TextArena
and the CodeAct math env with its sandbox. Determinism per task index, valid actions,
a known success per env, exact snapshot/restore (or replay) and the sandbox's limits."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from thicket.envs import SyncEnv, env_names, make_env
from thicket.envs.babyai import ACTIONS, BabyAIEnv
from thicket.envs.math_code import MathCodeEnv, load_problems, parse_answer
from thicket.envs.math_problems import DATA_FILE, generate, render
from thicket.envs.sandbox import Limits, probe, run_cells
from thicket.envs.sciworld import ScienceWorldEnv, order_valid_actions, task_names
from thicket.envs.textarena_games import TextArenaEnv
from thicket.envs.textworld_games import TextWorldEnv

from env_steps import Step, as_step, rollout


def walk(env: SyncEnv, valid: tuple[str, ...] | None, rng: random.Random, steps: int,
         extra: tuple[str, ...] = (), record: list[Step] | None = None) -> tuple[list[str], tuple[str, ...] | None]:
    """Up to `steps` random actions from the env's valid lists (mixing in `extra`), stopping
    when the episode ends; returns the actions and the valid list after the last one."""
    taken: list[str] = []
    for _ in range(steps):
        if not valid:
            break
        action = rng.choice(extra) if extra and rng.random() < 0.2 else rng.choice(valid)
        t = env.step_sync(action)
        taken.append(action)
        if record is not None:
            record.append(as_step(t))
        valid = t.observation.valid_actions
        if t.done:
            break
    return taken, valid


def assert_snapshot_exact(make: Any, task: int, prefix_steps: int, seed: int,
                          extra: tuple[str, ...] = ()) -> None:
    """Snapshot mid-episode; what follows is the same after a restore, also into a fresh env."""
    rng = random.Random(seed)
    env = make()
    obs = env.reset_sync(task)
    _, valid = walk(env, obs.valid_actions, rng, prefix_steps, extra)
    assert valid, "the prefix ended the episode: pick another task or seed"
    state = env.snapshot_sync()
    first: list[Step] = []
    continuation, _ = walk(env, valid, rng, 12, extra, record=first)
    assert continuation
    env.restore_sync(state)
    assert rollout(env, continuation) == first
    fresh = make()
    fresh.restore_sync(state)
    assert rollout(fresh, continuation) == first
    fresh.restore_sync(state)  # restoring does not consume the snapshot
    assert rollout(fresh, continuation) == first


# --- registry -------------------------------------------------------------------------


def test_registry_lists_the_new_envs() -> None:
    assert {"sciworld", "textworld", "babyai", "textarena", "math"} <= set(env_names())
    for name in ("sciworld", "textworld", "babyai", "textarena", "math"):
        env = make_env(name)  # no JVM, no game generation until the first reset
        assert env.family == name and env.instructions.strip()
    assert not make_env("sciworld").can_snapshot
    assert all(make_env(n).can_snapshot for n in ("textworld", "babyai", "textarena", "math"))


# --- BabyAI ---------------------------------------------------------------------------


def test_babyai_task_indexing_and_text() -> None:
    env = BabyAIEnv()
    levels = env.levels
    assert list(levels) == sorted(levels) and not any("Debug" in lvl for lvl in levels)
    assert env.level_of(0) == (levels[0], 0)
    assert env.level_of(len(levels) + 3) == (levels[3], 1)
    obs = env.reset_sync(5)
    assert obs.valid_actions == ACTIONS
    assert obs.text.startswith(f"Mission: {env.game.mission}.")
    assert "You are carrying nothing." in obs.text and "In front of you:" in obs.text


def test_babyai_reset_is_deterministic_per_task() -> None:
    a, b = BabyAIEnv(), BabyAIEnv()
    texts = set()
    for task in (0, 7, 91, 200):
        obs = a.reset_sync(task)
        assert b.reset_sync(task) == obs
        texts.add(obs.text)
        actions = [random.Random(task).choice(ACTIONS) for _ in range(25)]
        first = rollout(a, actions)
        assert rollout(b, actions) == first
        assert a.reset_sync(task) == obs
    assert len(texts) == 4


def test_babyai_bot_reaches_the_goal() -> None:
    from minigrid.utils.baby_ai_bot import BabyAIBot

    env = BabyAIEnv(["BabyAI-GoToRedBall-v0", "BabyAI-UnlockLocal-v0", "BabyAI-PutNextLocal-v0"])
    for task in range(6):
        env.reset_sync(task)
        bot = BabyAIBot(env.game)
        for _ in range(env.game.max_steps):
            t = env.step_sync(ACTIONS[int(bot.replan())])
            assert "Invalid" not in t.observation.text
            if t.done:
                break
        assert (t.reward, t.done, t.success) == (1.0, True, True), env.level_of(task)
        assert t.info["raw_reward"] > 0
        assert env.step_sync("go forward").observation.text == "The episode is over."


def test_babyai_invalid_action_changes_nothing() -> None:
    env = BabyAIEnv()
    env.reset_sync(3)
    env.step_sync("turn left")
    before = env.snapshot_sync()
    t = env.step_sync("fly away")
    assert "Invalid action" in t.observation.text and (t.reward, t.done) == (0.0, False)
    after = env.snapshot_sync()
    assert after == before
    first_line = env.step_sync("Go Forward.").observation.text.split("\n")[0]  # case, spaces, "."
    assert first_line == "You move forward." or first_line.startswith("You cannot move forward")


@pytest.mark.parametrize("task", [2, 40, 95])
def test_babyai_snapshot_restore_is_exact(task: int) -> None:
    assert_snapshot_exact(BabyAIEnv, task, prefix_steps=8, seed=task)


def test_babyai_snapshot_keeps_the_rng() -> None:
    env = BabyAIEnv(["BabyAI-GoToLocal-v0"])
    env.reset_sync(1)
    state = env.snapshot_sync()
    draws = env.game.np_random.integers(0, 10**9, size=4).tolist()
    env.restore_sync(state)
    assert env.game.np_random.integers(0, 10**9, size=4).tolist() == draws


# --- TextArena ------------------------------------------------------------------------

ARENA = ["TowerOfHanoi-v0", "GuessTheNumber-v0", "Minesweeper-v0-small", "Crosswords-v0"]


def _arena_solution(env: TextArenaEnv) -> list[str]:
    if env.base != "Minesweeper":
        return env.solution()
    first = "[2 2]"
    env.step_sync(first)  # mines are placed on the first move
    game = env.game
    return [f"[{r} {c}]" for r in range(game.rows) for c in range(game.cols)
            if game.grid[r][c] != -1 and not game.revealed[r][c]]


@pytest.mark.parametrize("game", ARENA)
def test_textarena_deterministic_and_solvable(game: str) -> None:
    a, b = TextArenaEnv(game), TextArenaEnv(game)
    for task in (0, 5):
        obs = a.reset_sync(task)
        random.random()  # the games draw from the global `random`: others using it must not matter
        assert b.reset_sync(task) == obs
        moves = _arena_solution(a)
        b_moves = _arena_solution(b)
        assert moves == b_moves
        steps = rollout(a, moves)
        assert steps[-1][2:] == (1.0, True, True), (game, steps[-1])
        assert not any(s[3] for s in steps[:-1])


@pytest.mark.parametrize("game", ARENA[:3])
def test_textarena_valid_actions_are_accepted(game: str) -> None:
    env = TextArenaEnv(game)
    obs = env.reset_sync(1)
    assert obs.valid_actions
    state = env.snapshot_sync()
    for action in obs.valid_actions:
        env.restore_sync(state)
        t = env.step_sync(action)
        assert "invalid move" not in t.observation.text.lower(), (action, t.observation.text)
    env.restore_sync(state)
    t = env.step_sync("hello")
    assert "invalid move" in t.observation.text.lower() and not t.done  # one warning first
    t = env.step_sync("hello again")
    assert t.done and not t.success and t.info["invalid_move"]


def test_textarena_crosswords_has_free_text_actions() -> None:
    env = TextArenaEnv("Crosswords-v0")
    assert env.reset_sync(0).valid_actions is None


@pytest.mark.parametrize("game", ARENA)
def test_textarena_snapshot_restore_is_exact(game: str) -> None:
    def make() -> TextArenaEnv:
        return TextArenaEnv(game)

    env = make()
    env.reset_sync(4)
    state = env.snapshot_sync()  # before Minesweeper's first move: its mines are not placed yet
    moves = _arena_solution(env)[:6] + ["[9 9 9]"]
    env.restore_sync(state)
    first = rollout(env, moves)
    for target in (env, make()):
        target.restore_sync(state)
        random.seed(12345)  # global RNG state must not leak into the game
        assert rollout(target, moves) == first
    if game != "Crosswords-v0":  # no valid-action list to walk on
        assert_snapshot_exact(make, 2, prefix_steps=2, seed=7)


# --- TextWorld ------------------------------------------------------------------------

TW_ARGS = {"world_size": 3, "nb_objects": 6, "quest_length": 3}


@pytest.fixture(scope="module")
def tw_cache(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated games are deterministic, so they are kept across test runs (when pytest's
    cache is on)."""
    cache = getattr(pytestconfig, "cache", None)
    return Path(cache.mkdir("thicket-textworld")) if cache else tmp_path_factory.mktemp("textworld")


def test_textworld_walkthroughs_win(tw_cache: Path) -> None:
    env = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    assert isinstance(env, TextWorldEnv)
    for task in (0, 1):
        obs = env.reset_sync(task)
        assert obs.valid_actions and "$$" not in obs.text and obs.text.strip()
        plan = list(env.walkthrough)
        assert plan
        steps = rollout(env, plan)
        assert not any(s[3] for s in steps[:-1])
        assert steps[-1][2:] == (1.0, True, True)
        assert env.step_sync("look").observation.text == "The episode is over."


def test_textworld_reset_is_deterministic(tw_cache: Path) -> None:
    a = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    b = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    obs = a.reset_sync(1)
    assert b.reset_sync(1) == obs
    assert a.reset_sync(0) != obs
    actions = ["look", "inventory", *obs.valid_actions[:5], "dance"]  # type: ignore[misc]
    a.reset_sync(1)
    first = rollout(a, actions)
    assert rollout(b, actions) == first
    assert "not a verb" in first[-1][0]


def test_textworld_admissible_commands_are_understood(tw_cache: Path) -> None:
    env = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
    obs = env.reset_sync(0)
    state = env.snapshot_sync()
    for action in obs.valid_actions or ():
        env.restore_sync(state)
        text = env.step_sync(action).observation.text
        assert "not a verb" not in text and "can't see any such thing" not in text, (action, text)


@pytest.mark.parametrize("task", [0, 1])
def test_textworld_snapshot_restore_is_exact(tw_cache: Path, task: int) -> None:
    def make() -> TextWorldEnv:
        env = make_env("textworld", cache_dir=str(tw_cache), **TW_ARGS)
        assert isinstance(env, TextWorldEnv)
        return env

    assert_snapshot_exact(make, task, prefix_steps=4, seed=task, extra=("look", "dance", "take all"))
    env = make()
    env.reset_sync(task)
    plan = list(env.walkthrough)
    rollout(env, plan[:-1])
    state = env.snapshot_sync()
    assert rollout(env, plan[-1:])[-1][4]  # wins from the snapshot ...
    fresh = make()
    fresh.restore_sync(state)
    assert rollout(fresh, plan[-1:])[-1][2:] == (1.0, True, True)  # ... and from its restore


# --- ScienceWorld ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def sciworld() -> Iterator[ScienceWorldEnv]:
    env = make_env("sciworld", max_valid_actions=60)
    assert isinstance(env, ScienceWorldEnv)
    yield env
    sim = env._sim
    env.close_sync()
    if sim is not None:
        proc = sim.env._gateway.java_process
        assert proc.poll() is not None, "the JVM outlived close()"


def test_sciworld_task_indexing(sciworld: ScienceWorldEnv) -> None:
    names = task_names()
    assert len(names) == 30 and list(names) == sorted(names)
    name, variation = sciworld.task_of(0)
    assert name == names[0] and variation == sciworld.variations(names[0])[0]
    assert sciworld.task_of(30 + 4) == (names[4], sciworld.variations(names[4])[1])


def test_sciworld_reset_and_valid_actions(sciworld: ScienceWorldEnv) -> None:
    obs = sciworld.reset_sync(0)
    assert obs.text.startswith("Your task is to boil water") and "This room is called" in obs.text
    valid = obs.valid_actions
    assert valid and len(valid) <= 60 and valid[:2] == ("look around", "inventory")
    assert not any("agent" in a.split() for a in valid) and "reset task" not in valid
    assert sciworld.reset_sync(0) == obs
    door = next(a for a in valid if a.startswith("open door to"))
    t = sciworld.step_sync(door)
    assert t.observation.text == "The door is now open." and not t.done
    t = sciworld.step_sync("dance wildly")
    assert "No known action" in t.observation.text and (t.reward, t.done) == (0.0, False)
    ordered = order_valid_actions(["connect a to b", "reset task", "focus on agent", "go to kitchen", "look around"], None)
    assert ordered == ("look around", "go to kitchen", "connect a to b")


def test_sciworld_gold_path_and_replay(sciworld: ScienceWorldEnv) -> None:
    task = task_names().index("lifespan-longest-lived")
    plan = sciworld.gold_path(task)
    sciworld.list_valid_actions = False  # listing costs ~0.1-0.3 s per step
    try:
        sciworld.reset_sync(task)
        steps = []
        for action in plan:
            t = sciworld.step_sync(action)
            steps.append((t.observation.text, t.reward, t.done, t.success))
            if t.done:
                break
        assert steps[-1][1:] == (1.0, True, True)
        assert 0 < steps[1][1] < 1  # partial score on the way
        # Replay equivalence: reset + the same actions give the same transitions.
        sciworld.reset_sync(task)
        again = []
        for action in plan[: len(steps)]:
            t = sciworld.step_sync(action)
            again.append((t.observation.text, t.reward, t.done, t.success))
        assert again == steps
    finally:
        sciworld.list_valid_actions = True


def test_sciworld_solution_stops_where_the_task_is_done(sciworld: ScienceWorldEnv) -> None:
    task = task_names().index("lifespan-longest-lived")
    sciworld.reset_sync(task)
    plan = sciworld.solution()
    assert len(plan) < len(sciworld.gold_path(task))  # its gold path ends with a spare "wait1"
    sciworld.list_valid_actions = False
    try:
        sciworld.reset_sync(task)
        steps = [sciworld.step_sync(a) for a in plan]
    finally:
        sciworld.list_valid_actions = True
    assert steps[-1].success and not any(t.done for t in steps[:-1])


async def test_sciworld_async_steps_run_off_the_loop(sciworld: ScienceWorldEnv) -> None:
    obs = await sciworld.reset(1)
    t = await sciworld.step("look around")
    assert obs.text.startswith("Your task is") and "This room is called" in t.observation.text
    with pytest.raises(NotImplementedError):
        await sciworld.snapshot()


# --- math: problems -------------------------------------------------------------------


def test_math_problems_file_matches_its_generator() -> None:
    assert DATA_FILE.read_text() == render(generate())
    problems = load_problems()
    assert len(problems) >= 300
    assert len({p.question for p in problems}) == len(problems)
    assert {p.topic for p in problems} >= {"arithmetic", "algebra", "number theory", "combinatorics", "probability"}


@pytest.mark.parametrize(
    ("text", "value"),
    [("7/3", "7/3"), ("\\frac{7}{3}", "7/3"), ("$\\boxed{-4}$", "-4"), ("x = -4", "-4"), ("2.5", "5/2"),
     ("1,234", "1234"), ("It takes 12 hours.", "12"), ("\u22123/4", "-3/4"), ("(-3)/(4)", "-3/4")],
)
def test_math_answer_parsing(text: str, value: str) -> None:
    from fractions import Fraction

    assert parse_answer(text) == Fraction(value)


def test_math_answers_end_the_episode() -> None:
    env = MathCodeEnv()
    problem = env.problems[7]
    assert env.reset_sync(7).text == problem.question and env.reset_sync(7).valid_actions is None
    t = env.step_sync(f"answer: {problem.answer_text}")
    assert (t.reward, t.done, t.success) == (1.0, True, True)
    assert env.step_sync("answer: 1").observation.text == "The episode is over."
    env.reset_sync(7)
    t = env.step_sync(f"Answer:  {problem.answer + 1}")
    assert (t.reward, t.done, t.success) == (0.0, True, False)
    env.reset_sync(7 + len(env.problems))
    assert env.problem == problem
    t = env.step_sync("I think it is 5")
    assert "Invalid action" in t.observation.text and not t.done


def test_math_code_solves_a_problem_with_state_across_cells() -> None:
    env = MathCodeEnv()
    task = next(p.index for p in env.problems if p.topic == "number theory" and "remainder when" in p.question)
    question = env.reset_sync(task).text
    base, exponent, modulus = (int(x) for x in
                               question.split("when ")[1].rstrip("?").replace(" is divided by ", "^").split("^"))
    t = env.step_sync(f"execute: b, e = {base}, {exponent}")
    assert t.observation.text == "[no output]" and t.info["status"] == "ok"
    t = env.step_sync(f"execute:\n```python\nr = pow(b, e, {modulus})\nr\n```")
    assert t.observation.text == str(pow(base, exponent, modulus))
    t = env.step_sync(f"answer: {t.observation.text}")
    assert t.success


def test_math_snapshot_restore_is_exact() -> None:
    env = MathCodeEnv(cpu_s=2)
    env.reset_sync(0)
    env.step_sync("execute: import random\nx = [random.randint(0, 10**6) for _ in range(3)]")
    env.step_sync("execute: y = sum(x)\nprint(set('abcdef'))")
    state = env.snapshot_sync()
    moves = ["execute: y += 1; print(x, y)", "execute: print({str(i): i for i in range(3)})", "execute: 1/0",
             "execute: print(y)"]
    first = rollout(env, moves)
    env.restore_sync(state)
    assert rollout(env, moves) == first
    fresh = MathCodeEnv(cpu_s=2)
    fresh.restore_sync(state)
    assert rollout(fresh, moves) == first
    assert "ZeroDivisionError" in first[2][0]
    # A cell stopped at its limit leaves no state behind.
    fresh.restore_sync(state)
    y = fresh.step_sync("execute: print(y)").observation.text
    fresh = MathCodeEnv(cpu_s=1)
    fresh.restore_sync(state)
    t = fresh.step_sync("execute: y = -1\nwhile True: pass")
    assert t.info["status"] == "cpu_limit" and "stopped" in t.observation.text
    assert fresh.step_sync("execute: print(y)").observation.text == y
    assert int(y) == int(first[0][0].split()[-1]) - 1  # the first move printed y + 1


async def test_math_async_protocol() -> None:
    env = make_env("math")
    obs = await env.reset(3)
    state = await env.snapshot()
    t = await env.step("execute: print(6 * 7)")
    assert t.observation.text == "42" and obs.valid_actions is None
    await env.restore(state)
    assert (await env.step("execute: print(6 * 7)")) == t


# --- math: the sandbox ----------------------------------------------------------------


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


# --- determinism across processes -----------------------------------------------------

_DIGEST_SCRIPT = """
import hashlib, random
from thicket.envs import make_env
h = hashlib.sha256()
for name, args, tasks in [("babyai", {}, (0, 13, 150)), ("textarena", {"game": "Minesweeper-v0-small"}, (0, 3)),
                          ("textarena", {"game": "Crosswords-v0"}, (1,)), ("math", {}, (0, 200))]:
    env = make_env(name, **args)
    for task in tasks:
        obs = env.reset_sync(task)
        h.update(repr(obs).encode())
        rng = random.Random(task)
        for i in range(15):
            if name == "math":
                action = "execute: print(sorted({'b', 'a'}), hash('x') == hash('x'))" if i == 0 else "answer: 0"
            else:
                action = rng.choice(obs.valid_actions or ("[1 1 a]",))
            t = env.step_sync(action)
            h.update(repr((t.observation, t.reward, t.done)).encode())
            if t.done:
                break
            obs = t.observation
print(h.hexdigest())
"""


def test_tasks_identical_across_processes() -> None:
    digests = set()
    for seed in ("0", "777"):
        env = os.environ | {"PYTHONHASHSEED": seed}
        result = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], env=env, capture_output=True,
                                text=True, check=True, timeout=120)
        digests.add(result.stdout.strip())
    assert len(digests) == 1


def test_solutions_win_from_the_start() -> None:
    """`solution()` (BabyAI's bot, the math answer) wins and leaves the env where it was."""
    for env in (BabyAIEnv(), MathCodeEnv()):
        env.reset_sync(0)
        env.step_sync("turn left" if isinstance(env, BabyAIEnv) else "execute: x = 1")
        before = env.snapshot_sync()
        plan = env.solution()
        assert plan
        probe_action = "go forward" if isinstance(env, BabyAIEnv) else "execute: print(x)"
        after = env.step_sync(probe_action)
        env.restore_sync(before)
        assert env.step_sync(probe_action) == after  # solution() put the env back
        env.reset_sync(0)
        assert rollout(env, plan)[-1][2:] == (1.0, True, True)
