"""The in-process envs with exact snapshots (TextCraft and the toy-text games), each with the
arguments its tests run it under."""

from __future__ import annotations

from typing import Any

from thicket.envs import SyncEnv, make_env

CASES: list[tuple[str, dict[str, Any]]] = [
    ("textcraft", {}),
    ("frozenlake", {}),
    ("frozenlake", {"is_slippery": True}),
    ("frozenlake", {"size": 8, "is_slippery": True}),
    ("cliffwalking", {}),
    ("cliffwalking", {"is_slippery": True}),
    ("taxi", {}),
    ("taxi", {"is_rainy": True, "fickle_passenger": True}),
]
IDS = [name + "".join(f"-{k}={v}" for k, v in args.items()) for name, args in CASES]
STOCHASTIC = [c for c in CASES if c[1].get("is_slippery") or c[1].get("is_rainy")]
STOCHASTIC_IDS = [IDS[CASES.index(c)] for c in STOCHASTIC]


def make(name: str, args: dict[str, Any]) -> SyncEnv:
    env = make_env(name, **args)
    assert isinstance(env, SyncEnv) and env.can_snapshot
    return env
