"""The commands around the sweeps: make-model (a demo model), envs (the env families) and serve-env
(envs over HTTP)."""

from __future__ import annotations

import click

from thicket.cli.common import examples
from thicket.tiny_model import SIZES, build_tiny_model


@click.command("make-model", short_help="Build a demo model: untrained, or the trained demo policy.",
             epilog=examples(
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


@click.command("envs", short_help="List the env families: distinct tasks, splits, extras, env_args.", epilog=examples(
    "thicket envs",
    "thicket envs webshop",
    "thicket envs frozenlake taxi",
))
@click.argument("families", nargs=-1, metavar="[FAMILY]...")
def envs_command(families: tuple[str, ...]) -> None:
    """List the env families (or only FAMILY...): how many distinct tasks each has (or that it
    generates them), its splits, the extra that installs it (and whether that is installed here),
    then each one's env_args: name, what it takes, default.

    Cheap: no env is made, no server started, no data downloaded."""
    from thicket.env_list import table

    for line in table(families):
        click.echo(line)


@click.command("serve-env", short_help="Serve envs over HTTP (AgentGym-compatible routes).", epilog=examples(
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
