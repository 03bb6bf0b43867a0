"""Expert chats for the demo policy: rendered by the product's prompt code, replaying to success."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from thicket.envs import make_env
from thicket.envs.textcraft import gold_path, item_id_to_str, make_task
from thicket.errors import BadInput
from thicket.policy import prompts
from thicket.training.experts import WASTED_THOUGHT, ExpertSet, conversations, textcraft_plan, with_waste


def test_expert_chats_are_the_rollouts_prompts_and_replay_to_success():
    chats = conversations(ExpertSet("textcraft", range(1000, 1012), noise=0.0, seed=0, max_steps=12))
    assert len(chats) >= 6
    for chat in chats:
        task, messages = chat["task"], chat["messages"]
        env = make_env("textcraft")
        first = env.reset_sync(task)
        assert messages[0] == prompts.system_message(env.instructions)
        assert messages[1] == prompts.observation_message(first.text, first.valid_actions, False)
        turns = [prompts.parse_reply(m["content"]) for m in messages[2::2]]
        assert [m["content"] for m in messages[2::2]] == [prompts.turn(*turn) for turn in turns]
        thoughts, actions = zip(*turns)
        assert list(actions) == gold_path(make_task(task))
        assert all(t.startswith("for ") and t.endswith(".") for t in thoughts)
        assert thoughts[-1] == f"for {item_id_to_str(make_task(task).goal)}."  # the last step makes the goal
        for action, user in zip(actions, [*messages[3::2], None]):
            step = env.step_sync(action)
            if user is not None:
                assert user == prompts.observation_message(step.observation.text, step.observation.valid_actions, False)
        assert step.success and messages[-1]["role"] == "assistant"


def test_wasted_steps_are_gets_or_inventory_before_planned_ones_and_keep_the_plan():
    plan = textcraft_plan(1003)
    assert plan is not None
    steps = with_waste(plan, 1.0, random.Random(0))
    assert steps[1::2] == list(plan.steps) and len(steps) == 2 * len(plan.steps)
    assert all(s.thought == WASTED_THOUGHT and (s.action == "inventory" or s.action.startswith("get ")) for s in steps[0::2])
    [chat] = conversations(ExpertSet("textcraft", range(1003, 1004), noise=1.0, seed=0, max_steps=99))
    assert len(chat["messages"]) == 2 + 2 * len(steps) - 1  # every wasted step kept, still a success


def test_an_env_without_a_planner_is_bad_input_naming_train():
    with pytest.raises(BadInput, match="^train: no expert planner for env 'sciworld'"):
        conversations(ExpertSet("sciworld", range(0, 2), noise=0.0, seed=0, max_steps=10))


def test_webshop_expert_chats_replay_to_success_through_the_training_path():
    chats = conversations(ExpertSet("webshop", range(1000, 1006), noise=0.0, seed=0, max_steps=12))
    assert [chat["task"] for chat in chats] == list(range(1000, 1006))  # every task's plan won
    for chat in chats:
        env = make_env("webshop")
        first = env.reset_sync(chat["task"])
        assert chat["messages"][1] == prompts.observation_message(first.text, first.valid_actions, False)
        for message in chat["messages"][2::2]:
            step = env.step_sync(prompts.parse_reply(message["content"])[1])
        assert step.success and step.reward == 1.0


def test_make_model_train_names_the_envs_it_has_recipes_for(tmp_path):
    thicket = str(Path(sys.executable).parent / "thicket")
    done = subprocess.run([thicket, "make-model", str(tmp_path / "m"), "--train", "sciworld"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.strip().endswith(
        "make-model --train: no expert recipe for env 'sciworld'; one of alfworld, textcraft, webshop")
