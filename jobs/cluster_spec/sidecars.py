"""The spec's `cluster.envs`: the env sidecars of a rollout pod (`thicket serve-env FAMILY`), and
what a JVM family's sidecar (ScienceWorld) needs."""

from __future__ import annotations

from pydantic import Field, field_validator

from thicket.cluster_spec.base import ClusterModel
from thicket.cluster_spec.resources import Resources
from thicket.cluster_spec.values import image_reference

JAVA_FAMILIES = frozenset({"scienceworld", "sciworld"})
JVM_INSTANCES = 32  # a JVM family's sidecar: live instances by default (each holds its own JVM state)
JVM_INSTANCE_MIB = 200  # memory of one ScienceWorld instance (its JVM heap and threads)
JVM_BASE_MIB = 1024  # the sidecar's Python and the JVM itself
JVM_MAX_MIB = 64 * 1024


class EnvSidecar(ClusterModel):
    family: str = Field(description="env family the sidecar serves (`thicket serve-env FAMILY`)")
    port: int = Field(8100, ge=1024, le=65535)
    image: str | None = Field(None, description="default: images.env (images.env_java for ScienceWorld)")
    args: list[str] = Field(default_factory=list, description="extra `thicket serve-env` arguments")
    resources: Resources | None = Field(None, description="default: resources.env")

    @field_validator("family")
    @classmethod
    def known_family(cls, value: str) -> str:
        from thicket.envs import env_names

        if value not in env_names():
            raise ValueError(f"unknown env {value!r}; expected one of {', '.join(env_names())}")
        return value

    @field_validator("image")
    @classmethod
    def pinned(cls, value: str | None) -> str | None:
        return value if value is None else image_reference(value, "env sidecar")

    @field_validator("args")
    @classmethod
    def not_managed(cls, value: list[str]) -> list[str]:
        for arg in value:
            if arg.split("=", 1)[0] in ("--host", "--port"):
                raise ValueError(f"{arg.split('=', 1)[0]} is set by thicket (the server listens on 127.0.0.1; use port)")
        return value

    def max_instances(self) -> int:
        """`--max-instances` in args, else JVM_INSTANCES for a JVM family (rendered into its
        args), else `thicket serve-env`'s default."""
        for flag, value in zip(self.args, self.args[1:]):
            if flag == "--max-instances" and value.isdigit():
                return int(value)
        for arg in self.args:
            if arg.startswith("--max-instances=") and arg.split("=", 1)[1].isdigit():
                return int(arg.split("=", 1)[1])
        if self.family in JAVA_FAMILIES:
            return JVM_INSTANCES
        from thicket.envs.service import ServerConfig

        return ServerConfig.max_instances
