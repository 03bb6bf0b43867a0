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

from thicket.async_main import Terminated  # SIGTERM's interrupt, raised where no event loop runs
from thicket.cli.spec_commands import eval_command, run, validate, worker
from thicket.cli.sweep_commands import aggregate, export, pull, show
from thicket.cli.tool_commands import envs_command, make_model, serve_env
from thicket.errors import ExitCode, ThicketError
from thicket.k8s.commands import COMMANDS as CLUSTER_COMMANDS  # render, submit, status, ...
from thicket.logs import FORMAT_VARIABLE, FORMATS, LogFormat, setup_logging


class Stopped(Exception):
    """An interrupt (Ctrl-C, or SIGTERM's Terminated) once it left the command: click meets it as an
    error, not as an interrupt, for which it would print a blank line before thicket's last line."""

    def __init__(self, how: str, exit_code: int) -> None:
        super().__init__(how)
        self.how, self.exit_code = how, exit_code


class ThicketGroup(click.Group):
    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except Terminated:
            raise Stopped("terminated (SIGTERM)", 143) from None
        except KeyboardInterrupt:
            raise Stopped("interrupted (Ctrl-C)", 130) from None


@click.group(cls=ThicketGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
        if isinstance(err.__context__, Terminated):  # a SIGTERM before or after the command ran
            _stopped("terminated (SIGTERM)", 143)
        _stopped("interrupted (Ctrl-C)", 130)
    except Stopped as stop:
        _stopped(stop.how, stop.exit_code)
    except click.exceptions.ClickException as err:  # usage mistakes: one line, exit 2
        click.echo(f"error: {err.format_message()}", err=True)
        sys.exit(ExitCode.BAD_INPUT if isinstance(err, click.UsageError) else err.exit_code)
    except ThicketError as err:
        click.echo(f"error: {err}", err=True)
        sys.exit(err.exit_code)
    except Terminated:
        _stopped("terminated (SIGTERM)", 143)
    except KeyboardInterrupt:
        _stopped("interrupted (Ctrl-C)", 130)


def _stopped(how: str, code: int) -> None:
    """A stop's last line: what stopped the command and how to go on (every command resumes or redoes
    its work when run again: run and worker skip committed trees and resume the growing ones)."""
    click.echo(f"{how}: run the same command again to resume", err=True)
    sys.exit(code)
