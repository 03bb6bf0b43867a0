"""A run whose trees all fail says so last, with what may be why (issue 51): the search's budget,
and the policy (the uniform one picks at random; a trained model's training.json says where its
pass@1 was measured). A run with a success says nothing of the kind."""

from __future__ import annotations

import json

from tests.support.harness import sweep_spec, thicket
from thicket.rollout.no_success import policy_reason
from thicket.spec import PolicySpec, TasksSpec


def test_a_run_without_a_success_ends_with_a_note_saying_why_it_may_be(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: no-success\ntasks: {env: textcraft, start: 10, stop: 12}\n"
                    "search: {algorithm: dense, max_llm_calls: 4, max_depth: 4}\npolicy: {kind: uniform}\n"
                    f"output: {tmp_path}/out\nrun: {{progress: false}}\n")
    result = thicket("run", str(spec))
    assert result.returncode == 0, result.stderr
    assert "successes    0 of 2 trees solved their task" in result.stdout
    last = result.stdout.splitlines()[-1]  # stdout, with the summary: stderr holds the log (JSON with THICKET_LOG_FORMAT)
    assert last.startswith("note: none of the 2 trees grown solved its task, so the datasets hold no successes"), last
    assert "search.max_llm_calls caps each tree at 4 LLM calls" in last
    assert "the uniform policy picks actions at random" in last and "thicket eval SPEC" in last


def test_a_run_with_a_success_has_no_such_note(tmp_path):
    result = thicket("run", str(sweep_spec(tmp_path, count=2)), "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "successes    0 of" not in result.stdout  # the harness's FrozenLake sweep solves some
    assert "so the datasets hold no successes" not in result.stdout + result.stderr


def test_one_tree_is_named_as_one(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: no-success\ntasks: {env: textcraft, start: 10, stop: 11}\n"
                    "search: {algorithm: dense, max_llm_calls: 4, max_depth: 4}\npolicy: {kind: uniform}\n"
                    f"output: {tmp_path}/out\nrun: {{progress: false}}\n")
    result = thicket("run", str(spec), "--no-aggregate")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].startswith("note: the one tree grown did not solve its task, so the datasets")


def test_a_trained_model_names_where_its_pass_at_1_was_measured(tmp_path):
    model = tmp_path / "demo"
    model.mkdir()
    (model / "training.json").write_text(json.dumps({"eval": {"env": "textcraft", "task_range": [200, 264],
                                                              "pass_at_1": 0.1055}}))
    policy = PolicySpec(kind="vllm", model=str(model))
    reason = policy_reason(policy, TasksSpec(env="textcraft", start=10, stop=14))
    assert reason == f"policy.model {model} was measured at pass@1 0.11 on textcraft tasks 200-263, not on textcraft tasks 10-13"
    assert policy_reason(policy, TasksSpec(env="textcraft", start=200, stop=264)).endswith("tasks 200-263")
    assert policy_reason(PolicySpec(kind="vllm", model=str(tmp_path / "none")), TasksSpec(env="textcraft", stop=1)) is None
