"""The spec's `cluster.env`: extra environment variables per container, and the names thicket sets
itself (which a user may not override)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# Variables thicket sets itself in its containers: cluster.env may not override them.
RESERVED_ENV = frozenset({
    "HOME", "USER", "LOGNAME", "PYTHONUNBUFFERED", "HF_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
    "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "NUMBA_CACHE_DIR",
    "HF_TOKEN", "JOB_COMPLETION_INDEX", "THICKET_LOG_FORMAT", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION",
})
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_vars(value: dict[str, str]) -> dict[str, str]:
    for name in value:
        if not ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name in RESERVED_ENV or name.startswith("THICKET_"):
            raise ValueError(f"{name} is set by thicket; choose another variable")
    return value


EnvVars = Annotated[dict[str, str], AfterValidator(_env_vars)]


class ContainerEnv(BaseModel):
    """Extra environment variables per container, e.g. vllm: {VLLM_CPU_KVCACHE_SPACE: "40"}."""

    model_config = ConfigDict(extra="forbid")

    vllm: EnvVars = Field(default_factory=dict)
    worker: EnvVars = Field(default_factory=dict)
    env: EnvVars = Field(default_factory=dict, description="every env sidecar")
    aggregate: EnvVars = Field(default_factory=dict)

    def for_container(self, container: str) -> dict[str, str]:
        return getattr(self, container)
