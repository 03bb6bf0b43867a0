"""ScienceWorld (a JVM per env): task indexing, valid actions, gold paths and their replay,
async steps off the event loop, simulator exceptions as error leaves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.support.scripted import reply
from thicket.envs import make_env
from thicket.envs.protocol import ActionFailed
from thicket.envs.sciworld import ScienceWorldEnv, canonical_listing, order_valid_actions, task_names
from thicket.policy.base import Messages, Policy, Reply
from thicket.search.expand import Expander
from thicket.search.guard import Fault
from thicket.search.tree import StopReason

# py4j cannot send a lone surrogate to the JVM: the real simulator raises Py4JError on it.
UNSENDABLE = "look at \ud800"


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


class ScriptedActions(Policy):
    """Proposes the next n actions of a fixed list, in order."""

    def __init__(self, actions: list[str]) -> None:
        self.actions = list(actions)

    async def propose(self, messages: Messages, n: int, *, valid_actions, seed: int, temperature=None) -> list[Reply]:
        taken, self.actions = self.actions[:n], self.actions[n:]
        return [reply(f"try {i}", action, seed + i) for i, action in enumerate(taken)]

    async def act(self, messages: Messages, thought: Reply, *, valid_actions, seed: int, temperature=None) -> Reply:
        raise AssertionError("not used")


async def test_sciworld_simulator_exception_is_an_error_leaf_and_the_tree_goes_on(sciworld: ScienceWorldEnv) -> None:
    sciworld.list_valid_actions = False
    try:
        with pytest.raises(ActionFailed, match=r"sciworld raised Py4JError"):
            await sciworld.reset(0)
            await sciworld.step(UNSENDABLE)
        policy = ScriptedActions(["open door to kitchen", UNSENDABLE, "look around", "go to kitchen"])
        x = await Expander.open(sciworld, 0, policy, 0, max_depth=5, max_nodes=20)
        opened, failed, looked = await x.expand(x.tree.root, 3)
        assert failed.stop is StopReason.ERROR and failed.terminal and failed.reward == 0.0
        assert "sciworld raised Py4JError" in failed.observation.text
        assert x.cursor.guard.faults[Fault.ACTION_FAILED] == 1
        # The siblings after the failure were stepped from a fresh replay of the root.
        assert opened.observation.text == "The door is now open." and not opened.terminal
        assert looked.observation.text.startswith("This room is called the hallway") and not looked.terminal
        # And the tree grows on below a sibling: reset + replay of "open door to kitchen", then a move.
        (moved,) = await x.expand(opened, 1)
        assert moved.observation.text == "You move to the kitchen." and moved.stop is not StopReason.ERROR
        assert [n.depth for n in (opened, failed, looked, moved)] == [1, 1, 1, 2]
    finally:
        sciworld.list_valid_actions = True


async def test_sciworld_cancelled_step_is_not_an_action_failure(sciworld: ScienceWorldEnv) -> None:
    sciworld.list_valid_actions = False
    try:
        await sciworld.reset(0)
        with pytest.raises(TimeoutError):  # the worker's task timeout, not an error leaf
            async with asyncio.timeout(0.001):
                await sciworld.step("wait")  # ~0.15 s in the JVM
        deadline = time.monotonic() + 30
        while sciworld._steps == 0 and time.monotonic() < deadline:  # the thread finishes its step
            await asyncio.sleep(0.05)
        waited = time.monotonic() - deadline + 30
        alive = sciworld._sim is not None and sciworld._sim.alive()
        assert sciworld._steps == 1, f"steps {sciworld._steps} after {waited:.1f} s; JVM alive: {alive}"
    finally:
        sciworld.list_valid_actions = True


async def test_sciworld_dead_jvm_fails_the_action_and_the_next_reset_starts_a_new_one(sciworld: ScienceWorldEnv) -> None:
    await sciworld.reset(0)
    sim = sciworld.sim
    proc = sim.env._gateway.java_process
    proc.kill()
    proc.wait(timeout=10)
    with pytest.raises(ActionFailed, match=r"^sciworld raised Py4J\w+ on 'look around'"):
        await sciworld.step("look around")
    assert sciworld._sim is None  # dropped: the next reset starts a fresh JVM
    obs = await sciworld.reset(0)
    assert obs.text.startswith("Your task is to boil water") and sciworld.sim is not sim


ROOM = "This room is called the art studio. In it, you see: \n\ta substance called air\n\ta table. On the table is: a jug.\n{cups}\nYou also see:\n\tA door to the hallway"
CUPS = ["\ta wood cup (containing red paint)", "\ta wood cup (containing blue paint)", "\ta wood cup (containing yellow paint)"]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_objects_of_one_name_are_listed_in_one_order_whatever_the_simulator_s(order):
    text = canonical_listing(ROOM.format(cups="\n".join(CUPS[i] for i in order)))
    assert text == ROOM.format(cups="\n".join(sorted(CUPS)))


def test_the_listing_is_otherwise_left_as_the_simulator_wrote_it():
    other_names = "In it, you see: \n\tan orange\n\ta table\n\ta cup (containing water)"
    assert canonical_listing(other_names) == other_names  # the simulator's own order: by name
    with_contents = "\ta box (containing b)\n\ta box (containing a)\n\t\ta key"  # the last box holds the key
    assert canonical_listing(with_contents) == with_contents
    untabbed = "b (x)\nb (a)"
    assert canonical_listing(untabbed) == untabbed

