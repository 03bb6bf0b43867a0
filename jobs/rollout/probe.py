"""Before a run: does the spec's env list its valid actions? The uniform policy picks among them,
so a spec pairing it with an env that lists none (AgentGym's TextCraft, the math env) would pass
`validate` and then fail in `run`. `thicket validate` and `thicket render` ask here.

Asked where the run's envs come from: in mode remote, the server itself (thicket's or AgentGym's,
one env made, reset to the first task and closed, within a short deadline); otherwise the family
in process, as the sidecar would run it. Where it cannot ask (the server is not reachable from
here, the family's package is not installed), it says so instead of guessing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from thicket.envs import EnvNotInstalled, make_env
from thicket.envs.client import Adapter
from thicket.envs.protocol import Env
from thicket.errors import BadInput, ThicketError
from thicket.spec import SweepSpec, TasksSpec

DEADLINE_S = 10.0  # for the whole probe of a remote server: validate must not hang on an unreachable one


@dataclass(frozen=True)
class Probe:
    lists_actions: bool | None  # None: could not ask
    where: str  # what was asked, for messages
    why: str = ""  # why it could not ask


async def _first_actions(env: Env, task: int) -> tuple[str, ...] | None:
    try:
        return (await env.reset(task)).valid_actions
    finally:
        await env.close()


async def _ask_server(tasks: TasksSpec, url: str) -> tuple[str, ...] | None:
    from thicket.rollout.envs import remote_envs

    quick = tasks.env_server.model_copy(
        update={"timeout_s": DEADLINE_S, "retry_deadline_s": DEADLINE_S / 2, "startup_timeout_s": DEADLINE_S / 2}
    )
    adapter = Adapter(tasks.env_server.adapter)
    async with remote_envs(tasks.model_copy(update={"env_server": quick}), url, adapter) as new_env:
        return await _first_actions(new_env(), tasks.start)


async def probe_actions(tasks: TasksSpec) -> Probe:
    """Whether the first task's opening observation lists valid actions."""
    server = tasks.env_server
    if server.mode == "remote":
        assert server.url is not None
        where = f"the {server.adapter} env server at {server.url} (tasks.env_server.url)"
        try:
            actions = await asyncio.wait_for(_ask_server(tasks, server.url), DEADLINE_S)
        except (ThicketError, OSError, TimeoutError) as err:
            return Probe(None, where, f"{type(err).__name__}: {err}")
        return Probe(bool(actions), where)
    where = f"env {tasks.env}"
    try:
        env = make_env(tasks.env, **tasks.env_args)
    except (EnvNotInstalled, KeyError) as err:
        return Probe(None, where, str(err))
    except (TypeError, ValueError) as err:  # what the spec's checks of env_args cannot see (a level's name)
        raise BadInput(f"tasks.env_args: {tasks.env} refused them: {err}") from None
    return Probe(bool(await _first_actions(env, tasks.start)), where)


def check_policy_fits_env(spec: SweepSpec) -> str | None:
    """Raise BadInput if the spec's policy needs listed actions and its env lists none; a note
    (to print) where that could not be asked; None when all is well or nothing needs asking."""
    if spec.policy.kind != "uniform":
        return None
    probe = asyncio.run(probe_actions(spec.tasks))
    if probe.lists_actions is False:
        raise BadInput(
            f"policy.kind: uniform picks among the env's valid actions, and {probe.where} lists none "
            f"(task {spec.tasks.start}); use a model policy (policy.kind vllm or openai)"
        )
    if probe.lists_actions is None:
        return f"note: could not ask whether {probe.where} lists valid actions for policy.kind uniform: {probe.why}"
    return None
