"""TextWorld text adventures, generated offline, as text environments.

Task index `i` is the game TextWorld's generator makes with seed `seed_offset + i`
(the code path `tw-make` runs, called in-process: no 2 s interpreter start per game).
The default is a "custom" game (`tw-make custom --world-size 5 --nb-objects 10
--quest-length 5`); `challenge="tw-simple"` / `"tw-coin_collector"` /
`"tw-treasure_hunter"` / `"tw-cooking"` with `settings` (the challenge's tw-make
flags, e.g. {"rewards": "dense", "goal": "detailed"}) make those instead. A seed is kept
only if the generator's walkthrough wins the game exactly at its last command (some
seeds give names the parser finds ambiguous); otherwise the next candidate seed (task +
k * 1,000,003) is tried, so `walkthrough` is always a gold path. Generation takes ~2-5 s
per game on 2 cores (Inform 7 compilation included; the first game of a process ~10 s
more: TextWorld parses its text grammars once). Custom and tw-treasure_hunter games are
the same in every process; the game JSON of tw-cooking, tw-simple and tw-coin_collector
varies with the process's string hash seed (PYTHONHASHSEED), so two processes may make
different files for one task (cooking task 0: same opening and walkthrough). Games are
cached under `cache_dir` (default ~/.cache/thicket/textworld, or
$THICKET_TEXTWORLD_CACHE), in a folder named by a hash of the settings and the generator
version, one folder per task (`task_N/game.z8` + `game.json`) published by one atomic
rename, so worker processes can share the cache: the first complete game wins, and a
game and its JSON always come from the same generation.

Concurrency: resets run in threads (several trees, or several server instances, per
process), but TextWorld is not thread-safe. textworld.logic and textworld.textgen each
parse with one module-level tatsu parser that keeps its parse state (rule and state
stacks, memo) on the parser object, so two parses at once corrupt each other (IndexError
"pop from empty list", TypeError "'NoneType' object is not iterable", FailedParse). They
parse while generating (knowledge base and text grammars) and while loading a game
(textworld.start parses the game's logic the first time a process sees it). Both run
under one process-wide lock (`_TEXTWORLD`); Inform 7 compilation (subprocesses) and play
(each env has its own game objects and its own copy of jericho's frotz library) run
outside it, and a game is generated once per process however many envs ask for it.
Generation leaves sys.stdout alone: contextlib.redirect_stdout swaps the stdout of the
whole process, and two generations overlapping in threads left it pointing at a dead
StringIO (TextWorld prints nothing while generating these games).

Valid actions are TextWorld's admissible commands (sorted); any other text goes to the
parser as well. reward = score / max_score (the game's running score, so the last step
of a path carries the path's score); success = the game is won.

Snapshots are exact: the Z-machine state (jericho get_state: RAM, stack, registers and
the interpreter's RNG; ~40 KB) plus TextWorld's own per-episode bookkeeping (quest
progression, winning policy, move count, last game states). Restoring into a fresh
instance of the same settings works too. A snapshot + restore pair costs ~3 ms (the
quest-progression copy dominates); a step ~2.5 ms (TextWorld's logic engine computing
the admissible commands dominates).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thicket.envs import register
from thicket.envs.cache_dir import cache_root, publishing
from thicket.envs.protocol import Observation, RewardSemantics, SyncEnv, Transition

log = logging.getLogger("thicket.envs.textworld")

INSTRUCTIONS = """\
You are playing a TextWorld text adventure. The game describes where you are and gives
you a task (an objective). Act with short imperative commands such as "go north",
"open chest", "take key from chest", "unlock door with key", "put apple on table",
"insert pillow into box", "eat apple", "look", "inventory", "examine X".
The episode ends with success when the objective is completed."""

# Keys of a wrapper layer's __dict__ that point at fixed game data or at the next layer.
_FIXED = frozenset(
    {"_wrapped_env", "_jericho", "_game", "_inform7", "_gamefile", "gamefile", "request_infos", "_seed"}
)
MAX_SEED_ATTEMPTS = 20
# Bump when the generation or the cache layout below changes: cached games of other
# versions are not reused.
GENERATOR_VERSION = 3
_JERICHO_SEED = 1  # fixed interpreter seed (TextWorld's default, -1, draws one from the clock)


# Defaults for the challenges' tw-make flags (what they need that no flag was given for).
CHALLENGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "tw-simple": {"rewards": "dense", "goal": "detailed", "test": False},
    "tw-coin_collector": {"level": 1},
    "tw-treasure_hunter": {"level": 1},
    "tw-cooking": {"recipe": 1, "take": 1, "go": 1, "open": True, "split": "train", "recipe_seed": 0},
}


# TextWorld's parsers are shared by every thread (see the module's docstring): whatever may
# parse (generating a game, textworld.start) holds this lock. Never held across a step.
_TEXTWORLD = threading.Lock()
# One lock per game being generated in this process, so that two envs asking for the same
# missing game generate it once (the second waits for the first, then loads its game).
_GENERATING: dict[Path, threading.Lock] = {}
_GENERATING_GUARD = threading.Lock()


@contextlib.contextmanager
def _generating(target: Path) -> Iterator[None]:
    with _GENERATING_GUARD:
        lock = _GENERATING.setdefault(target, threading.Lock())
    with lock:
        yield


def _start(path: Path, infos: Any) -> Any:
    """textworld.start (it parses the game's logic the first time this process sees it)."""
    with _TEXTWORLD:
        import textworld

        return textworld.start(str(path), request_infos=infos)


def default_cache_dir() -> Path:
    return cache_root("textworld", "THICKET_TEXTWORLD_CACHE")


@dataclass(frozen=True)
class GameSettings:
    challenge: str = "custom"
    world_size: int = 5
    nb_objects: int = 10
    quest_length: int = 5
    settings: tuple[tuple[str, Any], ...] = ()
    seed_offset: int = 0

    @property
    def key(self) -> str:
        import textworld

        blob = json.dumps(
            [GENERATOR_VERSION, textworld.__version__, *self.__dict__.values()], default=list, sort_keys=True
        )
        name = self.challenge.removeprefix("tw-").replace("_", "-")
        return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _options(settings: GameSettings, seed: int, path: Path) -> Any:
    from textworld import GameOptions

    options = GameOptions()
    options.seeds = seed
    options.path = str(path)
    options.file_ext = ".z8"
    options.force_recompile = True
    if settings.challenge == "custom":
        options.nb_rooms = settings.world_size
        options.nb_objects = settings.nb_objects
        options.chaining.min_length = settings.quest_length
        options.chaining.max_length = settings.quest_length
        options.chaining.max_depth = settings.quest_length
    return options


def _make_game(settings: GameSettings, seed: int, path: Path) -> Any:
    import textworld.challenges
    from textworld.generator import make_game

    options = _options(settings, seed, path)
    if settings.challenge == "custom":
        return make_game(options), options
    if settings.challenge not in textworld.challenges.CHALLENGES:
        raise ValueError(f"unknown TextWorld challenge {settings.challenge!r}")
    _, make, _ = textworld.challenges.CHALLENGES[settings.challenge]
    flags = CHALLENGE_DEFAULTS.get(settings.challenge, {}) | dict(settings.settings)
    return make(settings=flags, options=options), options


def game_file(settings: GameSettings, task: int, cache_dir: Path) -> Path:
    """The compiled game of task `task` (its JSON beside it), generating and caching it on
    first use. Safe from several threads and several processes at once."""
    target = cache_dir / settings.key / f"task_{task}"
    game = target / "game.z8"
    if not game.exists():
        with _generating(target):
            if not game.exists():  # another thread of this process may have made it meanwhile
                _generate(settings, task, target)
    return game


def _generate(settings: GameSettings, task: int, target: Path) -> None:
    from textworld.generator import compile_game
    from textworld.generator.chaining import QuestGenerationError

    started = time.monotonic()
    with publishing(target, "game.z8") as publication:
        work = publication.work
        problem = ""
        # A seed whose world admits no quest of the asked length, or whose walkthrough
        # does not win at its last command (the parser can find "locker" ambiguous beside
        # "type 0 locker"):
        # try the next candidate seed (the same sequence in every process).
        for attempt in range(MAX_SEED_ATTEMPTS):
            seed = settings.seed_offset + task + attempt * 1_000_003
            try:
                with _TEXTWORLD:  # builds the world and its text: parses (see _TEXTWORLD)
                    game, options = _make_game(settings, seed, work / "game.z8")
            except QuestGenerationError as err:
                problem = str(err)
                continue
            compile_game(game, options)  # Inform 7 and Inform 6 subprocesses: no lock
            if _walkthrough_wins(work / "game.z8"):
                break
            problem = f"the walkthrough of seed {seed} does not win"
        else:
            raise RuntimeError(f"TextWorld could not generate task {task}: {problem}")
    if publication.published:
        log.info("textworld: %s/%s generated (seed %d) in %.1f s", target.parent.name, target.name, seed,
                 time.monotonic() - started)
    else:
        log.info("textworld: %s/%s: another process published it first; its copy is kept",
                 target.parent.name, target.name)


def _walkthrough_wins(path: Path) -> bool:
    from textworld import EnvInfos

    env = _start(path, EnvInfos(won=True, extras=["walkthrough"]))
    try:
        env.seed(_JERICHO_SEED)
        state = env.reset()
        walkthrough = state.get("extra.walkthrough") or ()
        for i, command in enumerate(walkthrough):
            state, _, done = env.step(command)
            if done:  # the walkthrough must win, and exactly at its last command
                return bool(state["won"]) and i == len(walkthrough) - 1
        return False
    finally:
        env.close()


_BANNER_JUNK = re.compile(r"^\s*>|Would you like to RESTART")


def clean_feedback(text: str) -> str:
    """Drop the ASCII-art banner, the prompt/status line and the restart question."""
    lines = [
        line.rstrip()
        for line in text.splitlines()
        if not _BANNER_JUNK.search(line) and (any(c.isalnum() for c in line) or not line.strip())
    ]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def _copy_value(value: Any) -> Any:
    from textworld.core import GameState
    from textworld.generator.game import GameProgression

    if isinstance(value, GameState):
        # Shallow: its values are replaced, never mutated, once the step that made it is
        # over (GameState.copy() would deepcopy the whole Game each time: seconds).
        return GameState(value)
    if isinstance(value, GameProgression):
        return value.copy()
    if isinstance(value, list):
        return list(value)
    return value


@dataclass(frozen=True)
class TextWorldSnapshot:
    task: int
    zmachine: Any  # jericho get_state(): (ram, stack, pc, sp, fp, frames, opcode, rng, narrative)
    layers: tuple[dict[str, Any], ...]  # per wrapper layer, its per-episode fields
    steps: int
    done: bool
    score: float


class TextWorldEnv(SyncEnv):
    family = "textworld"
    can_snapshot = True
    reward_semantics = RewardSemantics.RUNNING  # score / max_score so far, at every step

    def __init__(self, settings: GameSettings | None = None, cache_dir: str | Path | None = None) -> None:
        self.settings = settings or GameSettings()
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self._tw: Any = None
        self._loaded: Path | None = None
        self._task: int | None = None
        self._steps = 0
        self._done = False
        self._score = 0.0
        self._max_score = 1.0
        self._walkthrough: tuple[str, ...] = ()

    @property
    def instructions(self) -> str:
        return INSTRUCTIONS

    @property
    def walkthrough(self) -> tuple[str, ...]:
        """The generator's winning command sequence for the current task."""
        return self._walkthrough

    def reset_sync(self, task: int) -> Observation:
        self._load(task)
        state = self._tw.reset()
        self._task, self._steps, self._done, self._score = task, 0, False, 0.0
        self._max_score = float(state["max_score"] or 1)
        self._walkthrough = tuple(state.get("extra.walkthrough") or ())
        return self._observation(state)

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", ()), 0.0, True)
        if self._tw is None:
            raise RuntimeError("reset the env before stepping it")
        command = " ".join(action.strip().split())
        state, _, _ = self._tw.step(command)
        self._steps += 1
        won, lost = bool(state["won"]), bool(state["lost"])
        self._done = won or lost
        self._score = float(state["score"] or 0)
        reward = min(max(self._score / self._max_score, 0.0), 1.0)
        info = {"steps": self._steps, "score": self._score, "max_score": self._max_score, "lost": lost}
        return Transition(self._observation(state), reward, self._done, won, info)

    def _observation(self, state: Any) -> Observation:
        text = clean_feedback(state.feedback or "")
        if self._done:
            return Observation(text, ())
        return Observation(text or "Nothing happens.", tuple(state["admissible_commands"] or ()))

    def _load(self, task: int) -> None:
        path = game_file(self.settings, task, self.cache_dir)
        if self._tw is not None and self._loaded == path:
            return
        from textworld import EnvInfos

        self.close_sync()
        infos = EnvInfos(
            admissible_commands=True, won=True, lost=True, score=True, max_score=True,
            moves=True, extras=["walkthrough"],
        )
        self._tw = _start(path, infos)
        self._tw.seed(_JERICHO_SEED)
        self._loaded = path

    def _layers(self) -> list[Any]:
        layers, layer = [], self._tw
        while layer is not None:
            layers.append(layer)
            layer = layer.__dict__.get("_wrapped_env")
        return layers

    def snapshot_sync(self) -> TextWorldSnapshot:
        if self._tw is None or self._task is None:
            raise RuntimeError("reset the env before snapshotting it")
        layers = tuple(
            {k: _copy_value(v) for k, v in vars(layer).items() if k not in _FIXED}
            for layer in self._layers()
        )
        zmachine = self._tw.unwrapped._jericho.get_state()
        return TextWorldSnapshot(self._task, zmachine, layers, self._steps, self._done, self._score)

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, TextWorldSnapshot)
        if self._tw is None or self._task is None or self._task != state.task:
            self.reset_sync(state.task)  # loads the game and sets up the wrappers
        for layer, fields in zip(self._layers(), state.layers, strict=True):
            for key, value in fields.items():
                setattr(layer, key, _copy_value(value))
        ram, stack, *rest = state.zmachine
        self._tw.unwrapped._jericho.set_state((ram.copy(), stack.copy(), *rest))
        self._steps, self._done, self._score = state.steps, state.done, state.score

    def close_sync(self) -> None:
        if self._tw is not None:
            self._tw.close()
        self._tw, self._loaded = None, None

    async def reset(self, task: int) -> Observation:
        # The first reset of a task may generate its game (seconds), and loading a game
        # may wait for another env's generation: off the event loop.
        return await asyncio.to_thread(self.reset_sync, task)

    async def restore(self, state: Any) -> None:
        if self._tw is None or self._task is None or self._task != getattr(state, "task", None):
            await asyncio.to_thread(self.restore_sync, state)  # it resets first: as reset
        else:
            self.restore_sync(state)

    async def close(self) -> None:
        self.close_sync()


@register("textworld")
def make_textworld(
    challenge: str = "custom",
    world_size: int = 5,
    nb_objects: int = 10,
    quest_length: int = 5,
    settings: dict[str, Any] | None = None,
    seed_offset: int = 0,
    cache_dir: str | None = None,
) -> TextWorldEnv:
    game = GameSettings(
        challenge=challenge,
        world_size=world_size,
        nb_objects=nb_objects,
        quest_length=quest_length,
        settings=tuple(sorted((settings or {}).items())),
        seed_offset=seed_offset,
    )
    return TextWorldEnv(game, cache_dir)


