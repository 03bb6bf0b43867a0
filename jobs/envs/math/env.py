"""Math word problems solved by writing and running Python (CodeAct, as in DensePolicy).

Task index `i` is problem `i % N` of the generated set shipped with the package
(problems.jsonl, made by thicket.envs.math.problems; N = 360 by default;
`problems_file` points elsewhere: JSON lines with "question" and "answer").

Actions (free text, valid_actions None):
  execute: <python code>   runs the code in a sandbox (thicket.envs.math.sandbox: CPU time,
                           memory, file size and process limits, no network, writes only
                           in a fresh temporary folder); the observation is what it printed
                           (stdout and stderr interleaved, truncated), a traceback if it
                           raised, or a note that it was stopped at a limit.
  answer: <value>          ends the episode: reward 1 and success if the value equals the
                           exact answer (an integer or a fraction; "7/3", "\\frac{7}{3}",
                           "2.5" for 5/2 and "x = -4" are understood), else reward 0.
Anything else is answered with a reminder of the two forms and changes nothing.

State and snapshots: variables persist across `execute` actions like notebook cells. The
sandbox process is thrown away after every action, so each `execute` starts a fresh
interpreter that silently re-runs the earlier cells and then runs the new one (with
`random` seeded and PYTHONHASHSEED fixed, so the replay is deterministic for
deterministic code). The env's whole state is therefore the list of cells run so far:
a snapshot is that list, restore is exact by construction and costs nothing, and a
restored env (or a fresh instance) continues exactly as the original. A cell that raised
keeps what it did before raising (it is replayed, as a notebook kernel would keep it); a
cell stopped at a limit (CPU time, wall clock, a crash) leaves no state behind: it is not
replayed. An `execute` costs ~0.1 s (a fresh interpreter; ~0.6 s with `import sympy`)
plus the history's own run time (`persistent=False` runs each cell on its own).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from thicket.envs import register
from thicket.envs.math.problems import DATA_FILE
from thicket.envs.protocol import Observation, SyncEnv, Transition
from thicket.envs.math.sandbox import Limits, RunResult, run_cells

INSTRUCTIONS = """\
Solve the math problem. You may run Python to compute: your variables persist from one
run to the next (like notebook cells), numpy and sympy are installed, and there is no
network access. Each turn, reply with exactly one action:
  execute: <python code>    run the code; you see what it prints (the value of a last
                            bare expression is printed too)
  answer: <value>           submit your final answer; this ends the episode
Answers are exact: give an integer or a fraction in lowest terms such as 7/3 (no units,
no rounded decimals)."""

_ACTION = re.compile(r"^\s*(execute|answer)\s*:\s*", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```[a-zA-Z0-9_+-]*[ \t]*\n(.*?)\n?[ \t]*```\s*$", re.DOTALL)
_NUMBER = r"[-+]?\s*(?:\d+(?:\.\d*)?|\.\d+)"
_VALUE = re.compile(rf"({_NUMBER})(?:\s*/\s*({_NUMBER}))?")
_LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{\s*([^{}]+?)\s*\}\s*\{\s*([^{}]+?)\s*\}")


@dataclass(frozen=True)
class MathProblem:
    index: int
    question: str
    answer: Fraction
    answer_text: str
    topic: str = ""


@dataclass(frozen=True)
class MathSnapshot:
    task: int
    cells: tuple[str, ...]
    steps: int
    done: bool


@functools.cache
def load_problems(path: str | None = None) -> tuple[MathProblem, ...]:
    lines = Path(path or DATA_FILE).read_text().splitlines()
    problems = []
    for i, line in enumerate(line for line in lines if line.strip()):
        record = json.loads(line)
        answer = parse_answer(str(record["answer"]))
        if answer is None:
            raise ValueError(f"problem {i}: answer {record['answer']!r} is not an exact number")
        problems.append(MathProblem(i, record["question"], answer, str(record["answer"]), record.get("topic", "")))
    if not problems:
        raise ValueError(f"no problems in {path or DATA_FILE}")
    return tuple(problems)


def parse_answer(text: str) -> Fraction | None:
    """The exact number an answer states, or None (see the module doc for what is understood)."""
    text = text.strip().replace("$", "").replace("\\left", "").replace("\\right", "").replace("\u2212", "-")
    text = re.sub(r"\\boxed\s*\{(.*)\}", r"\1", text)
    text = _LATEX_FRAC.sub(r"(\1)/(\2)", text)
    if "=" in text:
        text = text.rsplit("=", 1)[1]
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,234 -> 1234
    text = text.replace("(", "").replace(")", "")
    match = _VALUE.search(text)
    if match is None:
        return None
    try:
        value = Fraction(match.group(1).replace(" ", ""))
        if match.group(2) is not None:
            value /= Fraction(match.group(2).replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None
    return value


def strip_fences(code: str) -> str:
    match = _FENCE.match(code)
    return match.group(1) if match else code


class MathCodeEnv(SyncEnv):
    family = "math"
    can_snapshot = True

    def __init__(
        self,
        cpu_s: float = 5.0,
        memory_mb: int = 1024,
        max_output_chars: int = 2000,
        persistent: bool = True,
        problems_file: str | None = None,
    ) -> None:
        self.limits = Limits(cpu_s=cpu_s, memory_mb=memory_mb, max_output_chars=max_output_chars)
        self.persistent = persistent
        self.problems = load_problems(problems_file)
        self._problem: MathProblem | None = None
        self._task: int | None = None
        self._cells: tuple[str, ...] = ()
        self._steps = 0
        self._done = False

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def problem(self) -> MathProblem:
        if self._problem is None:
            raise RuntimeError("reset the env before stepping it")
        return self._problem

    def reset_sync(self, task: int) -> Observation:
        self._problem = self.problems[task % len(self.problems)]
        self._task, self._cells, self._steps, self._done = task, (), 0, False
        return Observation(self._problem.question, None)

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", None), 0.0, True)
        problem = self.problem
        match = _ACTION.match(action)
        if match is None:
            text = "Invalid action: reply with 'execute: <python code>' or 'answer: <value>'."
            return Transition(Observation(text, None), 0.0, False, False, {"steps": self._steps, "invalid": True})
        self._steps += 1
        body = action[match.end() :]
        if match.group(1).lower() == "answer":
            given = parse_answer(body)
            correct = given is not None and given == problem.answer
            self._done = True
            text = "Correct." if correct else "Wrong answer." if given is not None else "Not a number: wrong answer."
            info = {"steps": self._steps, "correct": correct}
            return Transition(Observation(text, None), float(correct), True, correct, info)
        code = strip_fences(body)
        result = self.run(code)
        if self.persistent and not result.stopped:
            self._cells += (code,)
        info = {"steps": self._steps, "status": result.status, "cells": len(self._cells)}
        return Transition(Observation(result.output or "[no output]", None), 0.0, False, False, info)

    def solution(self) -> list[str]:
        """The winning action of the current task: its answer."""
        return [f"answer: {self.problem.answer_text}"]

    def run(self, code: str) -> RunResult:
        return run_cells(self._cells if self.persistent else (), code, self.limits)

    def snapshot_sync(self) -> MathSnapshot:
        if self._task is None:
            raise RuntimeError("reset the env before snapshotting it")
        return MathSnapshot(self._task, self._cells, self._steps, self._done)

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, MathSnapshot)
        self._problem = self.problems[state.task % len(self.problems)]
        self._task, self._cells = state.task, state.cells
        self._steps, self._done = state.steps, state.done

    # A run is a subprocess (~0.2 s and up): keep it off the event loop.
    async def step(self, action: str) -> Transition:
        return await asyncio.to_thread(self.step_sync, action)


@register("math")
def make_math(
    cpu_s: float = 5.0,
    memory_mb: int = 1024,
    max_output_chars: int = 2000,
    persistent: bool = True,
    problems_file: str | None = None,
) -> MathCodeEnv:
    return MathCodeEnv(cpu_s, memory_mb, max_output_chars, persistent, problems_file)
