"""TextWorld's games, generated offline and cached: which game task `i` is.

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
under one process-wide lock (`TEXTWORLD_LOCK`); Inform 7 compilation (subprocesses) and play
(each env has its own game objects and its own copy of jericho's frotz library) run
outside it, and a game is generated once per process however many envs ask for it.
Generation leaves sys.stdout alone: contextlib.redirect_stdout swaps the stdout of the
whole process, and two generations overlapping in threads left it pointing at a dead
StringIO (TextWorld prints nothing while generating these games).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thicket.envs.cache_dir import cache_root, cached_folder

log = logging.getLogger("thicket.envs.textworld")

MAX_SEED_ATTEMPTS = 20
# Bump when the generation or the cache layout below changes: cached games of other
# versions are not reused.
GENERATOR_VERSION = 3
JERICHO_SEED = 1  # fixed interpreter seed (TextWorld's default, -1, draws one from the clock)


# Defaults for the challenges' tw-make flags (what they need that no flag was given for).
CHALLENGE_DEFAULTS: dict[str, dict[str, Any]] = {
    "tw-simple": {"rewards": "dense", "goal": "detailed", "test": False},
    "tw-coin_collector": {"level": 1},
    "tw-treasure_hunter": {"level": 1},
    "tw-cooking": {"recipe": 1, "take": 1, "go": 1, "open": True, "split": "train", "recipe_seed": 0},
}


# TextWorld's parsers are shared by every thread (see the module's docstring): whatever may
# parse (generating a game, textworld.start) holds this lock. Never held across a step.
TEXTWORLD_LOCK = threading.Lock()
def start_game(path: Path, infos: Any) -> Any:
    """textworld.start (it parses the game's logic the first time this process sees it)."""
    with TEXTWORLD_LOCK:
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
    return cached_folder(target, "game.z8", lambda work: _generate(settings, task, work), log) / "game.z8"


def _generate(settings: GameSettings, task: int, work: Path) -> str:
    from textworld.generator import compile_game
    from textworld.generator.chaining import QuestGenerationError

    problem = ""
    # A seed whose world admits no quest of the asked length, or whose walkthrough does not
    # win at its last command (the parser can find "locker" ambiguous beside "type 0
    # locker"): try the next candidate seed (the same sequence in every process).
    for attempt in range(MAX_SEED_ATTEMPTS):
        seed = settings.seed_offset + task + attempt * 1_000_003
        try:
            with TEXTWORLD_LOCK:  # builds the world and its text: parses (see TEXTWORLD_LOCK)
                game, options = _make_game(settings, seed, work / "game.z8")
        except QuestGenerationError as err:
            problem = str(err)
            continue
        compile_game(game, options)  # Inform 7 and Inform 6 subprocesses: no lock
        if _walkthrough_wins(work / "game.z8"):
            return f"seed {seed}"
        problem = f"the walkthrough of seed {seed} does not win"
    raise RuntimeError(f"TextWorld could not generate task {task}: {problem}")


def _walkthrough_wins(path: Path) -> bool:
    from textworld import EnvInfos

    env = start_game(path, EnvInfos(won=True, extras=["walkthrough"]))
    try:
        env.seed(JERICHO_SEED)
        state = env.reset()
        walkthrough = state.get("extra.walkthrough") or ()
        for i, command in enumerate(walkthrough):
            state, _, done = env.step(command)
            if done:  # the walkthrough must win, and exactly at its last command
                return bool(state["won"]) and i == len(walkthrough) - 1
        return False
    finally:
        env.close()
