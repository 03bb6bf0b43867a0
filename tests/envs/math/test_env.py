"""The CodeAct math env: its problems file, answer parsing, answers ending the episode, code
cells keeping state, exact snapshot/restore, the async protocol."""

from __future__ import annotations

import pytest

from tests.support.env_steps import rollout
from thicket.envs import make_env
from thicket.envs.math.env import MathCodeEnv, load_problems, parse_answer
from thicket.envs.math.problems import DATA_FILE, generate, render


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
