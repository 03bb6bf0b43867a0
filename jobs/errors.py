"""Errors that reach the user, each with the exit code the CLI and the pod report."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # an unexpected failure: a bug, or a fault we could not recover from
    BAD_INPUT = 2  # the spec or the command line is wrong: rerunning will not help
    UNAVAILABLE = 3  # a server (vLLM, env, storage) could not be reached in time
    DEADLINE = 4  # the index's deadline passed with tasks not run: a rerun resumes


class ThicketError(Exception):
    """An error with a one-line message meant for the user."""

    exit_code = ExitCode.FAILED


class BadInput(ThicketError):
    exit_code = ExitCode.BAD_INPUT


class Unavailable(ThicketError):
    exit_code = ExitCode.UNAVAILABLE


class NothingAnswers(BadInput):
    """Nothing answered at a URL for a whole start-up window. Run by hand, that is a wrong URL
    (exit 2). In a pod it may be a server or DNS not up yet: `thicket worker` reports it as
    Unavailable (exit 3), so the index is retried with its backoff instead of failed for good."""

    def unavailable(self) -> Unavailable:
        return Unavailable(f"{self.args[0]} (retried with the index's backoff)")


class DeadlineExceeded(ThicketError):
    exit_code = ExitCode.DEADLINE
