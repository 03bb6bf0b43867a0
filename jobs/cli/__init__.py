"""The `thicket` command line: the group, its commands, and main().

- `spec_commands`: validate, run, eval, worker (they take a SPEC);
- `sweep_commands`: export, show, pull, aggregate (they take a sweep's folder);
- `tool_commands`: make-model, envs, serve-env;
- thicket.k8s.commands: render, submit, status, logs, cancel, wait-job, rehearse (a cluster's);
- `common`: what they share (the spec with overrides, options, output files, help examples).
"""

from __future__ import annotations

import signal
import sys
from typing import cast

import click

from thicket.cli.spec_commands import eval_command, run, validate, worker
from thicket.cli.sweep_commands import aggregate, export, pull, show
from thicket.cli.tool_commands import envs_command, make_model, serve_env
from thicket.errors import ExitCode, ThicketError
from thicket.k8s.commands import COMMANDS as CLUSTER_COMMANDS  # render, submit, status, ...
from thicket.logs import FORMAT_VARIABLE, FORMATS, LogFormat, setup_logging


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="thicket")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
@click.option("--log-format", type=click.Choice(FORMATS), default="text", show_default=True, envvar=FORMAT_VARIABLE,
              show_envvar=True, help="Logs on stderr: text, or json (one object per line).")
def cli(verbose: bool, log_format: str) -> None:
    """thicket: tree-search rollouts of LLM agents, as training data for agent RL."""
    setup_logging(cast(LogFormat, log_format), verbose)


for _command in (validate, run, eval_command, worker, export, show, pull, aggregate, make_model,
                 *CLUSTER_COMMANDS, envs_command, serve_env):
    cli.add_command(_command)


class Terminated(KeyboardInterrupt):
    """SIGTERM (Kubernetes' preemption and drain signal): unwinds as an interrupt does."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated  # unwinds context managers: child servers are stopped, growing trees saved


# click >= 8.2 raises this for a group called without arguments (older clicks print the help and exit 0)
_NO_ARGS_IS_HELP: type[Exception] = getattr(click.exceptions, "NoArgsIsHelpError", ())  # type: ignore[assignment]


def main() -> None:
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(standalone_mode=False)
    except _NO_ARGS_IS_HELP as err:  # `thicket` alone: the help, not an error
        click.echo(err.ctx.get_help() if err.ctx else cli.get_help(click.Context(cli)))
        sys.exit(ExitCode.OK)
    except click.exceptions.Abort as err:
        if isinstance(err.__context__, Terminated):
            click.echo("terminated (SIGTERM)", err=True)
            sys.exit(143)
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.ClickException as err:  # usage mistakes: one line, exit 2
        click.echo(f"error: {err.format_message()}", err=True)
        sys.exit(ExitCode.BAD_INPUT if isinstance(err, click.UsageError) else err.exit_code)
    except ThicketError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except Terminated:
        click.echo("terminated (SIGTERM)", err=True)
        sys.exit(143)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
