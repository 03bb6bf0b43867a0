"""What `thicket run` says last when no tree it grew solved its task: the datasets then hold no
successes (no SFT rows, no pairs), and what may be why: the search's budget, and the policy (the
uniform one picks at random; a model thicket trained says in its training.json where its pass@1
was measured)."""

from __future__ import annotations

import json
from pathlib import Path

from thicket.rollout.worker import WorkerReport
from thicket.spec import PolicySpec, SweepSpec, TasksSpec


def no_success_note(spec: SweepSpec, report: WorkerReport) -> str | None:
    """A `note: ...` line where trees were grown and none solved its task; else None."""
    grown = report.grown
    if not grown or any(outcome.solved for outcome in grown):
        return None
    why = [w for w in (budget_reason(spec), policy_reason(spec.policy, spec.tasks)) if w]
    trees = "the one tree grown did not solve its task" if len(grown) == 1 else \
        f"none of the {len(grown)} trees grown solved its task"
    return (f"note: {trees}, so the datasets hold no successes (no SFT rows, no pairs); "
            + "; ".join([*why, "`thicket eval SPEC` measures the policy's pass@1 on these tasks"]))


def budget_reason(spec: SweepSpec) -> str | None:
    calls = spec.search.max_llm_calls
    return f"search.max_llm_calls caps each tree at {calls} LLM calls" if calls else None


def policy_reason(policy: PolicySpec, tasks: TasksSpec) -> str | None:
    if policy.kind == "uniform":
        return "the uniform policy picks actions at random"
    measured = trained_eval(policy)
    if measured is None:
        return None
    start, stop = measured["task_range"]
    where = f"{measured['env']} tasks {start}-{stop - 1}"
    asked = f"{tasks.env} tasks {tasks.start}-{tasks.stop - 1}"
    return (f"policy.model {policy.model} was measured at pass@1 {measured['pass_at_1']:.2f} on {where}"
            + ("" if where == asked else f", not on {asked}"))


def trained_eval(policy: PolicySpec) -> dict | None:
    """The eval a local model folder's training.json records (thicket's demo policy, or one
    `thicket make-model --train` made); None for any other model."""
    if not policy.launches_server or not policy.model:
        return None
    try:
        measured = json.loads((Path(policy.model) / "training.json").read_text())["eval"]
        return measured if {"env", "task_range", "pass_at_1"} <= measured.keys() else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
