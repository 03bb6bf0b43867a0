"""The `thicket` command line."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import cast

import click

from thicket.errors import BadInput, ExitCode, NothingAnswers, ThicketError
from thicket.logs import FORMAT_VARIABLE, FORMATS, LogFormat, setup_logging
from thicket.spec import SweepSpec, load_spec, parse_indices, parse_spec
from thicket.tiny_model import SIZES, build_tiny_model


def _spec_with_overrides(spec_path: str, output: str | None, policy: str | None) -> SweepSpec:
    """The spec with command-line overrides applied, validated again."""
    spec = load_spec(spec_path)
    if output is None and policy is None:
        return spec
    data = spec.model_dump()
    if output is not None:
        data["output"] = output
    if policy is not None:
        data["policy"]["kind"] = policy
    return parse_spec(data, spec_path)


def _plural(count: int, noun: str, plural: str | None = None) -> str:
    """'1 pod', '2 pods'; '1 index', '2 indexes'."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _check_output_file(path: str) -> Path:
    """-o PATH as a file to write: BadInput naming it and why when its folder is not there."""
    out = Path(path)
    if out.is_dir():
        raise BadInput(f"-o {path}: is a folder; give a file's path")
    if not out.resolve().parent.is_dir():
        raise BadInput(f"-o {path}: cannot write it (its folder {out.resolve().parent} does not exist)")
    return out


def _write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise BadInput(f"-o {path}: cannot write it ({err.strerror or err})") from None


def _examples(*lines: str) -> str:
    """An epilog of example command lines, kept as written (click's \\b paragraph)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="thicket")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
@click.option("--log-format", type=click.Choice(FORMATS), default="text", show_default=True, envvar=FORMAT_VARIABLE,
              show_envvar=True, help="Logs on stderr: text, or json (one object per line).")
def cli(verbose: bool, log_format: str) -> None:
    """thicket: tree-search rollouts of LLM agents, as training data for agent RL."""
    setup_logging(cast(LogFormat, log_format), verbose)


allow_spec_change_option = click.option(
    "--allow-spec-change", is_flag=True,
    help="Grow trees even though SPEC differs from the sweep's stored spec.yaml in what determines them "
         "(the sweep then mixes both: spec.yaml keeps the first, spec-history/ the new one).")
metrics_port_option = click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
                                   help="Serve Prometheus metrics at :PORT/metrics while running (0: off).")


@cli.command(short_help="Check SPEC and print the plan (tasks, pods, search).", epilog=_examples(
    "thicket validate sweeps/demo.yaml",
    "thicket validate sweeps/taxi-tot.yaml --policy uniform",
))
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--policy", type=click.Choice(["uniform"]), help="Check SPEC as `thicket run --policy uniform` would run it.")
def validate(spec: str, policy: str | None) -> None:
    """Check SPEC and print the plan (tasks, pods, search)."""
    from thicket.rollout.probe import check_policy_fits_env
    from thicket.spec_notes import model_folder_note, plan_text, task_range_note

    s = _spec_with_overrides(spec, None, policy)
    if note := check_policy_fits_env(s):  # the env is asked: a uniform policy needs listed actions
        click.echo(note, err=True)
    local = not s.sweep_uri.startswith("s3://")  # a cluster sweep's pods fetch policy.model from the hub
    for note in (task_range_note(s.tasks), model_folder_note(s.policy) if local else None):  # maybe not what was meant
        if note:
            click.echo(note, err=True)
    ranges = s.tasks.index_ranges()
    click.echo(f"{spec}: ok")
    click.echo(f"sweep   {s.name} -> {s.sweep_uri}")
    click.echo(f"tasks   {s.tasks.env} {s.tasks.start}-{s.tasks.stop - 1} ({_plural(s.tasks.count, 'task')}, "
               f"{_plural(len(ranges), 'pod')} of <= {s.tasks.per_index})")
    click.echo(f"search  {s.search.algorithm}: {plan_text(s.search, frozenset({'algorithm'}))}")
    p = s.policy
    uses = "" if p.kind == "uniform" else f" {p.model or ''} {p.url or ''}"  # uniform needs neither
    click.echo(f"policy  {p.kind}{uses}".rstrip())
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
    click.echo(f"cluster {c.namespace}: {_plural(len(ranges), 'index', 'indexes')}, {min(c.parallelism, len(ranges))} at a time{gpus}")
    from thicket.k8s.node_fit import report

    # A cluster sweep (output on S3): the pod's request, the GPU nodes it fits, loading the model.
    if s.sweep_uri.startswith("s3://") and (fit := report(s, objects)):
        click.echo("\n".join(fit.lines))
        for warning in fit.warnings:
            click.echo(f"warning: {warning}", err=True)


@cli.command(short_help="Run SPEC's tasks on this machine, then build the datasets.", epilog=_examples(
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
    from thicket.rollout.sweep import raise_for_failures, run_tasks

    from thicket.spec_notes import task_range_note

    s = _spec_with_overrides(spec, output, policy)
    if note := task_range_note(s.tasks):
        click.echo(note, err=True)
    tasks = parse_indices(indices, s.tasks) if indices is not None else list(range(s.tasks.start, s.tasks.stop))
    with metrics_served(metrics_port, "127.0.0.1"):
        summary = asyncio.run(run_tasks(s, tasks, progress=progress,
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


@cli.command("eval", short_help="pass@1, pass@k and mean return of SPEC's policy, 95% intervals.",
             epilog=_examples(
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

    s = _spec_with_overrides(spec, None, policy)
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


@cli.command(short_help="Run one pod's share of SPEC (one Job completion index).")
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--index", type=int, default=None, help="Job completion index (default: $JOB_COMPLETION_INDEX).")
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

    s = _spec_with_overrides(spec, output, None)
    if index is None:
        raw = os.environ.get("JOB_COMPLETION_INDEX")
        if raw is None or not raw.isdigit():
            raise BadInput("--index: not given and JOB_COMPLETION_INDEX is not set to a number")
        index = int(raw)
    ranges = s.tasks.index_ranges()
    if not 0 <= index < len(ranges):
        raise BadInput(f"--index: {index} is outside 0-{len(ranges) - 1} for this spec")
    tasks = list(ranges[index])
    try:
        store = checked_store(s, allow_spec_change or s.run.allow_spec_change)  # before the servers: a wrong bucket, key or spec fails now
        if set(tasks) <= committed_task_ids(store):  # a resumed sweep: this index is done, no server needed
            click.echo(f"index {index}: all {_plural(len(tasks), 'task')} already committed in {s.sweep_uri}")
            return
        # Served from the start, so a pod waiting for its servers is up to Prometheus (it scrapes the pod IP).
        with metrics_served(metrics_port, "0.0.0.0"):
            if wait_for:
                from thicket.readiness import wait_ready

                wait_ready(wait_for, wait_ready_timeout)
            summary = asyncio.run(run_tasks(s, tasks, progress=False, store=store))
    except NothingAnswers as err:  # in a pod: DNS or a server not up yet, not a spec mistake
        raise err.unavailable() from None
    for line in summary.lines():
        click.echo(line)
    raise_for_failures(summary)


@cli.command(short_help="Export a sweep's committed trees to a file (tot-json).", epilog=_examples(
    "thicket export out/demo-textcraft-mcts -o tot_agent_results.json",
    "thicket export s3://bucket/prefix/NAME --format tot-json -o - | gzip > tot.json.gz",
))
@click.argument("sweep_uri")
@click.option("--format", "fmt", type=click.Choice(["tot-json"]), default="tot-json", show_default=True,
              help="tot-json: the ToT pipeline's tot_agent_results.json, one episode per task with a path per leaf.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="File to write; '-': stdout (the default only when stdout is not a terminal: exports are large).")
def export(sweep_uri: str, fmt: str, output: str | None) -> None:
    """Export a sweep's committed trees in another pipeline's layout (tot-json: the ToT
    pipeline's tot_agent_results.json) to the file -o names."""
    from thicket.export import export_tot_json

    if output is None:
        if click.get_text_stream("stdout").isatty():
            raise BadInput("export: give -o FILE (or -o - to print it on this terminal): an export is megabytes of JSON")
        output = "-"
    path = None if output == "-" else _check_output_file(output)  # before the work
    text = export_tot_json(sweep_uri)
    if path is None:
        click.echo(text)
    else:
        _write_text(path, text)
        click.echo(f"wrote {path}", err=True)


@cli.command(short_help="Render one committed search tree as a standalone HTML page.", epilog=_examples(
    "thicket show out/demo-textcraft-mcts --task 200          # writes tree-task-200.html",
    "thicket show s3://bucket/prefix/NAME --task 3 -o tree.html",
))
@click.argument("sweep_uri")
@click.option("--task", type=int, required=True, help="The task whose tree to show.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="HTML file to write (default: tree-task-N.html here; '-': stdout).")
def show(sweep_uri: str, task: int, output: str | None) -> None:
    """Render one committed search tree of SWEEP_URI as a standalone HTML page."""
    from thicket.show import show_html

    path = None if output == "-" else _check_output_file(output or f"tree-task-{task}.html")  # before the work
    page = show_html(sweep_uri, task)
    if path is None:
        click.echo(page, nl=False)
        return
    _write_text(path, page)
    click.echo(f"wrote {path}")


@cli.command(short_help="Copy a sweep's committed trees and datasets/ into a folder.", epilog=_examples(
    "thicket pull s3://bucket/prefix/NAME out/NAME",
    "thicket pull out/demo-textcraft-mcts /tmp/demo-copy --no-progress",
))
@click.argument("sweep_uri")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def pull(sweep_uri: str, dest: str, progress: bool) -> None:
    """Copy a sweep's committed shards (checksums verified) and datasets/ to DEST; resumable."""
    from thicket.pull import pull_sweep

    for line in pull_sweep(sweep_uri, Path(dest), progress=progress).lines():
        click.echo(line)


@cli.command(short_help="Build a sweep's datasets, stats and report under datasets/.", epilog=_examples(
    "thicket aggregate out/demo-textcraft-mcts",
    "thicket aggregate s3://bucket/prefix/NAME --sft-min-reward 1 --workers 0",
))
@click.argument("sweep_uri")
@click.option("--verifier-url", help="OpenAI-compatible API root that judges revision steps (default: a heuristic).")
@click.option("--verifier-model", help="Model name served at --verifier-url.")
@click.option("--sft-min-reward", type=float, help="SFT: a path's return must reach this.")
@click.option("--dpo-beta", type=float, help="DPO step pairs: minimum sibling value gap.")
@click.option("--dpo-min-visits", type=int, help="DPO step pairs: visits each sibling needs.")
@click.option("--max-trajectory-pairs", type=int, help="DPO trajectory pairs per task at most.")
@click.option("--revision-alpha", type=float, help="Revision: a good path's value must exceed this.")
@click.option("--revision-beta", type=float, help="Revision: good minus bad value must exceed this.")
@click.option("--max-revisions", type=int, help="Revision trajectories per task at most.")
@click.option("--workers", type=click.IntRange(min=0), help="Processes building rows (default: by sweep size and cores; 0: none).")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def aggregate(
    sweep_uri: str, verifier_url: str | None, verifier_model: str | None, workers: int | None, progress: bool,
    **flags: float | int | None,
) -> None:
    """Build SWEEP_URI's datasets (SFT, DPO, revision, token rows), stats and report under datasets/."""
    from thicket.aggregate.driver import aggregate as build_datasets
    from thicket.aggregate.verifier import VerifierConfig

    if (verifier_url is None) != (verifier_model is None):
        raise BadInput("--verifier-url and --verifier-model go together")
    overrides = {
        "sft": {"min_reward": flags["sft_min_reward"]},
        "dpo": {"beta": flags["dpo_beta"], "min_visits": flags["dpo_min_visits"],
                "max_trajectory_pairs_per_task": flags["max_trajectory_pairs"]},
        "revision": {"alpha": flags["revision_alpha"], "beta": flags["revision_beta"], "max_per_task": flags["max_revisions"]},
    }
    verifier = VerifierConfig(verifier_url, verifier_model) if verifier_url and verifier_model else None
    for line in build_datasets(sweep_uri, overrides, verifier, workers=workers, progress=progress).lines():
        click.echo(line)


@cli.command("make-model", short_help="Build a demo model: untrained, or the trained demo policy.",
             epilog=_examples(
                 "thicket make-model models/demo --demo",
                 "thicket make-model models/tiny",
                 "thicket make-model models/small --size small",
                 "thicket make-model models/mine --train textcraft --seed 1",
             ))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--python", help="Interpreter with torch and transformers (default: THICKET_VLLM_PYTHON or .venv-vllm).")
@click.option("--size", type=click.Choice(list(SIZES)), default="tiny", show_default=True,
              help="tiny (~0.16M parameters: tests, demos) or small (~15M: CPU benchmarks where the model should compute).")
@click.option("--demo", is_flag=True, help="Copy the trained demo policy that comes with thicket (a toy, see its README).")
@click.option("--train", "train_env", metavar="ENV", help="Train a demo policy on ENV's scripted play (minutes on a CPU).")
@click.option("--seed", type=int, default=0, show_default=True, help="With --train: the seed of the experts and the training.")
def make_model(out_dir: str, python: str | None, size: str, demo: bool, train_env: str | None, seed: int) -> None:
    """Build a demo model: random (UNTRAINED, for plumbing), or the trained demo policy (--demo, --train)."""
    from thicket.training.demo_model import make_demo_model

    if demo or train_env:
        click.echo(make_demo_model(out_dir, train_env, seed, python))
        return
    build_tiny_model(out_dir, python=python, size=size)
    click.echo(f"built an untrained {size} model in {out_dir}")


from thicket.k8s.commands import COMMANDS as _CLUSTER_COMMANDS  # noqa: E402  (render, submit, status, ...)

for _command in _CLUSTER_COMMANDS:
    cli.add_command(_command)


@cli.command("envs", short_help="List the env families: distinct tasks, splits, extras.")
def envs_command() -> None:
    """List the env families: how many distinct tasks each has (or that it generates them),
    its splits, and the extra that installs it (and whether that is installed here).

    Cheap: no env is made, no server started, no data downloaded."""
    from thicket.env_list import table

    for line in table():
        click.echo(line)


@cli.command("serve-env", short_help="Serve envs over HTTP (AgentGym-compatible routes).", epilog=_examples(
    "thicket serve-env textcraft",
    "thicket serve-env frozenlake taxi --host 0.0.0.0 --port 9000",
    "curl -s localhost:8080/health",
))
@click.argument("envs", nargs=-1, required=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True,
              help="Port to listen on.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--max-instances", type=click.IntRange(1), default=1024, show_default=True, help="Live env instances at most.")
@click.option("--idle-timeout", type=click.FloatRange(min=0.01), default=600.0, show_default=True,
              help="Close instances unused for this many seconds.")
@click.option("--max-action-chars", type=click.IntRange(1), default=4096, show_default=True,
              help="Longest action /step accepts, in characters (a longer one is answered with an error).")
@click.option("--max-snapshots", type=click.IntRange(1), default=4096, show_default=True,
              help="Snapshots kept per instance (least recently used evicted).")
@click.option("--refuse-after-done", multiple=True, metavar="ENV",
              help="Answer 409 to /step after the episode is over for ENV (default: sciworld, alfworld, babyai, "
                   "whose AgentGym servers refuse it; others answer 'The episode is over.': docs/env-server.md).")
@click.option("--parent-pid", type=int, hidden=True, help="Shut down when this process is gone.")
def serve_env(envs: tuple[str, ...], port: int, host: str, max_instances: int, idle_timeout: float,
              max_action_chars: int, max_snapshots: int, refuse_after_done: tuple[str, ...],
              parent_pid: int | None) -> None:
    """Serve ENV... over HTTP: many instances in one process (AgentGym-compatible routes)."""
    from thicket.envs.server import serve
    from thicket.envs.service import AGENTGYM_REFUSE_AFTER_DONE, ServerConfig

    refuse = frozenset(refuse_after_done) if refuse_after_done else AGENTGYM_REFUSE_AFTER_DONE
    serve(ServerConfig(tuple(dict.fromkeys(envs)), host, port, max_instances, idle_timeout,
                       max_snapshots=max_snapshots, max_action_chars=max_action_chars, refuse_after_done=refuse,
                       parent_pid=parent_pid))


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds context managers: child servers are stopped


# click >= 8.2 raises this for a group called without arguments (older clicks print the help and exit 0)
_NO_ARGS_IS_HELP: type[Exception] = getattr(click.exceptions, "NoArgsIsHelpError", ())  # type: ignore[assignment]


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(standalone_mode=False)
    except _NO_ARGS_IS_HELP as err:  # `thicket` alone: the help, not an error
        click.echo(err.ctx.get_help() if err.ctx else cli.get_help(click.Context(cli)))
        sys.exit(ExitCode.OK)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as err:  # usage mistakes: one line, exit 2
        click.echo(f"error: {err.format_message()}", err=True)
        sys.exit(ExitCode.BAD_INPUT if isinstance(err, click.UsageError) else err.exit_code)
    except ThicketError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
