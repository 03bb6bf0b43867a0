"""The `thicket` command line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import click

from thicket.errors import BadInput, ExitCode, ThicketError
from thicket.spec import SweepSpec, load_spec, parse_indices, parse_spec


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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="thicket")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def cli(verbose: bool) -> None:
    """thicket: tree-search rollouts of LLM agents, as training data for agent RL."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
def validate(spec: str) -> None:
    """Check SPEC and print the plan (tasks, pods, search)."""
    s = load_spec(spec)
    ranges = s.tasks.index_ranges()
    click.echo(f"{spec}: ok")
    click.echo(f"sweep   {s.name} -> {s.sweep_uri}")
    click.echo(f"tasks   {s.tasks.env} {s.tasks.start}-{s.tasks.stop - 1} ({s.tasks.count} tasks, {len(ranges)} pods of <= {s.tasks.per_index})")
    click.echo(f"search  {s.search.algorithm}: {s.search.model_dump(exclude={'algorithm'})}")
    click.echo(f"policy  {s.policy.kind} {s.policy.model or ''} {s.policy.url or ''}".rstrip())


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--output", help="Override the spec's output (local path or file:// URI).")
@click.option("--indices", help="Task indices to run, e.g. 0-9 or 3,5,7-8 (default: all).")
@click.option("--policy", type=click.Choice(["uniform"]), help="Replace the spec's policy by the uniform baseline.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar on a terminal.")
def run(spec: str, output: str | None, indices: str | None, policy: str | None, progress: bool) -> None:
    """Run SPEC's tasks locally (starting vLLM if the spec serves a local model)."""
    from thicket.runner import raise_for_failures, run_tasks

    s = _spec_with_overrides(spec, output, policy)
    tasks = parse_indices(indices, s.tasks) if indices else list(range(s.tasks.start, s.tasks.stop))
    summary = asyncio.run(run_tasks(s, tasks, progress=progress))
    for line in summary.lines():
        click.echo(line)
    raise_for_failures(summary)


@cli.command()
@click.argument("spec", type=click.Path(dir_okay=False))
@click.option("--index", type=int, default=None, help="Job completion index (default: $JOB_COMPLETION_INDEX).")
@click.option("--output", help="Override the spec's output.")
def worker(spec: str, index: int | None, output: str | None) -> None:
    """Run one pod's share of SPEC: the task range of one Job completion index."""
    from thicket.runner import raise_for_failures, run_tasks

    s = _spec_with_overrides(spec, output, None)
    if index is None:
        raw = os.environ.get("JOB_COMPLETION_INDEX")
        if raw is None or not raw.isdigit():
            raise BadInput("--index: not given and JOB_COMPLETION_INDEX is not set to a number")
        index = int(raw)
    ranges = s.tasks.index_ranges()
    if not 0 <= index < len(ranges):
        raise BadInput(f"--index: {index} is outside 0-{len(ranges) - 1} for this spec")
    summary = asyncio.run(run_tasks(s, list(ranges[index]), progress=False))
    for line in summary.lines():
        click.echo(line)
    raise_for_failures(summary)


@cli.command()
@click.argument("sweep_uri")
@click.option("--format", "fmt", type=click.Choice(["tot-json"]), default="tot-json", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="-", help="File to write ('-': stdout).")
def export(sweep_uri: str, fmt: str, output: str) -> None:
    """Export a sweep's committed trees (tot-json: the ToT pipeline's tot_agent_results.json)."""
    from thicket.export import export_tot_json

    text = export_tot_json(sweep_uri)
    if output == "-":
        click.echo(text)
    else:
        Path(output).write_text(text)
        click.echo(f"wrote {output}", err=True)


@cli.command("make-model")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--python", help="Interpreter with torch and transformers (default: THICKET_VLLM_PYTHON or .venv-vllm).")
def make_model(out_dir: str, python: str | None) -> None:
    """Build the tiny demo model (random weights: UNTRAINED, for plumbing only)."""
    from thicket.tiny_model import build_tiny_model

    build_tiny_model(out_dir, python=python)
    click.echo(f"built an untrained tiny model in {out_dir}")


def main() -> None:
    try:
        cli.main(standalone_mode=False)
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
