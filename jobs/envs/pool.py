"""The env server's instances: the live pool, its cap, its reaping of idle instances, and the
snapshots each instance keeps server-side (at most `max_snapshots`, least recently used evicted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from thicket.envs import make_env
from thicket.envs.protocol import Env, Observation
from thicket.envs.wire import ApiError, ErrorCode

log = logging.getLogger("thicket.envs.server")


@dataclass(frozen=True)
class Saved:
    """A snapshot kept server-side, with what the instance must know besides the env state."""

    state: Any
    task: int
    done: bool
    observation: Observation


@dataclass(eq=False)
class Instance:
    id: int
    family: str
    env: Env
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    task: int = 0
    done: bool = False
    observation: Observation = field(default_factory=lambda: Observation(""))
    snapshots: OrderedDict[int, Saved] = field(default_factory=OrderedDict)
    next_snapshot: int = 1
    answered: tuple[str, bytes] | None = None  # (request_id, body) of the last mutating request
    agentgym: dict[str, Any] | None = None  # AgentGym's ALFWorld record: answered in its shapes (alfworld.agentgym)

    def keep(self, saved: Saved, limit: int) -> int:
        snapshot_id = self.next_snapshot
        self.next_snapshot += 1
        self.snapshots[snapshot_id] = saved
        while len(self.snapshots) > limit:
            self.snapshots.popitem(last=False)
        return snapshot_id

    def saved(self, snapshot_id: int) -> Saved:
        saved = self.snapshots.get(snapshot_id)
        if saved is None:
            raise ApiError(ErrorCode.UNKNOWN_SNAPSHOT, f"snapshot {snapshot_id} of instance {self.id} is gone")
        self.snapshots.move_to_end(snapshot_id)
        return saved


class Pool:
    """The live instances, their cap and their reaping."""

    def __init__(self, max_instances: int, idle_timeout_s: float) -> None:
        self.max_instances = max_instances
        self.idle_timeout_s = idle_timeout_s
        self.instances: dict[int, Instance] = {}
        self.spares: dict[str, Env] = {}  # warmed-up envs (default env_args) for the first creates

    def create(self, family: str, env_args: dict[str, Any]) -> Instance:
        if len(self.instances) >= self.max_instances:
            raise ApiError(
                ErrorCode.CAPACITY,
                f"server is full: {len(self.instances)} live instances (max {self.max_instances}); "
                "close instances or retry later",
            )
        env = (None if env_args else self.spares.pop(family, None)) or build_env(family, env_args)
        instance_id = secrets.randbits(48)  # never reused, even across restarts
        while instance_id in self.instances:
            instance_id = secrets.randbits(48)
        instance = Instance(instance_id, family, env)
        self.instances[instance_id] = instance
        return instance

    def get(self, instance_id: int) -> Instance:
        instance = self.instances.get(instance_id)
        if instance is None:
            raise ApiError(ErrorCode.UNKNOWN_INSTANCE, f"no instance {instance_id} (closed, reaped, or never created)")
        instance.last_used = time.monotonic()
        return instance

    def census(self) -> tuple[Counter[str], int]:
        """Live instances by family, and the snapshots they keep."""
        instances = self.instances.values()
        return Counter(i.family for i in instances), sum(len(i.snapshots) for i in instances)

    async def close(self, instance: Instance) -> None:
        if self.instances.pop(instance.id, None) is None:
            return
        instance.snapshots.clear()
        try:
            await instance.env.close()
        except Exception:  # a failing close must not keep the instance alive
            log.exception("closing instance %d (%s) failed", instance.id, instance.family)

    async def reap(self) -> int:
        deadline = time.monotonic() - self.idle_timeout_s
        reaped = 0
        for instance in list(self.instances.values()):
            # checked right before closing: an earlier close may have let a request in
            if instance.last_used < deadline and not instance.lock.locked():
                await self.close(instance)
                reaped += 1
        return reaped

    async def close_all(self) -> None:
        for instance in list(self.instances.values()):
            async with instance.lock:  # lets an in-flight step finish first
                await self.close(instance)
        spares, self.spares = list(self.spares.values()), {}
        for env in spares:
            with contextlib.suppress(Exception):
                await env.close()


def build_env(family: str, env_args: dict[str, Any]) -> Env:
    try:
        return make_env(family, **env_args)
    except (TypeError, ValueError) as err:
        raise ApiError(ErrorCode.BAD_ENV_ARGS, f"env_args rejected by {family}: {err}") from None


@contextlib.contextmanager
def env_errors(family: str) -> Iterator[None]:
    """An exception from env code becomes a 500 `env_error` answer; the instance lives on."""
    try:
        yield
    except ApiError:
        raise
    except Exception as err:
        log.exception("%s raised", family)
        raise ApiError(ErrorCode.ENV_ERROR, f"{family} raised {type(err).__name__}: {err}"[:500]) from err
