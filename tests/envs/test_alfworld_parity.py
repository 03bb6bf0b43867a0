"""Generated ALFWorld games against ALFWorld's own engine stack (issue 50, point 7): generated
tasks 0-35 (six of each task type), each loaded in ALFWorld 0.4.2's stack
(tests/support/alfworld_stack.py: textworld.gym + AlfredDemangler + AlfredInfos, the stack
alfworld/agents/environment/alfred_tw_env.py's AlfredTWEnv.init_env registers) and in
thicket's env (presentation `alfworld`, the raw text), checking:

1. the first observation's text and the admissible commands are ALFWorld's, listed in
   ALFWorld's order;
2. thicket's gold path (the game file's walkthrough, `expert.gold_steps`) played in both
   reads the same at every step (text, admissible commands, `won`/`done`) and wins at its last
   step in both. One documented difference is compared as documented (docs/envs/alfworld.md,
   rule "the last step's valid actions"): the step that ends the episode (won, or at the step
   limit) lists no valid actions in thicket, where ALFWorld lists the admissible commands;
3. ALFWorld's handcoded expert (alfworld 0.4.2: alfworld/agents/expert/handcoded_expert.py,
   handcoded_expert_tw.py, behind the AlfredExpert wrapper of
   alfworld/agents/environment/alfred_tw_env.py, which puts its next command in the
   `expert_plan` info), played in ALFWorld's stack: each of its commands goes to thicket's env
   too, the two read the same at every step, and thicket reports success at the very step
   ALFWorld reports `won`.

Both wordings are played for all 36 games. ALFWorld 0.4.2's handcoded expert places things
with "move X to Y" (its TW policies test `"move {obj} to {parent}"` against the admissible
commands): the 2.1.2 wording, the wheel's own. In the 2.1.1 wording that command does not
exist, so the expert falls back to "look" and random admissible commands and wins placing
tasks only by chance; it is played there only on the look_at_obj_in_light games, which place
nothing. Its random choices (which of several objects to take; its fallbacks) are seeded per
game. That expert does not always win pick_two_obj_and_place games (see PICK_TWO): where it
loses in ALFWorld's stack, thicket must lose the same way, step for step, to the step limit
(200: TextWorld's limit in the stack, thicket's `max_steps` in the env), and the case is
marked xfail. ALFWorld's files are used as installed (the wheel), nothing of them is copied here.

The 72 game-wordings are played once for the module, two processes at a time: ~4 minutes on
2 cores with the games cached (about 2,200 steps in each stack), hence the slow tier.
"""

from __future__ import annotations

import multiprocessing
import random
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from thicket.envs.alfworld import tasks
from thicket.envs.alfworld.wording import Wording

pytestmark = pytest.mark.slow

GAMES = range(36)  # six of each task type (task i is type i mod 6)
STEP_LIMIT = 200  # ALFWorld's stack's max_episode_steps; AlfredExpert's own expert gives up after 200 steps
EXPERT_211 = {"look_at_obj_in_light"}  # the one task type whose expert commands the 2.1.1 wording has


# ALFWorld 0.4.2's handcoded expert places with "move X to Y" but drops the object from its
# inventory only after a command containing "put" (BasePolicy.update_state_tracking): after the
# first of two objects it keeps offering to move that first one again, which is not admissible,
# so AlfredExpert answers "look" and the expert wanders on random admissible commands. It wins a
# pick_two_obj_and_place game only by chance, in ALFWorld's stack and in thicket alike.
PICK_TWO = ("ALFWorld's expert loses pick_two_obj_and_place games it does not win by chance (its inventory "
            "is popped on 'put', its commands say 'move'): lost in ALFWorld's stack too, step for step")


@dataclass(frozen=True)
class Seen:
    """One answer, as each side shows it."""
    command: str
    alf_text: str
    alf_admissible: tuple[str, ...]
    alf_won: bool
    alf_done: bool
    text: str
    valid: tuple[str, ...]
    reward: float
    done: bool
    success: bool


@dataclass
class Played:
    game: int
    wording: str
    task_type: str
    opening: Seen
    gold: list[Seen] = field(default_factory=list)
    expert: list[Seen] | None = None  # None: the expert was not played on this game-wording


def _play(cache_dir: str, wording: str, game: int) -> Played:
    from tests.support.alfworld_stack import AlfWorldStack, Step
    from thicket.envs import make_env
    from thicket.envs.alfworld import cache, expert
    from thicket.envs.alfworld.env import AlfWorldEnv
    from thicket.envs.protocol import Observation, Transition

    def seen(command: str, alf: Step, t: Transition | Observation) -> Seen:
        if isinstance(t, Observation):
            return Seen(command, alf.text, tuple(alf.admissible), alf.won, alf.done, t.text,
                        tuple(t.valid_actions or ()), 0.0, False, False)
        return Seen(command, alf.text, tuple(alf.admissible), alf.won, alf.done, t.observation.text,
                    tuple(t.observation.valid_actions or ()), t.reward, t.done, t.success)

    w = Wording(wording)
    folder = cache.game_dir(game, w, Path(cache_dir))
    # presentation: alfworld (the raw text); TextWorld's step limit as thicket's `max_steps`
    env = make_env("alfworld", cache_dir=cache_dir, wording=wording, max_steps=STEP_LIMIT)
    assert isinstance(env, AlfWorldEnv)
    task_type = tasks.task_type_of(game)
    plays_expert = _plays_expert(w, game)
    stack = AlfWorldStack(folder, max_episode_steps=STEP_LIMIT, expert=plays_expert)
    try:
        played = Played(game, wording, task_type, seen("", stack.reset(), env.reset_sync(game)))
        for _, command in expert.gold_steps(game, Path(cache_dir), w):
            played.gold.append(seen(command, stack.step(command), env.step_sync(command)))
        if plays_expert:
            played.expert = []
            random.seed(f"thicket-alfworld-parity:{wording}:{game}")  # the expert's random.choice calls
            alf = stack.reset()
            env.reset_sync(game)
            while not alf.done:
                command = alf.expert_plan[0]
                alf, t = stack.step(command), env.step_sync(command)
                played.expert.append(seen(command, alf, t))
                if t.done:
                    break
    finally:
        stack.close()
        env.close_sync()
    return played


@pytest.fixture(scope="module")
def parity(alf_cache: Path) -> dict[tuple[str, int], Played]:
    """Every game of GAMES in both wordings, generated (if not cached) and played in both stacks."""
    jobs = [(w.value, game) for w in Wording for game in GAMES]
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        results = pool.map(_play, [str(alf_cache)] * len(jobs), *zip(*jobs, strict=True))
        return {(p.wording, p.game): p for p in results}


def _plays_expert(wording: Wording, game: int) -> bool:
    return wording is Wording.V212 or tasks.task_type_of(game) in EXPERT_211


CASES = [pytest.param(w.value, game, id=f"{w.value}-task{game}") for w in Wording for game in GAMES]
EXPERT_CASES = [pytest.param(w.value, game, id=f"{w.value}-task{game}")
                for w in Wording for game in GAMES if _plays_expert(w, game)]


def assert_same_answer(s: Seen, where: str) -> None:
    assert s.text == s.alf_text, where
    assert (s.reward, s.done, s.success) == (float(s.alf_won), s.alf_won or s.alf_done, s.alf_won), where
    if s.alf_done:  # docs/envs/alfworld.md, "the last step's valid actions": none once the episode is over
        assert s.valid == () and s.alf_admissible, where
    else:
        assert s.valid == s.alf_admissible, where


def test_the_sample_holds_six_games_of_each_task_type_in_each_wording(parity: dict[tuple[str, int], Played]) -> None:
    for w in Wording:
        assert Counter(parity[w.value, g].task_type for g in GAMES) == Counter({t: 6 for t in tasks.TASK_TYPES})


@pytest.mark.parametrize(("wording", "game"), CASES)
def test_the_first_observation_and_admissible_commands_are_alfworlds(parity: dict[tuple[str, int], Played],
                                                                       wording: str, game: int) -> None:
    opening = parity[wording, game].opening
    assert opening.text == opening.alf_text
    assert opening.valid == opening.alf_admissible and opening.valid  # the same commands, in ALFWorld's order
    assert not opening.alf_won and not opening.alf_done


@pytest.mark.parametrize(("wording", "game"), CASES)
def test_the_gold_path_reads_the_same_in_both_and_wins_at_its_last_step(parity: dict[tuple[str, int], Played],
                                                                          wording: str, game: int) -> None:
    gold = parity[wording, game].gold
    assert len(gold) >= 2
    for i, s in enumerate(gold):
        assert_same_answer(s, f"gold step {i + 1}: {s.command}")
    assert [s.alf_won for s in gold] == [s.success for s in gold] == [False] * (len(gold) - 1) + [True]


@pytest.mark.parametrize(("wording", "game"), EXPERT_CASES)
def test_alfworlds_handcoded_expert_wins_in_thicket_at_the_step_alfworld_does(parity: dict[tuple[str, int], Played],
                                                                               wording: str, game: int) -> None:
    steps = parity[wording, game].expert
    assert steps is not None
    for i, s in enumerate(steps):
        assert_same_answer(s, f"expert step {i + 1}: {s.command}")
    won_at = [i for i, s in enumerate(steps) if s.alf_won]
    assert [i for i, s in enumerate(steps) if s.success] == won_at
    if not won_at:  # lost in both, step for step, to the step limit
        assert len(steps) == STEP_LIMIT and steps[-1].alf_done and steps[-1].done and not steps[-1].success
        assert tasks.task_type_of(game) == "pick_two_obj_and_place", [s.command for s in steps]
        pytest.xfail(PICK_TWO)
    assert won_at == [len(steps) - 1]


def test_the_expert_was_played_on_every_2_1_2_game_and_the_2_1_1_light_games(
        parity: dict[tuple[str, int], Played]) -> None:
    played = [key for key, p in parity.items() if p.expert is not None]
    assert len(played) == len(EXPERT_CASES) == len(GAMES) + len(GAMES) // 6
