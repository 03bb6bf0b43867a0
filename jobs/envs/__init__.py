"""Environment registry: family name -> factory taking the spec's `env_args`.

The built-in families are known by name without importing them: a family's module (and its game
package, which may not be installed: the worker image carries none of them) is imported when an
env of it is first made.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from thicket.envs.protocol import Env, Observation, SyncEnv, Transition

EnvFactory = Callable[..., Env]
_REGISTRY: dict[str, EnvFactory] = {}
# family -> (module under thicket.envs that registers it, the extra that installs its packages)
BUILTINS: dict[str, tuple[str, str]] = {
    "alfworld": ("alfworld.env", "alfworld"),
    "babyai": ("babyai", "envs"),
    "cliffwalking": ("toytext", "envs"),
    "frozenlake": ("toytext", "envs"),
    "math": ("math.env", "envs"),
    "sciworld": ("sciworld", "sciworld"),
    "taxi": ("toytext", "envs"),
    "textarena": ("textarena_games", "envs"),
    "textcraft": ("textcraft", "envs"),
    "textworld": ("textworld_games", "envs"),
    "webshop": ("webshop.env", "envs"),
}


class EnvNotInstalled(ImportError):
    """A built-in family whose game package is not installed here."""


def register(name: str) -> Callable[[EnvFactory], EnvFactory]:
    def add(factory: EnvFactory) -> EnvFactory:
        _REGISTRY[name] = factory
        return factory

    return add


def env_names() -> list[str]:
    return sorted({*BUILTINS, *_REGISTRY})


def make_env(name: str, **env_args: Any) -> Env:
    require(name)
    if name not in _REGISTRY:
        raise KeyError(name)
    return _REGISTRY[name](**env_args)


def require(name: str) -> None:
    """Import a built-in family's module, or raise EnvNotInstalled naming the extra to install."""
    if name in _REGISTRY or name not in BUILTINS:
        return
    module, extra = BUILTINS[name]
    try:
        importlib.import_module(f"thicket.envs.{module}")  # registers on import
    except ModuleNotFoundError as err:
        if (err.name or "").startswith("thicket"):
            raise
        raise EnvNotInstalled(
            f"env {name!r} needs the package {err.name!r}, not installed here: pip install 'thicket[{extra}]' "
            "(or use the env image as its sidecar)"
        ) from err


__all__ = ["BUILTINS", "Env", "EnvNotInstalled", "require", "Observation", "SyncEnv", "Transition", "env_names", "make_env", "register"]
