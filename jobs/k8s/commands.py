"""Cluster commands of the `thicket` CLI: render, submit, status, logs, cancel, wait-job, rehearse.

Registered on the main group in thicket.cli; the kubernetes client is imported only when a
command talks to a cluster from outside it (kubeconfig); in a pod, thicket.k8s.client speaks to the
API server itself.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from thicket.errors import BadInput
from thicket.spec import load_spec

context_option = click.option("--context", help="kubeconfig context (default: the current one).")
namespace_option = click.option("-n", "--namespace", help="Namespace (default: the spec's, else the context's, else thicket).")


def _sweep_and_namespace(sweep: str, namespace: str | None) -> tuple[str, str | None]:
    """SWEEP is a sweep name, or a spec file (its name and cluster.namespace)."""
    path = Path(sweep)
    if sweep.endswith((".yaml", ".yml")) or path.is_file():
        spec = load_spec(path)
        return spec.name, namespace or spec.cluster.namespace
    return sweep, namespace


@click.command(short_help="Print SPEC's Kubernetes objects (ConfigMap, RBAC, Jobs).")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("-o", "--output", default="-", show_default=True, help="Folder for one file per object, or '-' for stdout.")
def render(spec: str, output: str) -> None:
    """Print SPEC's Kubernetes objects: ConfigMap, RBAC, rollout and aggregation Jobs.

    
    Examples:
      thicket render sweeps/cluster/textcraft-mcts.yaml
      thicket render sweeps/cluster/textcraft-mcts.yaml -o rendered/
    """
    from thicket.k8s.render import render as render_objects
    from thicket.k8s.render import to_yaml, write_dir
    from thicket.rollout.probe import check_policy_fits_env

    s = load_spec(spec)
    objects = render_objects(s)
    if note := check_policy_fits_env(s):  # the env is asked: a uniform policy needs listed actions
        click.echo(note, err=True)
    if output == "-":
        click.echo(to_yaml(objects), nl=False)
    else:
        try:
            written = write_dir(objects, output)
        except OSError as err:
            raise BadInput(f"-o {output}: cannot write the objects there ({err.strerror or err})") from None
        for path in written:
            click.echo(f"wrote {path}", err=True)
    if "://" not in s.output or s.output.startswith("file://"):
        click.echo(f"note: output {s.output!r} is local to each pod; use s3://... for a cluster sweep", err=True)


@click.command(short_help="Create or update SPEC's objects on the cluster (idempotent).")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--replace", is_flag=True, help="Delete and recreate a Job whose pod template changed (committed tasks are kept).")
@click.option("--resume", is_flag=True, help="Rerun a finished sweep: only indexes with uncommitted tasks do work.")
@click.option("--canary/--no-canary", default=True, show_default=True,
              help="Run index 0 alone first; scale to cluster.parallelism once it committed its first shard "
                   "(else stop the Job, exit non-zero). --no-canary: every pod at once (see the fault price).")
@click.option("--canary-timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds the canary may wait for its first committed shard (default: derived from the pod's "
                   "start allowance, --wait-ready-timeout and run.task_timeout_s, at most activeDeadlineSeconds).")
@context_option
def submit(spec: str, replace: bool, resume: bool, canary: bool, canary_timeout: float | None, context: str | None) -> None:
    """Create or update SPEC's objects on the cluster (idempotent). Checks first: Kubernetes 1.29+, the
    namespace, every Secret key the pods read, the model-cache PVC and its StorageClass.

    
    Examples:
      thicket submit sweeps/cluster/textcraft-mcts.yaml
      thicket submit sweeps/cluster/textcraft-mcts.yaml --replace
      thicket submit sweeps/cluster/textcraft-mcts.yaml --resume
      thicket submit SPEC --no-canary --context my-eks
    """
    from thicket.k8s.client import connect
    from thicket.k8s.render import render as render_objects
    from thicket.k8s.submit import submit as submit_objects

    from thicket.k8s.fault_price import echo_fault_table

    s = load_spec(spec)
    objects = render_objects(s)
    echo_fault_table(s, objects, canary=canary, echo=click.echo)  # before anything is created
    kube = connect(context)
    submit_objects(kube, s, objects, replace=replace, resume=resume, echo=click.echo, canary=canary,
                   canary_timeout_s=canary_timeout)
    click.echo(f"sweep {s.name} submitted to namespace {s.cluster.namespace}: `thicket status {s.name} -n {s.cluster.namespace}`")


@click.command(short_help="A cluster sweep's indexes and why, committed tasks, ETA.")
@click.argument("sweep")
@namespace_option
@context_option
@click.option("--watch", "-w", is_flag=True, help="Refresh until the rollout Job finishes (--format json: one object per refresh).")
@click.option("--interval", type=float, default=10, show_default=True, help="Seconds between refreshes with --watch.")
@click.option("--no-storage", is_flag=True, help="Do not read committed tasks from the sweep's storage.")
@click.option("--all", "all_rows", is_flag=True,
              help="A row for every index (default: the summary, then only failed, retrying or stuck indexes).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None,
              help="text (the default), or json: the summary and one entry per index, as one JSON object.")
@click.option("-o", "--output", "old_format", type=click.Choice(["text", "json"]), default=None, hidden=True,
              help="The old spelling of --format.")
def status(sweep: str, namespace: str | None, context: str | None, watch: bool, interval: float, no_storage: bool,
           all_rows: bool, fmt: str | None, old_format: str | None) -> None:
    """SWEEP's summary first (indexes, committed tasks from storage, progress and ETA), then the
    indexes that failed, are retrying or are stuck, one line each with why (from their pods and
    the Warning Events about them); --all: every index.

    SWEEP is a sweep name or its spec file.

    
    Examples:
      thicket status textcraft-mcts-8b -n thicket
      thicket status sweeps/cluster/textcraft-mcts.yaml --watch
      thicket status textcraft-mcts-8b --all --format json
    """
    import json

    from rich.console import Console

    from thicket.k8s.client import connect, default_namespace
    from thicket.k8s.status import sweep_status
    from thicket.k8s.status_view import render_status

    if fmt and old_format and fmt != old_format:
        raise BadInput(f"--format {fmt} and -o {old_format} disagree: give --format alone")
    output = fmt or old_format or "text"
    name, namespace = _sweep_and_namespace(sweep, namespace)
    kube = connect(context)
    ns = default_namespace(kube, namespace)
    result = sweep_status(kube, ns, name, storage=not no_storage)
    if output == "json":
        click.echo(json.dumps(result.as_json()))
        while watch and not result.finished:
            time.sleep(interval)
            result = sweep_status(kube, ns, name, storage=not no_storage)
            click.echo(json.dumps(result.as_json()))
        return
    console = Console(highlight=False)
    if not watch:
        console.print(render_status(result, all_rows=all_rows), soft_wrap=True)
        return
    from rich.live import Live

    def view(result):  # the summary and ETA on top; rows as many as the terminal holds
        limit = max(3, console.size.height - len(result.summary_lines()) - 4)
        return render_status(result, crop=True, all_rows=all_rows, limit=limit)

    with Live(view(result), console=console, refresh_per_second=1, vertical_overflow="crop") as live:
        while not result.finished:
            time.sleep(interval)
            result = sweep_status(kube, ns, name, storage=not no_storage)
            live.update(view(result))


@click.command(short_help="Logs of the latest pod of one index of a cluster sweep.")
@click.argument("sweep")
@click.option("--index", type=int, required=True, help="Job completion index.")
@click.option("-c", "--container", default="worker", show_default=True, help="Container: worker, vllm, env-FAMILY.")
@click.option("-f", "--follow", is_flag=True, help="Stream new lines.")
@click.option("--tail", type=int, default=None, help="Only the last N lines.")
@click.option("-p", "--previous", is_flag=True,
              help="The container's previous instance (the one that crashed before its restart).")
@namespace_option
@context_option
def logs(sweep: str, index: int, container: str, follow: bool, tail: int | None, previous: bool, namespace: str | None,
         context: str | None) -> None:
    """Logs of the latest pod of one index of SWEEP (a sweep name or its spec file).

    
    Examples:
      thicket logs textcraft-mcts-8b --index 3
      thicket logs textcraft-mcts-8b --index 0 -c vllm --tail 100
      thicket logs sweeps/cluster/textcraft-mcts.yaml --index 2 --previous
    """
    from thicket.k8s.client import connect, default_namespace
    from thicket.k8s.status import index_pod
    from thicket.k8s.status_view import stdout_write

    name, namespace = _sweep_and_namespace(sweep, namespace)
    kube = connect(context)
    ns = default_namespace(kube, namespace)
    pod = index_pod(kube, ns, name, index)
    containers = [c["name"] for c in (pod.get("spec") or {}).get("initContainers", []) + (pod.get("spec") or {}).get("containers", [])]
    if containers and container not in containers:
        raise BadInput(f"--container: {container!r} is not in pod {pod['metadata']['name']} ({', '.join(containers)})")
    if previous and follow:
        raise BadInput("--follow: a previous container instance has ended; drop --follow or --previous")
    which = " (previous instance)" if previous else ""
    click.echo(f"# pod {pod['metadata']['name']} container {container}{which}", err=True)
    for chunk in kube.logs(ns, pod["metadata"]["name"], container, follow, tail, previous):
        stdout_write(chunk)


@click.command(short_help="Stop a cluster sweep (its Jobs and pods); shards stay.")
@click.argument("sweep")
@namespace_option
@context_option
def cancel(sweep: str, namespace: str | None, context: str | None) -> None:
    """Stop SWEEP: delete its Jobs (and their pods), ConfigMap and RBAC. Committed shards stay.

    
    Examples:
      thicket cancel textcraft-mcts-8b -n thicket
      thicket cancel sweeps/cluster/textcraft-mcts.yaml
    """
    from thicket.k8s.client import connect, default_namespace
    from thicket.k8s.submit import cancel as cancel_sweep

    name, namespace = _sweep_and_namespace(sweep, namespace)
    kube = connect(context)
    cancel_sweep(kube, default_namespace(kube, namespace), name, echo=click.echo)


@click.command("wait-job", short_help="Wait until a Job is Complete or Failed.")
@click.argument("job")
@namespace_option
@context_option
@click.option("--timeout", type=float, default=0, help="Give up (exit 3) after this many seconds; 0: never.")
@click.option("--interval", type=float, default=10, show_default=True, help="Seconds between polls.")
@click.option("--require-success", is_flag=True, help="Exit 1 when the Job failed (default: go on; aggregate what was committed).")
@click.option("--release", "release", metavar="JOB2", help="Then let Job JOB2, created suspended, run (the aggregation Job).")
@click.option("--release-queue", metavar="QUEUE", help="With --release: add this Kueue queue label instead of unsuspending.")
@click.option("--start-watchdog", type=click.FloatRange(min=0), default=0, metavar="SECONDS",
              help="Watch JOB's pods: one whose worker has not started SECONDS after the pod did is evicted, or, "
                   "before any worker ever started, JOB is stopped (thicket.k8s.start_watch). 0: off.")
def wait_job(job: str, namespace: str | None, context: str | None, timeout: float, interval: float, require_success: bool,
             release: str | None, release_queue: str | None, start_watchdog: float) -> None:
    """Wait until Job JOB is Complete or Failed (the aggregation's waiter), then release --release.

    
    Examples:
      thicket wait-job textcraft-mcts-8b -n thicket --timeout 3600 --require-success
      thicket wait-job textcraft-mcts-8b --release textcraft-mcts-8b-aggregate
    """
    from thicket.k8s.client import connect, default_namespace
    from thicket.k8s.job_wait import release_job
    from thicket.k8s.job_wait import wait_job as wait

    kube = connect(context)
    ns = default_namespace(kube, namespace)
    check = None
    if start_watchdog:
        from thicket.k8s.start_watch import StartupWatchdog

        check = StartupWatchdog(kube, ns, job, start_watchdog, time.monotonic, echo=click.echo).check
    state = wait(kube, ns, job, timeout, interval, echo=click.echo, check=check)
    if state == "Failed":
        if require_success:
            click.echo(f"job/{job} failed", err=True)
            sys.exit(1)
        click.echo(f"job/{job} failed: going on with the tasks it committed", err=True)
    if release:
        release_job(kube, ns, release, release_queue, echo=click.echo)


@click.command(short_help="Run SPEC's rendered pods here with podman, on a local S3.")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--index", type=click.IntRange(min=0), default=0, show_default=True, help="The rollout Job's index to run.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Pod files, volumes and logs (default: out/rehearsal/NAME).")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800, show_default=True, help="Seconds each pod may run.")
@click.option("--version", "image_version", help="Tag of the local images (default: thicket's version).")
@click.option("--aggregate/--no-aggregate", "then_aggregate", default=True, help="Run the aggregation pod after the rollout pod.")
@click.option("--pull", "pull_to", type=click.Path(file_okay=False), help="Then `thicket pull` the sweep into this folder.")
def rehearse(spec: str, index: int, workdir: str | None, timeout: float, image_version: str | None,
             then_aggregate: bool, pull_to: str | None) -> None:
    """Run SPEC's rendered rollout pod (one index) and aggregation pod with podman, against a local S3.

    
    Examples:
      thicket rehearse sweeps/demo.yaml --index 0
      thicket rehearse sweeps/demo.yaml --pull out/pod-demo
      thicket rehearse sweeps/cluster/textcraft-mcts.yaml --index 1 --no-aggregate
    """
    from thicket.version import __version__
    from thicket.k8s.rehearsal import End, Images, LocalS3, Rehearsal, sweep_uri

    s = load_spec(spec)
    folder = Path(workdir or f"out/rehearsal/{s.name}")
    rehearsal = Rehearsal(s, index, Images.local(image_version or __version__), folder, timeout_s=timeout,
                          aggregate=then_aggregate)
    s3: LocalS3 | None = None
    for step in rehearsal.run():
        if isinstance(step, LocalS3):
            s3 = step
            click.echo(f"local S3 {s3.host_url} (container {s3.container}; pods reach it at {s3.pod_url})")
            continue
        click.echo(step.reason())
        if step.reachable_from_outside:
            ports = ", ".join(f"{port} {'open' if open_ else 'closed'}"
                              for port, open_ in step.reachable_from_outside.items())
            click.echo(f"pod {step.pod} from outside: {ports}")
        if step.end is not End.SUCCEEDED:
            click.echo(f"logs: {folder / 'logs'}", err=True)
            sys.exit(step.exit_code())
    assert s3 is not None
    uri = sweep_uri(s, s3)
    access = f"AWS_ENDPOINT_URL={s3.host_url} AWS_ACCESS_KEY_ID=rehearsal AWS_SECRET_ACCESS_KEY=rehearsal"
    click.echo(f"datasets: {uri}/datasets on the local S3; fetch them with\n  {access} thicket pull {uri} DIR")
    click.echo(f"stop the local S3 (its data goes with it): podman rm -f {s3.container}")
    if pull_to:
        from thicket.k8s.podman import S3_ACCESS
        from thicket.pull import pull_sweep

        os.environ.update({**S3_ACCESS, "AWS_ENDPOINT_URL": s3.host_url})
        for line in pull_sweep(uri, Path(pull_to), progress=False).lines():
            click.echo(line)


COMMANDS: list[click.Command] = [render, submit, status, logs, cancel, wait_job, rehearse]
__all__ = ["COMMANDS"]
