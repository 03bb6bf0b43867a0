"""Single-player TextArena games that run offline, as text environments.

Supported: TowerOfHanoi, GuessTheNumber, Minesweeper and Crosswords, in any of the
difficulty variants TextArena registers (`game="Minesweeper-v0-small"`, ...). The raw
game is used (no TextArena wrappers); the observation is the game's own new messages
since the last step (the agent's echoed action left out).

Task index `i` is the game TextArena deals after `reset(seed=i)`. TowerOfHanoi has no
randomness: every task index is the same puzzle. TextArena games draw from the *global*
`random` module (State seeds it in reset; Minesweeper places its mines on the first
move); each env keeps its own generator state and swaps it in around every reset and
step (under a lock), so envs stepped in any interleaving stay deterministic and the
generator state is part of the snapshot. (Other code drawing from the global `random`
in another thread *during* a TextArena step would see the swapped-in state.) Snapshot = deepcopy of the raw game + that generator state.

Valid actions: TowerOfHanoi the legal moves, GuessTheNumber the numbers not guessed
yet, Minesweeper the unrevealed cells. Crosswords has none listed (free text: one
`[row col letter]` per turn; cells x letters would be hundreds of strings).
TextArena's own rules apply to anything else: the first invalid move gets a warning,
a second one in a row ends the game.

Reward: TextArena's final reward (1 when solved, else the game's partial-completion
score in [0, 1]) on the step that ends the game, 0 on the others; success = solved.
"""

from __future__ import annotations

import copy
import functools
import random
import threading
from dataclasses import dataclass
from typing import Any

from thicket.envs import register
from thicket.envs.protocol import Observation, SyncEnv, Transition

GAMES = ("TowerOfHanoi", "GuessTheNumber", "Minesweeper", "Crosswords")

_HOW_TO = {
    "TowerOfHanoi": "Move one disk per turn by naming the source and target towers, e.g. [A C].",
    "GuessTheNumber": "Guess one number per turn in square brackets, e.g. [7]; you are told higher or lower.",
    "Minesweeper": "Reveal one cell per turn as [row col], e.g. [3 2]; avoid the mines.",
    "Crosswords": "Fill one cell per turn as [row col letter], e.g. [0 2 d].",
}


_random_lock = threading.RLock()

# Read-only game data that snapshots share instead of copying (Crosswords' word list).
_SHARED_ATTRS = ("word_data",)


def _copy_game(game: Any) -> Any:
    memo: dict[int, Any] = {}
    for name in _SHARED_ATTRS:
        if hasattr(game, name):
            memo[id(getattr(game, name))] = getattr(game, name)
    return copy.deepcopy(game, memo)


@dataclass(frozen=True)
class TextArenaSnapshot:
    task: int
    game: Any  # deepcopy of the raw TextArena env; never mutated
    rng_state: Any
    steps: int
    done: bool


@functools.cache
def _registry() -> dict[str, Any]:
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def supported_ids() -> list[str]:
    """TextArena ids of the supported games (all difficulty variants, no wrapper variants)."""
    return sorted(
        i for i in _registry()
        if i.split("-v")[0] in GAMES and not i.endswith(("-raw", "-train"))
    )


class TextArenaEnv(SyncEnv):
    family = "textarena"
    can_snapshot = True

    def __init__(self, game: str = "TowerOfHanoi-v0", seed_offset: int = 0) -> None:
        base = game.split("-v")[0]
        if base not in GAMES:
            raise ValueError(f"textarena game {game!r} is not supported offline; use one of {GAMES}")
        if game not in _registry():
            raise ValueError(f"unknown textarena id {game!r}; known: {supported_ids()}")
        self.game_id = game
        self.base = base
        self.seed_offset = seed_offset
        self._game: Any = None
        self._rng_state: Any = None
        self._task: int | None = None
        self._steps = 0
        self._done = False

    @property
    def instructions(self) -> str:
        return (
            f"You are playing {self.base} (TextArena, single player). The game explains its "
            f"rules in its first message. {_HOW_TO[self.base]} Answer with the move only."
        )

    @property
    def game(self) -> Any:
        """The raw TextArena env of the current episode."""
        if self._game is None:
            raise RuntimeError("reset the env before stepping it")
        return self._game

    def _run(self, fn: Any, *args: Any) -> Any:
        """Call into the game with this env's generator as the global `random` state."""
        with _random_lock:  # TextArena envs stepped from several threads take turns
            outer = random.getstate()
            if self._rng_state is not None:
                random.setstate(self._rng_state)
            try:
                return fn(*args)
            finally:
                self._rng_state = random.getstate()
                random.setstate(outer)

    def reset_sync(self, task: int) -> Observation:
        import textarena

        self._game = textarena.make(f"{self.game_id}-raw")
        self._rng_state = None
        self._run(self._game.reset, 1, task + self.seed_offset)  # State seeds `random`
        self._task, self._steps, self._done = task, 0, False
        return Observation(self._messages(), self._valid())

    def step_sync(self, action: str) -> Transition:
        if self._done:
            return Transition(Observation("The episode is over.", ()), 0.0, True)
        game = self.game
        self._run(game.step, action.strip())
        self._steps += 1
        state = game.state
        self._done = bool(state.done)
        reward, success = 0.0, False
        info: dict[str, Any] = {"steps": self._steps}
        text = self._messages()
        if self._done:
            raw = float((state.rewards or {}).get(0, 0.0))
            reason = state.game_info.get(0, {}).get("reason")
            success = raw >= 1.0
            reward = min(max(raw, 0.0), 1.0)
            info.update(raw_reward=raw, reason=reason, invalid_move=state.game_info[0].get("invalid_move", False))
            if reason:
                text = f"{text}\n{reason}".strip()
        return Transition(Observation(text, self._valid()), reward, self._done, success, info)

    def _messages(self) -> str:
        from textarena.core import ObservationType

        _, messages = self.game.get_observation()
        lines = [
            str(message).strip()
            for _, message, kind in messages
            if kind != ObservationType.PLAYER_ACTION
        ]
        return "\n".join(line for line in lines if line)

    def _valid(self) -> tuple[str, ...] | None:
        if self._done:
            return ()
        game = self.game
        if self.base == "TowerOfHanoi":
            towers = game.state.game_state["towers"]
            return tuple(
                f"[{a} {b}]"
                for a in "ABC"
                for b in "ABC"
                if a != b and towers[a] and (not towers[b] or towers[b][-1] > towers[a][-1])
            )
        if self.base == "GuessTheNumber":
            return tuple(
                f"[{n}]"
                for n in range(game.min_number, game.max_number + 1)
                if n not in game.guessed_numbers
            )
        if self.base == "Minesweeper":
            return tuple(
                f"[{r} {c}]"
                for r in range(game.rows)
                for c in range(game.cols)
                if not game.revealed[r][c]
            )
        return None

    def snapshot_sync(self) -> TextArenaSnapshot:
        assert self._task is not None, "reset the env before snapshotting it"
        return TextArenaSnapshot(self._task, _copy_game(self.game), self._rng_state, self._steps, self._done)

    def restore_sync(self, state: Any) -> None:
        assert isinstance(state, TextArenaSnapshot)
        self._game = _copy_game(state.game)
        self._rng_state = state.rng_state
        self._task, self._steps, self._done = state.task, state.steps, state.done

    def solution(self) -> list[str]:
        """A winning move sequence from the start of the current task (for tests and demos)."""
        game = self.game
        if self.base == "TowerOfHanoi":
            moves: list[str] = []

            def hanoi(n: int, src: str, dst: str, via: str) -> None:
                if n:
                    hanoi(n - 1, src, via, dst)
                    moves.append(f"[{src} {dst}]")
                    hanoi(n - 1, via, dst, src)

            hanoi(game.num_disks, "A", "C", "B")
            return moves
        if self.base == "GuessTheNumber":
            return [f"[{game.game_number}]"]
        if self.base == "Crosswords":
            board, solution = game.state.game_state["board"], game.state.game_state["solution"]
            return [
                f"[{r} {c} {solution[r][c]}]"
                for r, row in enumerate(board)
                for c, cell in enumerate(row)
                if cell == "_"
            ]
        raise NotImplementedError(f"no scripted solution for {self.base}")


@register("textarena")
def make_textarena(game: str = "TowerOfHanoi-v0", seed_offset: int = 0) -> TextArenaEnv:
    return TextArenaEnv(game, seed_offset)
