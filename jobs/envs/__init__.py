"""Environment registry: family name -> factory taking the spec's `env_args`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from thicket.envs.protocol import Env, Observation, SyncEnv, Transition

EnvFactory = Callable[..., Env]
_REGISTRY: dict[str, EnvFactory] = {}


def register(name: str) -> Callable[[EnvFactory], EnvFactory]:
    def add(factory: EnvFactory) -> EnvFactory:
        _REGISTRY[name] = factory
        return factory

    return add


def env_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def make_env(name: str, **env_args: Any) -> Env:
    _load_builtins()
    if name not in _REGISTRY:
        raise KeyError(name)
    return _REGISTRY[name](**env_args)


def _load_builtins() -> None:
    from thicket.envs import textcraft, toytext  # noqa: F401  (registers on import)
    # These import their (heavy) game packages only when an env is made.
    from thicket.envs import babyai, math_code, sciworld, textarena_games, textworld_games  # noqa: F401


__all__ = ["Env", "Observation", "SyncEnv", "Transition", "env_names", "make_env", "register"]
