"""ScienceWorld (the `scienceworld` package: a Scala simulator in its own JVM).

Task index `i` -> task `TASKS[i % 30]` (the 30 task names, sorted) and variation
`variations[(i // 30) % len(variations)]` of that task's `split` ("train" by default,
or "dev" / "test" / "all"; the split lists come from the simulator, cached per process).

Each env starts one JVM (~200 MB, ~3-9 s) on its first reset and stops it in `close()`
(a worker that makes one env per task pays that start per task). ScienceWorld cannot snapshot: search branches by reset + replay. A reset is
a `load()` of the task (~0.3-1 s; the simulator's own `reset()` is no faster).

Observation: at reset, the task description and the first "look around"; after a step,
the simulator's text, with objects of the same name listed in sorted order (the simulator's
order among them changes between JVMs and loads: `canonical_listing`).

Valid actions: ScienceWorld lists every action-object combination it would accept
(hundreds to ~8,000, mostly nonsense like "connect agent to air" or "focus on air"), and its own gold paths often use actions that are NOT in that list
(other referents, "examine X") - the parser accepts any text. So the list is a hint, not
the action space, and this env:
  - drops "reset task" (it would restart the episode under the search's feet) and every
    action naming the agent itself ("connect agent to X", "look at agent", ...);
  - orders the rest by verb usefulness: look around / inventory / task / wait first,
    then moving and handling (go to, open, close, pick up, put down, move X to Y, pour,
    focus on, activate, deactivate, use, mix, read, look at/in, eat, dunk, flush), and
    the combinatorial "connect" / "disconnect" last; alphabetical within a verb;
  - caps it at `max_valid_actions` (default 200; None = all).
Listing is the JVM's most expensive call (0.1-0.4 s): measured on 2 cores, ~4 steps/s
with it and ~50 without, and a reset + 10-step replay takes ~2.5 s with it and ~0.7 s
without - and replays (this env's only way to branch) list at every step too. So
`valid_actions=False` (Observation.valid_actions None, free text, as AgentGym and ETO
run ScienceWorld) is the fast mode for LLM policies; a policy that *constrains* its
output to the list needs the list uncapped (max_valid_actions=None).

Actions that match several objects make the simulator ask "Ambiguous request: Please
enter the number for the action you intended"; the next action may then be that number.

Reward = the simulator's running score / 100 (ScienceWorld scores are cumulative, so the
last step of a path carries the path's score; info["score_delta"] is the step's
change). A negative score (e.g. focusing on the wrong object) ends the episode and is
returned as a negative reward (a disaster). success = score 100. The episode is also
cut (done, not success) after `step_limit` moves, as the package does.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import subprocess
import threading

from thicket.envs import register
from thicket.envs.protocol import ActionFailed, Observation, RewardSemantics, SyncEnv, Transition

SPLITS = ("train", "dev", "test", "all")

# Verb (first words of an action) -> rank; unknown verbs rank just before "connect".
_VERB_ORDER = (
    "look around", "inventory", "task", "wait1", "wait",
    "go to", "open", "close", "pick up", "put down", "move", "pour", "focus on",
    "activate", "deactivate", "use", "mix", "read", "look at", "look in", "eat", "dunk",
    "flush",
)
_LAST_VERBS = ("connect", "disconnect")
_DROPPED = ("reset task",)

INSTRUCTIONS = """\
You are in ScienceWorld, a text-based simulation of a house, a greenhouse, a workshop and
the outdoors, where you carry out elementary-school science tasks (boil water, grow a
plant, test conductivity, ...). The task is stated at the start. Act with short commands:
  look around, look at OBJ, look in OBJ, inventory, task, go to LOCATION, open OBJ,
  close OBJ, pick up OBJ, put down OBJ, move OBJ to OBJ, pour OBJ in OBJ, focus on OBJ,
  activate OBJ, deactivate OBJ, use OBJ on OBJ, mix OBJ, read OBJ, eat OBJ,
  connect OBJ to OBJ, disconnect OBJ, dunk OBJ in OBJ, flush OBJ, wait, wait1.
"focus on OBJ" marks the object the task is about: focusing on the wrong one fails the
task. If the game says a request is ambiguous, answer with the number of the option you
meant. The score (0-100) rises as you complete parts of the task; 100 is success."""


def _verb_rank(action: str) -> int:
    for rank, verb in enumerate(_VERB_ORDER):
        if action == verb or action.startswith(verb + " "):
            return rank
    if action.split(" ", 1)[0] in _LAST_VERBS:
        return len(_VERB_ORDER) + 1
    return len(_VERB_ORDER)


def order_valid_actions(actions: list[str], cap: int | None) -> tuple[str, ...]:
    """Filter, order and cap the simulator's valid-action list (see the module doc)."""
    kept = {a for a in actions if a not in _DROPPED and "agent" not in a.split()}
    ordered = sorted(kept, key=lambda a: (_verb_rank(a), a))
    return tuple(ordered if cap is None else ordered[:cap])


# py4j logs each callback server start and stop at INFO, and logs at INFO, with a traceback, the
# "Exception while shutting down callback server" of every JVM closed; scienceworld logs every task
# load. None of it is thicket's to show (`thicket validate` printed two tracebacks after "ok").
QUIET_LOGGERS = ("py4j", "scienceworld")


def quiet_java_bridge() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


class _Simulator:
    """One JVM running ScienceWorld, started on demand."""

    def __init__(self) -> None:
        quiet_java_bridge()
        from scienceworld import ScienceWorldEnv

        # The package's own step limit check lives in its Python step(); we bypass it.
        self.env = ScienceWorldEnv("", envStepLimit=10**9)
        self.server = self.env.server

    def alive(self) -> bool:
        proc = getattr(self.env._gateway, "java_process", None)
        return proc is None or proc.poll() is None

    def close(self) -> None:
        gateway = self.env._gateway
        with contextlib.suppress(Exception):
            self.env.close()
        proc = getattr(gateway, "java_process", None)
        if proc is not None:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(Exception):
                    proc.wait(timeout=5)


def canonical_listing(text: str) -> str:
    """The simulator's text with each run of adjacent lines that name objects of the same name at
    the same depth sorted. ScienceWorld lists a room's or a container's contents sorted by name,
    but objects of one name (three "a wood cup (containing ... paint)") come in an order that
    differs between JVMs and between loads of a task: measured, 4 of 120 random walks of 8 steps
    in two JVMs differed by it. Sorted, the same actions give the same text, which checkpoints'
    replays and reproducible trees rely on. A run followed by a deeper line (the last one's
    contents) is left as it is."""
    lines = text.split("\n")
    out: list[str] = []
    start = 0
    while start < len(lines):
        key, end = _sibling_key(lines[start]), start + 1
        while key is not None and end < len(lines) and _sibling_key(lines[end]) == key:
            end += 1
        run = lines[start:end]
        last_has_contents = key is not None and end < len(lines) and _depth(lines[end]) > key[0]
        if len(run) > 1 and not last_has_contents:
            run = sorted(run)
        out += run
        start = end
    return "\n".join(out)


def _depth(line: str) -> int:
    return len(line) - len(line.lstrip("\t"))


def _sibling_key(line: str) -> tuple[int, str] | None:
    """(depth, object name) of a listed object's line ("\ta wood cup (containing red paint)")."""
    depth = _depth(line)
    return (depth, line[depth:].split(" (", 1)[0]) if depth else None


_split_lock = threading.Lock()


@functools.cache
def task_names() -> tuple[str, ...]:
    """The 30 ScienceWorld task names, sorted (read from the package, no JVM)."""
    from scienceworld.constants import ID2TASK

    return tuple(sorted(ID2TASK.values()))


_SPLIT_CACHE: dict[tuple[str, str], tuple[int, ...]] = {}


class ScienceWorldEnv(SyncEnv):
    family = "sciworld"
    can_snapshot = False
    reward_semantics = RewardSemantics.RUNNING  # score/100 so far, at every step

    def __init__(
        self,
        split: str = "train",
        simplifications: str = "",
        step_limit: int = 100,
        max_valid_actions: int | None = 200,
        valid_actions: bool = True,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
        self.split = split
        self.simplifications = simplifications
        self.step_limit = step_limit
        self.max_valid_actions = max_valid_actions
        self.list_valid_actions = valid_actions
        self._sim: _Simulator | None = None
        self._task: int | None = None
        self._score = 0
        self._steps = 0
        self._done = False

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def sim(self) -> _Simulator:
        if self._sim is None:
            self._sim = _Simulator()
        return self._sim

    # --- tasks ---

    def variations(self, name: str) -> tuple[int, ...]:
        key = (name, self.split)
        with _split_lock:
            if key not in _SPLIT_CACHE:
                server = self.sim.server
                if self.split == "all":
                    found = tuple(range(int(server.getTaskMaxVariations(name))))
                else:
                    self._load(name, 0)
                    getter = {
                        "train": server.getVariationsTrain,
                        "dev": server.getVariationsDev,
                        "test": server.getVariationsTest,
                    }[self.split]
                    found = tuple(int(v) for v in getter())
                _SPLIT_CACHE[key] = found
            return _SPLIT_CACHE[key]

    def task_of(self, task: int) -> tuple[str, int]:
        """(task name, variation) of task index `task`."""
        names = task_names()
        name = names[task % len(names)]
        variations = self.variations(name)
        return name, variations[(task // len(names)) % len(variations)]

    def gold_path(self, task: int) -> list[str]:
        """The simulator's gold action sequence for `task` (loads the task; reset after)."""
        name, variation = self.task_of(task)
        self.sim.env.load(name, variation, self.simplifications, generateGoldPath=True)
        self._task = None
        return list(self.sim.server.getGoldActionSequence())

    def solution(self) -> list[str]:
        """The gold path of the current task, cut where it completes the task (gold paths
        may go on with a few "wait1"s). Leaves the env reset to the task."""
        if self._task is None:
            raise RuntimeError("reset the env first")
        task, listing = self._task, self.list_valid_actions
        plan = self.gold_path(task)
        self.list_valid_actions = False  # not needed to find where the plan succeeds
        try:
            self.reset_sync(task)
            for i, action in enumerate(plan):
                t = self.step_sync(action)
                if t.done:
                    plan = plan[: i + 1] if t.success else []
                    break
        finally:
            self.list_valid_actions = listing
        self.reset_sync(task)
        return plan

    def _load(self, name: str, variation: int) -> None:
        # Always load(): the simulator's reset() replays its load and measured slower.
        self.sim.env.load(name, variation, self.simplifications)

    # --- protocol ---

    def reset_sync(self, task: int) -> Observation:
        name, variation = self.task_of(task)
        self._load(name, variation)
        server = self.sim.server
        look = canonical_listing(str(server.step("look around")))
        description = str(server.getTaskDescription())
        self._task, self._score, self._steps, self._done = task, 0, 0, False
        return Observation(f"{description}\n\n{look}".strip(), self._valid())

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", ()), 0.0, True)
        if self._task is None:
            raise RuntimeError("reset the env before stepping it")
        server = self.sim.server
        text = canonical_listing(str(server.step(" ".join(action.strip().split()))))
        score = round(100 * float(server.getScore()))
        completed = bool(server.getCompleted())
        moves = int(server.getNumMoves())
        delta, self._score = score - self._score, score
        self._steps += 1
        success = score >= 100
        truncated = moves > self.step_limit and not (completed or score < 0)
        self._done = completed or score < 0 or success or truncated
        info = {"score": score, "score_delta": delta, "moves": moves, "steps": self._steps, "truncated": truncated}
        reward = max(min(score / 100.0, 1.0), -1.0)
        observation = Observation(text, () if self._done else self._valid())
        return Transition(observation, reward, self._done, success, info)

    def _valid(self) -> tuple[str, ...] | None:
        if not self.list_valid_actions:
            return None
        raw = json.loads(str(self.sim.server.getValidActionObjectCombinationsJSON()))["validActions"]
        return order_valid_actions([str(a["action"]) for a in raw], self.max_valid_actions)

    def close_sync(self) -> None:
        if self._sim is not None:
            self._sim.close()
            self._sim = None
        self._task = None

    # JVM round trips take 30-250 ms: keep them off the event loop.

    async def reset(self, task: int) -> Observation:
        return await asyncio.to_thread(self.reset_sync, task)

    async def step(self, action: str) -> Transition:
        # Cancellation (a task timeout) reaches the await, not the thread: it passes through as is.
        return await asyncio.to_thread(self._step_or_fail, action)

    def _step_or_fail(self, action: str) -> Transition:
        """step_sync, with any exception of the simulator (a py4j or Java error) raised as
        ActionFailed, as SyncEnv.step does for in-process envs: the search keeps the action as
        an error leaf and the tree goes on (its next move resets and replays). A JVM that
        died is dropped, so that the next reset starts a fresh one."""
        try:
            return self.step_sync(action)
        except Exception as err:
            if self._sim is not None and not self._sim.alive():
                self.close_sync()
            raise ActionFailed(f"{self.family} raised {type(err).__name__} on {action[:80]!r}: {err}") from err

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close_sync()


@register("sciworld")
def make_sciworld(
    split: str = "train",
    simplifications: str = "",
    step_limit: int = 100,
    max_valid_actions: int | None = 200,
    valid_actions: bool = True,
) -> ScienceWorldEnv:
    return ScienceWorldEnv(split, simplifications, step_limit, max_valid_actions, valid_actions)
