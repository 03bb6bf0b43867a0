"""BabyAI, TextArena and the math env side by side: the same tasks in every process (whatever
the hash seed), and `solution()` winning from the start."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.env_steps import rollout
from thicket.envs.babyai import BabyAIEnv
from thicket.envs.math.env import MathCodeEnv


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
