"""What `thicket validate` (and `run`) tell about a spec that is valid but may not do what its
author meant: a task range that wraps around a family's tasks, tasks that are all the same,
a local model folder not made yet. Each is one `note: ...` line for stderr; and whether a cluster is
in view at all."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from thicket.envs.env_args import distinct_tasks
from thicket.spec import PolicySpec, SweepSpec, TasksSpec


def task_range_note(tasks: TasksSpec) -> str | None:
    """Where the task indices repeat or wrap: None when every index is a task of its own."""
    env, start, stop, count = tasks.env, tasks.start, tasks.stop, tasks.count
    if tasks.env_server.mode == "remote":
        return None  # the server's families may differ from this install's
    distinct = distinct_tasks(env, tasks.env_args)
    if distinct is None or stop <= distinct:
        return None
    span = f"tasks {start}-{stop - 1}"
    if distinct == 1:
        if count == 1:
            return None
        return f"note: every {env} task index is the same task (with these env_args), so {span} run it {count:,} times"
    if count > distinct:
        ratio = count / distinct
        times = f"{ratio:,.0f}" if count % distinct == 0 else f"~{ratio:,.0f}"
        return f"note: {span} wrap: {env} has {distinct:,} distinct tasks, so each is run {times} times"
    return f"note: {span} go past {env}'s {distinct:,} distinct tasks: index i is task i mod {distinct:,}"


def model_folder_hint(model: str) -> str:
    """The command that makes a local model folder."""
    return f"make it with `thicket make-model {model} --demo` (the demo policy)"


def model_folder_note(policy: PolicySpec) -> str | None:
    """A policy that serves a local model folder (vllm without url) whose folder is not there."""
    model = policy.model
    if not policy.launches_server or not model:
        return None
    folder = Path(model).expanduser()
    if folder.is_dir() and (folder / "config.json").is_file():
        return None
    what = "has no config.json" if folder.is_dir() else "does not exist"
    return f"note: policy.model: the local model folder {model} {what}; {model_folder_hint(model)}, before `thicket run`"


def cluster_in_view(spec: SweepSpec) -> bool:
    """Whether `validate` speaks of the cluster: the spec has a cluster section, or its output is
    on S3 (a cluster sweep's). A local spec without one gets no cluster lines or notes."""
    return "cluster" in spec.model_fields_set or spec.sweep_uri.startswith("s3://")


def plan_text(params: BaseModel, leave_out: frozenset[str] = frozenset()) -> str:
    """'iterations=6 expansions=3 ...': the set fields of a search plan (None ones left out)."""
    fields = params.model_dump(exclude=set(leave_out), exclude_none=True)
    return " ".join(f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in fields.items())
