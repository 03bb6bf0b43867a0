"""One loaded ALFWorld game on TextWorld's PDDL engine (textworld.envs.pddl.PddlEnv over
Fast Downward's libdownward), with exact snapshots.

Thread safety: loading translates the PDDL with Fast Downward's translator (it rewrites
sys.argv and captures sys.stdout) and parses the grammar, and every step and reset parses
text templates and conditions with TextWorld's module-level tatsu parsers. All of it runs
under the process-wide TextWorld lock of `thicket.envs.textworld_generate`. Each engine
loads its own copy of libdownward (Fast Downward's `load_lib` copies the library file),
so engines do not share planner state.

Snapshots: libdownward keeps every state it reaches in a registry and can be put back in
any of them (`get_state_id` / `set_state_id`); the Python side (the fact set, the
applicable operators, the last game state) is copied beside the id. Reset restores the
opening snapshot, so only the first reset of a game in an engine pays for the PDDL
translation.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import itertools
import sys
import threading
import weakref
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from thicket.envs.alfworld.names import display_names
from thicket.envs.textworld_generate import TEXTWORLD_LOCK


_SERIALS = itertools.count(1)


@dataclass(frozen=True)
class EngineSnapshot:
    state_id: int
    facts: dict[Any, set[Any]]
    vars_by_name: dict[str, Any]
    vars_by_type: dict[str, set[Any]]
    var_counts: Counter[str]
    operators: dict[int, Any]
    game_state: Any  # textworld GameState of the last step (feedback, admissible commands)
    moves: int


@dataclass(frozen=True)
class StepResult:
    feedback: str
    admissible: tuple[str, ...]
    won: bool


def _copy_sets(d: dict[Any, set[Any]]) -> defaultdict[Any, set[Any]]:
    return defaultdict(set, {k: set(v) for k, v in d.items()})


class Engine:
    """A game loaded from its game data (domain, grammar with the task, problem)."""

    def __init__(self, game_data: dict[str, Any]) -> None:
        self.serial = next(_SERIALS)  # names this engine in snapshots (ids of dead objects recur)
        self._lib = _acquire_lib()
        # the copy goes back to the pool on close(), or when an unclosed engine is collected
        self._release = weakref.finalize(self, _release_lib, self._lib)
        try:
            with TEXTWORLD_LOCK:
                _memoize_text_parsing()
                argv = list(sys.argv)  # Fast Downward's translator overwrites sys.argv
                try:
                    with _one_translation():
                        self._load(game_data)
                finally:
                    sys.argv[:] = argv
        except BaseException:
            self._release()
            raise
        self._opening = self.snapshot()

    def _load(self, game_data: dict[str, Any]) -> None:
        import textworld
        from textworld.envs.pddl import PddlEnv

        self._env = PddlEnv.__new__(PddlEnv)  # PddlEnv() would load a fresh libdownward
        textworld.Environment.__init__(self._env, textworld.EnvInfos(admissible_commands=True, won=True))
        self._env.downward_lib = self._lib
        self._env.load(game_data)
        names = display_names(self._env._entity_infos)
        for key, info in self._env._entity_infos.items():
            info.name = names[key]
        self._first_reset()

    def _first_reset(self) -> None:
        """PddlEnv.reset without building a second PddlState: the one load() built is in
        the opening state (PddlEnv.reset would translate the PDDL again: seconds)."""
        from textworld.core import GameState

        env = self._env
        env.prev_state, env._last_action, env._moves = None, None, 0
        env.state = GameState()
        state = env._pddl_state
        context = {"state": state, "facts": list(state.facts), "variables": {}, "mapping": {},
                   "entity_infos": env._entity_infos}
        env.state.feedback = env._logic.grammar.derive("#intro#", context)
        env.state.raw = env.state.feedback
        env._gather_infos()

    @property
    def current(self) -> StepResult:
        state = self._env.state
        return StepResult(state.feedback or "", tuple(state["admissible_commands"] or ()), bool(state["won"]))

    def reset(self) -> StepResult:
        self.restore(self._opening)
        return self.current

    def step(self, command: str) -> StepResult:
        with TEXTWORLD_LOCK:
            self._env.step(command)
        return self.current

    def snapshot(self) -> EngineSnapshot:
        env, state = self._env, self._env._pddl_state
        return EngineSnapshot(
            self._lib.get_state_id(), _copy_sets(state._facts), dict(state._vars_by_name),
            _copy_sets(state._vars_by_type), Counter(state._var_counts), dict(state._operators),
            env.state, env._moves,
        )

    def restore(self, snap: EngineSnapshot) -> None:
        env, state = self._env, self._env._pddl_state
        self._lib.set_state_id(snap.state_id)
        state._facts = _copy_sets(snap.facts)
        state._vars_by_name = dict(snap.vars_by_name)
        state._vars_by_type = _copy_sets(snap.vars_by_type)
        state._var_counts = Counter(snap.var_counts)
        state._operators = dict(snap.operators)
        env.state, env._moves = snap.game_state, snap.moves

    def close(self) -> None:
        self._release()  # once: a finalizer runs at most once
        self._lib = None


# Loaded copies of libdownward not in use. A copy is never unloaded: loading a new copy
# after dlclose-ing one crashed the process (segmentation fault in dlopen), so copies are
# kept and reused (loading a game's SAS task replaces the previous one's).
_FREE_LIBS: list[Any] = []
_LIBS_GUARD = threading.Lock()


def _acquire_lib() -> Any:
    with _LIBS_GUARD:
        if _FREE_LIBS:
            return _FREE_LIBS.pop()
    from fast_downward import load_lib

    lib = load_lib()
    lib.get_state_id.restype = ctypes.c_int
    lib.set_state_id.argtypes = [ctypes.c_int]
    lib.set_state_id.restype = None
    return lib


def _release_lib(lib: Any) -> None:
    with _LIBS_GUARD:
        _FREE_LIBS.append(lib)


@functools.cache
def _memoize_text_parsing() -> None:
    """Parse each text template and condition of TextWorld's PDDL text generator once.

    Every step derives the feedback and one command per applicable action, parsing the same
    few dozen strings with tatsu each time (2/3 of a step). The parsed symbols are mutated
    while deriving, so each call gets a deep copy of the parsed form; parsed conditions
    (Rule objects) are only read. Scoped to `textworld.envs.pddl.textgen`, which only PDDL
    games use. Measured: 70-190 ms a step before, 22-60 ms after, transcripts identical.
    Called under the TextWorld lock; the memo is only used under it."""
    import textworld.envs.pddl.textgen as textgen
    from textworld.logic import Rule

    parse = textgen._parse_and_convert
    parsed: dict[tuple[str, str], Any] = {}

    def parse_once(text: str, rule_name: str, **_: Any) -> Any:
        key = (text, rule_name)
        if key not in parsed:
            parsed[key] = parse(text, rule_name=rule_name)
        return copy.deepcopy(parsed[key])

    class _ParsedOnceRule(Rule):
        @classmethod
        @functools.cache
        def parse_conjunctive_query(cls, expression: str) -> Any:
            return Rule.parse_conjunctive_query(expression)

    textgen._parse_and_convert = parse_once
    textgen.Rule = _ParsedOnceRule


@contextlib.contextmanager
def _one_translation() -> Iterator[None]:
    """Translate the game's PDDL once, not twice: TextWorld's PddlState also translates it
    with Fast Downward's optimising options, for replanning only (its `walkthrough` and
    `policy_commands` infos), which this engine never asks for; its replanner gets the
    plain translation. Saves ~0.9 s of a ~2.5 s load. Called under the TextWorld lock."""
    import fast_downward

    translate = fast_downward.pddl2sas
    done: dict[tuple[str, str], Any] = {}

    def once(domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        if (domain, problem) not in done:
            done[domain, problem] = translate(domain, problem, verbose=verbose)
        return done[domain, problem]

    fast_downward.pddl2sas = once
    try:
        yield
    finally:
        fast_downward.pddl2sas = translate
