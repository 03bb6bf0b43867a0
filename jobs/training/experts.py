"""Expert conversations for the demo policy: an env's own planner plays each task through
the product's search code (an Expander and the sample search, one trajectory), so every
chat is rendered by exactly the code a rollout renders its prompts with (system prompt,
observations, "Thought: ...\\nAction: ..." replies, the content guard's cuts).

Each planned step's thought names the item it is for (the craft that uses what it makes,
or the goal): a scratchpad that a small model copies forward. Imperfect on purpose: with
probability `noise` the expert wastes a step before a planned one (a random `get` or
`inventory`, which never breaks the plan), and the model learns to do so too.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from thicket.envs import make_env
from thicket.errors import BadInput
from thicket.policy import prompts
from thicket.policy.base import Messages, Policy, Reply
from thicket.search.expand import Expander
from thicket.search.guard import ContentGuard
from thicket.search.sample import SampleParams
from thicket.search.sample import run as run_sample

WASTED_THOUGHT = "just in case."  # the thought of a wasted step


@dataclass(frozen=True)
class Step:
    thought: str
    action: str


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]  # what the expert plays
    wasted: tuple[str, ...]  # the actions it may waste a step on


def textcraft_plan(task: int) -> Plan | None:
    from thicket.envs.textcraft import gold_path, item_id_to_str, make_task

    game = make_task(task)
    gold = gold_path(game)
    if gold is None:
        return None
    crafts = {craft.command: craft for craft in game.crafts}
    gets = {f"get {count} {item_id_to_str(item)}": item for item, count in game.gets}
    made = [crafts[a].output if a in crafts else gets[a] for a in gold]
    steps = []
    for i, action in enumerate(gold):
        users = (crafts[later].output for later in gold[i + 1 :] if later in crafts
                 and made[i] in dict(crafts[later].inputs))
        steps.append(Step(f"for {item_id_to_str(next(users, game.goal))}.", action))
    wasted = tuple(a for a in game.valid_actions if a == "inventory" or a.startswith("get "))
    return Plan(tuple(steps), wasted)


def webshop_plan(task: int) -> Plan | None:
    from thicket.envs.webshop.env import WebShopEnv
    from thicket.envs.webshop.gold import gold_path

    env = make_env("webshop")  # its catalogue and index are loaded once per process (shop_data)
    assert isinstance(env, WebShopEnv)
    env.reset_sync(task)
    goal = env.shop.goal
    gold = gold_path(goal, env.catalog.by_asin[goal.asin], env.index, env.listed_searches())
    return None if gold is None else Plan(tuple(Step(s.thought, s.action) for s in gold), ())


def alfworld_plan(task: int) -> Plan | None:
    from thicket.envs.alfworld.expert import WASTED, gold_steps

    steps = gold_steps(task)
    return Plan(tuple(Step(t, a) for t, a in steps), WASTED) if steps else None


PLANNERS: dict[str, Callable[[int], Plan | None]] = {
    "textcraft": textcraft_plan, "webshop": webshop_plan, "alfworld": alfworld_plan,
}


def planner(env: str) -> Callable[[int], Plan | None]:
    if env not in PLANNERS:
        raise BadInput(f"train: no expert planner for env '{env}'; one of {', '.join(sorted(PLANNERS))}")
    return PLANNERS[env]


def with_waste(plan: Plan, noise: float, rng: random.Random) -> list[Step]:
    """The plan with a wasted step before each planned one, each with probability `noise`."""
    out: list[Step] = []
    for step in plan.steps:
        if plan.wasted and rng.random() < noise:
            out.append(Step(WASTED_THOUGHT, rng.choice(plan.wasted)))
        out.append(step)
    return out


class ScriptedPolicy(Policy):
    """Plays a fixed list of steps: the k-th reply of a chat (k assistant turns so far) is the k-th step."""

    name = "expert"

    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps

    def _reply(self, messages: Messages) -> Reply:
        turn = sum(1 for message in messages if message["role"] == "assistant")
        step = self.steps[min(turn, len(self.steps) - 1)]
        return Reply(text=prompts.turn(step.thought, step.action), thought=step.thought, action=step.action)

    async def propose(self, messages: Messages, n: int, *, valid_actions: tuple[str, ...] | None, seed: int,
                      temperature: float | None = None) -> list[Reply]:
        return [self._reply(messages) for _ in range(n)]

    async def act(self, messages: Messages, thought: Reply, *, valid_actions: tuple[str, ...] | None, seed: int,
                  temperature: float | None = None) -> Reply:
        return self._reply(messages)


async def play(env: str, task: int, steps: list[Step]) -> Messages | None:
    """The chat of `steps` played on the task, ending with the last assistant turn; None
    when the env does not end the episode with success."""
    depth = len(steps)
    expander = await Expander.open(make_env(env), task, ScriptedPolicy(steps), 0, guard=ContentGuard(),
                                   max_depth=depth, max_nodes=depth + 2, dedupe=False)
    try:
        await run_sample(expander, SampleParams(samples=1, max_depth=depth))
    finally:
        await expander.cursor.env.close()
    [leaf] = expander.tree.leaves()
    if not leaf.success or leaf.parent is None or leaf.reply is None:
        return None
    return [*expander.messages(leaf.parent), {"role": "assistant", "content": leaf.reply.text}]


@dataclass(frozen=True)
class ExpertSet:
    env: str
    tasks: Sequence[int]
    noise: float
    seed: int
    max_steps: int  # tasks whose plan is longer are left out


def conversations(experts: ExpertSet) -> list[dict[str, object]]:
    """{"task", "messages"} for each task of the set that its planner solves in at most max_steps."""
    plan_of = planner(experts.env)
    rng = random.Random(experts.seed)

    async def all_tasks() -> list[dict[str, object]]:
        out = []
        for task in experts.tasks:
            plan = plan_of(task)
            if plan is None or len(plan.steps) > experts.max_steps:
                continue
            messages = await play(experts.env, task, with_waste(plan, experts.noise, rng))
            if messages is not None:
                out.append({"task": task, "messages": messages})
        return out

    return asyncio.run(all_tasks())
