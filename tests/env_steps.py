"""Recording env steps, for snapshot/replay equivalence tests."""

from __future__ import annotations

from thicket.envs import SyncEnv, Transition

Step = tuple[str, tuple[str, ...] | None, float, bool, bool]


def as_step(t: Transition) -> Step:
    return (t.observation.text, t.observation.valid_actions, t.reward, t.done, t.success)


def rollout(env: SyncEnv, actions: list[str]) -> list[Step]:
    return [as_step(env.step_sync(action)) for action in actions]
