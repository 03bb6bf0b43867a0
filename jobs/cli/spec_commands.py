"""The commands that take a SPEC: validate, run (on this machine), eval, and worker (one pod's share
on a cluster)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from thicket.async_main import run_main
from thicket.cli.common import allow_spec_change_option, examples, metrics_port_option, plural, spec_with_overrides
from thicket.errors import BadInput, NothingAnswers
from thicket.preconditions import check_local_inputs
from thicket.spec import parse_indices


@click.command(short_help="Check SPEC and print the plan (tasks, pods, search).", epilog=examples(
    "thicket validate sweeps/demo.yaml",
    "thicket validate sweeps/taxi-tot.yaml --policy uniform",
))
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--policy", type=click.Choice(["uniform"]), help="Check SPEC as `thicket run --policy uniform` would run it.")
def validate(spec: str, policy: str | None) -> None:
    """Check SPEC and print the plan (tasks, pods, search)."""
    from thicket.rollout.probe import check_policy_fits_env
    from thicket.spec_notes import cluster_in_view, model_folder_note, plan_text, task_range_note

    s = spec_with_overrides(spec, None, policy)
    local = not s.sweep_uri.startswith("s3://")  # a cluster sweep's pods fetch policy.model from the hub
    check_local_inputs(s, runs_here=local)  # what `run` would refuse here: data and model folders, output
    if note := check_policy_fits_env(s):  # the env is asked: a uniform policy needs listed actions
        click.echo(note, err=True)
    for note in (task_range_note(s.tasks), model_folder_note(s.policy) if local else None):  # maybe not what was meant
        if note:
            click.echo(note, err=True)
    ranges = s.tasks.index_ranges()
    click.echo(f"{spec}: ok")
    click.echo(f"sweep   {s.name} -> {s.sweep_uri}")
    click.echo(f"tasks   {s.tasks.env} {s.tasks.start}-{s.tasks.stop - 1} ({plural(s.tasks.count, 'task')}, "
               f"{plural(len(ranges), 'pod')} of <= {s.tasks.per_index})")
    click.echo(f"search  {s.search.algorithm}: {plan_text(s.search, frozenset({'algorithm'}))}")
    p = s.policy
    uses = "" if p.kind == "uniform" else f" {p.model or ''} {p.url or ''}"  # uniform needs neither
    click.echo(f"policy  {p.kind}{uses}".rstrip())
    if not cluster_in_view(s):  # a local spec: nothing to say about a cluster it never meets
        return
    from thicket.k8s.names import serves_vllm
    from thicket.k8s.render import render

    try:
        objects = render(s)  # what the cluster would refuse, refused here
    except BadInput as err:
        if s.sweep_uri.startswith("s3://"):
            raise
        # A local sweep (its output is on this machine): what only a cluster refuses is a note.
        click.echo(f"note: as a cluster sweep: {err}", err=True)
        return
    c = s.cluster
    gpus = f", {c.gpus} GPU(s) each" if serves_vllm(s) else ", no vLLM in the pod"
    click.echo(f"cluster {c.namespace}: {plural(len(ranges), 'index', 'indexes')}, {min(c.parallelism, len(ranges))} at a time{gpus}")
    from thicket.k8s.node_fit import report

    # A cluster sweep (output on S3): the pod's request, the GPU nodes it fits, loading the model.
    if s.sweep_uri.startswith("s3://") and (fit := report(s, objects)):
        click.echo("\n".join(fit.lines))
        for warning in fit.warnings:
            click.echo(f"warning: {warning}", err=True)
    if s.sweep_uri.startswith("s3://"):
        from thicket.k8s.fault_price import echo_fault_table

        echo_fault_table(s, objects, canary=True, echo=click.echo)


@click.command(short_help="Run SPEC's tasks on this machine, then build the datasets.", epilog=examples(
    "thicket run sweeps/frozenlake-dense.yaml --policy uniform -o /tmp/sweeps",
    "thicket run sweeps/demo.yaml --indices 200-202,205",
    "thicket run SPEC -o s3://bucket/prefix --no-progress --no-aggregate",
))
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("-o", "--output", help="Override the spec's output (local path, file:// or s3://bucket/prefix).")
@click.option("--indices", help="Task indices to run, e.g. 0-9 or 3,5,7-8 (default: all).")
@click.option("--policy", type=click.Choice(["uniform"]), help="Replace the spec's policy by the uniform baseline.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
@click.option("--aggregate/--no-aggregate", "then_aggregate", default=True, help="Build the datasets when the run succeeds.")
@allow_spec_change_option
@metrics_port_option
def run(spec: str, output: str | None, indices: str | None, policy: str | None, progress: bool, then_aggregate: bool,
        allow_spec_change: bool, metrics_port: int) -> None:
    """Run SPEC's tasks locally (starting vLLM if the spec serves a local model), then aggregate."""
    from thicket.metrics import metrics_served
    from thicket.rollout.no_success import no_success_note
    from thicket.rollout.sweep import raise_for_failures, run_tasks

    from thicket.spec_notes import task_range_note

    s = spec_with_overrides(spec, output, policy)
    check_local_inputs(s)  # as `validate` does: before the store, the envs or vLLM are touched
    if note := task_range_note(s.tasks):
        click.echo(note, err=True)
    tasks = parse_indices(indices, s.tasks) if indices is not None else list(range(s.tasks.start, s.tasks.stop))
    with metrics_served(metrics_port, "127.0.0.1"):
        summary = run_main(run_tasks(s, tasks, progress=progress,
                                        allow_spec_change=allow_spec_change or s.run.allow_spec_change))
    for line in summary.lines():
        click.echo(line)
    raise_for_failures(summary)
    if then_aggregate:
        from thicket.aggregate.driver import aggregate as build_datasets
        from thicket.storage import open_store

        result = build_datasets(s.sweep_uri, store=open_store(s.sweep_uri, s.storage.settings()), progress=progress)
        for line in result.lines():
            click.echo(line)
    if note := no_success_note(s, summary.report):  # last, with the summary: what an empty run may need
        click.echo(note)


@click.command("eval", short_help="pass@1, pass@k and mean return of SPEC's policy, 95% intervals.",
             epilog=examples(
                 "thicket eval sweeps/demo.yaml --samples 8 -k 1 -k 8",
                 "thicket eval sweeps/frozenlake-dense.yaml --policy uniform --indices 0-9 --json eval.json",
             ))
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--samples", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Independent trajectories a task.")
@click.option("-k", "--k", "ks", type=int, multiple=True, help="pass@k for this k (repeatable; default: 1 and --samples).")
@click.option("--indices", help="Task indices to evaluate, e.g. 0-9 or 3,5,7-8 (default: the spec's tasks).")
@click.option("--policy", type=click.Choice(["uniform"]), help="Evaluate the uniform baseline instead of the spec's policy.")
@click.option("-o", "--output", help="Keep the evaluation's trees here, as sweep NAME-eval (default: a temporary folder).")
@click.option("--json", "json_path", metavar="FILE", help="Write the figures, per task too, as JSON to FILE ('-': stdout).")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def eval_command(spec: str, samples: int, ks: tuple[int, ...], indices: str | None, policy: str | None,
                 output: str | None, json_path: str | None, progress: bool) -> None:
    """pass@1, pass@k and mean return of SPEC's policy on its tasks, with 95% intervals over tasks."""
    import json
    import tempfile

    from thicket.evaluation.run import check_ks, eval_spec, evaluate

    s = spec_with_overrides(spec, None, policy)
    tasks = parse_indices(indices, s.tasks) if indices is not None else list(range(s.tasks.start, s.tasks.stop))
    k_values = check_ks(ks or (1, samples), samples)
    if json_path and json_path != "-" and not Path(json_path).resolve().parent.is_dir():
        raise BadInput(f"--json {json_path}: its folder does not exist")
    with tempfile.TemporaryDirectory(prefix="thicket-eval-") as scratch:
        result = evaluate(eval_spec(s, samples, output or scratch), tasks, k_values, progress)
    click.echo(result.summary(), err=json_path == "-")  # stdout is the JSON's then
    if json_path == "-":
        click.echo(json.dumps(result.to_json(), indent=1))
    elif json_path:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=1) + "\n")


@click.command(short_help="Run one pod's share of SPEC (one Job completion index).", epilog=examples(
    "thicket worker sweeps/demo.yaml --index 0 -o /tmp/sweeps",
    "JOB_COMPLETION_INDEX=3 thicket worker /etc/thicket/spec.yaml --wait-for http://localhost:8000/health",
    "thicket worker SPEC --index 1 --metrics-port 9090",
))
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--index", type=int, default=None,
              help="The sweep index (default: $JOB_COMPLETION_INDEX, mapped through $THICKET_INDEX_MAP when set).")
@click.option("-o", "--output", help="Override the spec's output.")
@click.option("--wait-for", "wait_for", multiple=True, metavar="URL", help="Wait until URL answers 2xx first (repeatable).")
@click.option("--wait-ready-timeout", type=float, default=600, show_default=True, help="Seconds to wait for --wait-for URLs (then exit 3).")
@allow_spec_change_option
@metrics_port_option
def worker(spec: str, index: int | None, output: str | None, wait_for: tuple[str, ...], wait_ready_timeout: float,
           allow_spec_change: bool, metrics_port: int) -> None:
    """Run one pod's share of SPEC: the task range of one Job completion index."""
    from thicket.metrics import metrics_served
    from thicket.rollout.sweep import checked_store, raise_for_failures, run_tasks
    from thicket.shards.storage import committed_task_ids

    s = spec_with_overrides(spec, output, None)
    if index is None:  # a resumed Job's completion index maps to the sweep's (THICKET_INDEX_MAP)
        from thicket.rollout.completion_index import sweep_index

        index = sweep_index(os.environ)
    ranges = s.tasks.index_ranges()
    if not 0 <= index < len(ranges):
        raise BadInput(f"--index: {index} is outside 0-{len(ranges) - 1} for this spec")
    tasks = list(ranges[index])
    try:
        store = checked_store(s, allow_spec_change or s.run.allow_spec_change)  # before the servers: a wrong bucket, key or spec fails now
        if set(tasks) <= committed_task_ids(store):  # a resumed sweep: this index is done, no server needed
            click.echo(f"index {index}: all {plural(len(tasks), 'task')} already committed in {s.sweep_uri}")
            return
        # Served from the start, so a pod waiting for its servers is up to Prometheus (it scrapes the pod IP).
        with metrics_served(metrics_port, "0.0.0.0"):
            if wait_for:
                from thicket.readiness import wait_ready

                wait_ready(wait_for, wait_ready_timeout)
            summary = run_main(run_tasks(s, tasks, progress=False, store=store))
    except NothingAnswers as err:  # in a pod: DNS or a server not up yet, not a spec mistake
        raise err.unavailable() from None
    for line in summary.lines():
        click.echo(line)
    raise_for_failures(summary)
