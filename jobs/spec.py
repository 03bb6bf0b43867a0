"""The sweep spec: schema, defaults, validation and task-range planning.

A bad spec raises BadInput with one line naming the field and what is expected.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

import thicket.spec_errors as spec_errors
from thicket.aggregate.params import DatasetsSpec
from thicket.cluster_spec.cluster import ClusterSpec
from thicket.cluster_spec.values import DNS_LABEL
from thicket.envs import env_names
from thicket.envs.env_args import env_args_problems
from thicket.errors import BadInput
from thicket.search import AnySearch
from thicket.storage.store import StorageSettings
from thicket.vllm_server import logprobs_mode_problem

LOCAL_SCHEMES = ("", "file")
S3_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
AWS_KEY_ID = re.compile(r"^(AKIA|ASIA)[A-Z0-9]{16}$")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EnvServerSpec(Strict):
    """Where the env instances live; docs/env-server.md has the routes."""

    mode: Literal["sidecar", "in_process", "remote"] = Field(
        "sidecar", description="sidecar: start `thicket serve-env` as a child; remote: a server at `url`; in_process"
    )
    url: str | None = Field(None, description="remote: base URL of a thicket or AgentGym env server")
    adapter: Literal["thicket", "agentgym"] = Field("thicket", description="remote: which API the server speaks")
    port: int = Field(0, ge=0, le=65535, description="sidecar: 0 picks a free port")
    max_instances: int = Field(1024, ge=1, description="sidecar: live env instances at most")
    idle_timeout_s: float = Field(600, gt=0, description="sidecar: instances unused this long are closed")
    startup_timeout_s: float = Field(60, gt=0)
    timeout_s: float = Field(60, gt=0, description="per env request")
    retry_deadline_s: float = Field(60, gt=0, description="connection errors and 503s are retried this long")

    @field_validator("url")
    @classmethod
    def http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"expected an http(s) URL like http://127.0.0.1:8080, got {value!r}")
        return value

    @model_validator(mode="after")
    def consistent(self) -> EnvServerSpec:
        if (self.mode == "remote") != (self.url is not None):
            raise ValueError("`url` goes with mode remote, and mode remote needs `url`")
        if self.adapter == "agentgym" and self.mode != "remote":
            raise ValueError("adapter agentgym needs mode remote and the AgentGym server's `url`")
        return self


class TasksSpec(Strict):
    # Before `env`: whether `env` must be registered in process depends on it.
    env_server: EnvServerSpec = Field(default_factory=EnvServerSpec, description="where the envs run")
    env: str = Field(description="environment family, e.g. textcraft, frozenlake")
    env_args: dict[str, Any] = Field(default_factory=dict, description="passed to the env's constructor")
    start: int = Field(0, ge=0, description="first task index")
    stop: int = Field(description="one past the last task index")
    per_index: int = Field(10, ge=1, description="tasks per pod (Job completion index)")
    max_observation_chars: int = Field(16_384, ge=64, description="longer observations are cut (and the cut logged)")

    @field_validator("env")
    @classmethod
    def known_env(cls, value: str, info: ValidationInfo) -> str:
        server = info.data.get("env_server")
        if server is not None and server.mode == "remote":
            return known_remote_env(value, server)
        if value not in env_names():
            raise ValueError(f"unknown env {value!r}; expected one of {', '.join(env_names())}")
        return value

    @model_validator(mode="after")
    def ordered(self) -> TasksSpec:
        if self.stop <= self.start:
            raise ValueError(f"stop ({self.stop}) must be greater than start ({self.start})")
        return self

    @model_validator(mode="after")
    def family_takes_env_args(self) -> TasksSpec:
        """Each argument checked against the family's, before any env is made (a remote server
        checks its own)."""
        if self.env_server.mode != "remote" and (problems := env_args_problems(self.env, self.env_args)):
            raise PydanticCustomError(
                spec_errors.ENV_ARGS_ERROR, "{summary}",
                {"problems": problems, "summary": "; ".join(f"env_args.{n}: {m}" for n, m in problems)},
            )
        return self

    @property
    def count(self) -> int:
        return self.stop - self.start

    def index_ranges(self) -> list[range]:
        """Task indices of each pod: pod i runs index_ranges()[i]."""
        return [range(a, min(a + self.per_index, self.stop)) for a in range(self.start, self.stop, self.per_index)]


def known_remote_env(value: str, server: EnvServerSpec) -> str:
    """A remote thicket server may serve envs this install lacks; AgentGym needs an adapter."""
    from thicket.envs.dialects import AGENTGYM_DIALECTS

    if server.adapter == "agentgym" and value not in AGENTGYM_DIALECTS:
        raise ValueError(f"no AgentGym adapter for env {value!r}; expected one of {', '.join(AGENTGYM_DIALECTS)}")
    return value


class LaunchSpec(Strict):
    """How `thicket run` starts a local vLLM server when the policy names a model folder."""

    args: list[str] = Field(default_factory=list, description="extra vLLM server arguments")
    port: int = Field(0, ge=0, le=65535, description="0: pick a free port")
    startup_timeout_s: float = Field(600, gt=0)
    python: str | None = Field(None, description="interpreter with vLLM (default: THICKET_VLLM_PYTHON or .venv-vllm)")

    @field_validator("args")
    @classmethod
    def logprobs_mode_kept(cls, value: list[str]) -> list[str]:
        if problem := logprobs_mode_problem(value):
            raise ValueError(problem)
        return value


class PolicySpec(Strict):
    kind: Literal["vllm", "openai", "uniform"] = "vllm"
    model: str | None = Field(None, description="served model name, or a local model folder to serve")
    url: str | None = Field(None, description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1")
    revision: str | None = Field(
        None, description="the hub model's revision, a commit sha best (a tag or branch moves): the cluster's "
        "prefetch downloads it and vLLM loads it (--revision), so two sweeps of one spec use the same weights"
    )
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(256, ge=1)
    constrain_actions: bool = Field(True, description="force actions into the env's valid actions")
    max_thought_chars: int = Field(
        0, ge=0, description="constrained thoughts: one line of at most this many characters; 0: any length "
        "(bounds make the grammar costly for vLLM: keep them small, for tiny models that never end a line)"
    )
    show_valid_actions: bool = Field(False, description="list valid actions in each observation")
    render_once: bool = Field(
        True, description="a server that renders chat prompts (vLLM's /tokenize) renders each expansion's prompt "
        "once and its samples go to /completions on the prompt's token ids (the same samples, less server work "
        "per sample); false, or any other server: each sample a /chat/completions request"
    )
    concurrency: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = Field(
        "auto", description="LLM requests in flight per pod; auto: tuned from vLLM's load gauges (else 64)"
    )
    timeout_s: float = Field(120, gt=0, description="per LLM request")
    max_retries: int = Field(5, ge=0, le=50, description="5xx answers are retried this many times")
    retry_deadline_s: float = Field(300, gt=0, description="an unreachable server is retried this long, then the task fails")
    startup_connect_s: float = Field(
        60, gt=0, description="at start-up, nothing listening at `url` this long is a wrong URL (exit 2)"
    )
    latency_s: float = Field(0.0, ge=0.0, description="uniform only: simulated latency per request")
    server: LaunchSpec = Field(default_factory=LaunchSpec)

    @field_validator("revision")
    @classmethod
    def revision_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[\w][\w.\-/]{0,199}", value):
            raise ValueError(f"expected a commit sha, tag or branch name, got {value!r}")
        return value

    @field_validator("url")
    @classmethod
    def http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"expected an http(s) URL like http://127.0.0.1:8000/v1, got {value!r}")
        return value

    @model_validator(mode="after")
    def endpoint(self) -> PolicySpec:
        if self.kind == "vllm" and not (self.model or self.url):
            raise ValueError("kind vllm needs `model` (a local folder to serve, or the served name with `url`)")
        if self.kind == "openai" and not (self.url and self.model):
            raise ValueError("kind openai needs both `url` and `model`")
        return self

    @property
    def launches_server(self) -> bool:
        return self.kind == "vllm" and self.url is None


class CheckpointSpec(Strict):
    """Growing trees saved to the sweep's storage, so that a killed or preempted worker's rerun
    resumes them instead of growing them again (thicket.rollout.checkpoint)."""

    enabled: bool = True
    every_calls: int = Field(8, ge=1, description="save a growing tree's new replies after this many LLM calls")
    every_s: float = Field(30, gt=0, description="... or once this many seconds passed since its last save")
    grace_s: int = Field(
        60, ge=1, description="seconds Kubernetes waits after SIGTERM before killing the worker "
        "(terminationGracePeriodSeconds): the worker saves every growing tree in that time"
    )


class RunSpec(Strict):
    trees_in_flight: int | None = Field(None, ge=1, description="trees grown at once per pod (default: 2 x the requests in flight)")
    task_timeout_s: float = Field(3600, gt=0, description="a tree still growing then is stored as timed out")
    trees_per_shard: int = Field(
        32, ge=1, description="finished trees written to one data file at most (1: a file per tree); a file "
        "of many trees decodes several times faster in aggregation and takes far fewer bytes"
    )
    shard_wait_s: float = Field(
        60, gt=0, description="a finished tree waits at most this long for others to share its data file "
        "(trees still waiting when the pod dies are grown again by a rerun)"
    )
    index_timeout_s: float | None = Field(
        None, gt=0, description="the pod's whole share: trees growing then are stored as timed out, tasks not "
        "started are left for a rerun (exit 4)"
    )
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    progress: bool = True
    allow_spec_change: bool = Field(
        False, description="grow trees into a sweep whose spec.yaml differs (as --allow-spec-change): for pods, "
        "which get no flags of their own"
    )


class StorageSpec(Strict):
    """How to reach an s3:// output; unset fields come from the standard AWS environment variables."""

    endpoint_url: str | None = Field(None, description="e.g. http://minio:9000 (default: AWS_ENDPOINT_URL[_S3] or AWS)")
    region: str | None = Field(None, description="default: AWS_REGION or AWS_DEFAULT_REGION")
    addressing_style: Literal["auto", "path", "virtual"] = Field("auto", description="auto: path style off AWS")
    access_key_id_env: str | None = Field(None, description="NAME of the env var holding the access key id")
    secret_access_key_env: str | None = Field(None, description="NAME of the env var holding the secret key")
    session_token_env: str | None = Field(None, description="NAME of the env var holding a session token")
    retry_deadline_s: float = Field(300, gt=0, description="give up on a storage request after retrying this long")
    startup_connect_s: float = Field(
        60, gt=0, description="at start-up, nothing listening at the endpoint this long is a wrong endpoint (exit 2)"
    )

    @field_validator("endpoint_url")
    @classmethod
    def http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+/?$", value):
            raise ValueError(f"expected an http(s) URL like http://127.0.0.1:9000, got {value!r}")
        return value

    @field_validator("access_key_id_env", "secret_access_key_env", "session_token_env")
    @classmethod
    def env_name(cls, value: str | None) -> str | None:
        if value is not None and (not ENV_NAME.match(value) or AWS_KEY_ID.match(value)):
            raise ValueError("expected the NAME of an environment variable holding the secret, never the secret itself")
        return value

    @model_validator(mode="after")
    def key_pair(self) -> StorageSpec:
        if (self.access_key_id_env is None) != (self.secret_access_key_env is None):
            raise ValueError("set both access_key_id_env and secret_access_key_env, or neither")
        return self

    def settings(self) -> StorageSettings:
        return StorageSettings(**self.model_dump())


def check_bucket(value: str) -> None:
    bucket = value.removeprefix("s3://").split("/", 1)[0]
    if not S3_BUCKET.match(bucket) or ".." in bucket or re.fullmatch(r"[\d.]+", bucket):
        raise ValueError(
            f"{bucket!r} is not a valid S3 bucket name: use 3-63 lowercase letters, digits, '.' and '-', "
            "starting and ending with a letter or digit"
        )


class SweepSpec(Strict):
    name: str = Field(description="DNS-1123 label: the Job name and the storage prefix")
    tasks: TasksSpec
    search: AnySearch
    policy: PolicySpec = Field(default_factory=PolicySpec)
    output: str = Field(description="where the sweep's folder goes: a local path, file:// or s3://bucket[/prefix]")
    storage: StorageSpec = Field(default_factory=StorageSpec)
    seed: int = Field(0, ge=0)
    run: RunSpec = Field(default_factory=RunSpec)
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="Kubernetes: see thicket.cluster_spec")
    datasets: DatasetsSpec = Field(default_factory=DatasetsSpec, description="what `thicket aggregate` builds")

    @field_validator("name")
    @classmethod
    def dns_label(cls, value: str) -> str:
        if len(value) > 63 or not DNS_LABEL.match(value):
            raise ValueError(
                f"{value!r} is not a DNS-1123 label: use at most 63 lowercase letters, digits and '-', "
                "starting and ending with a letter or digit"
            )
        return value

    @field_validator("output")
    @classmethod
    def supported_uri(cls, value: str) -> str:
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme == "s3":
            check_bucket(value)
        elif scheme not in LOCAL_SCHEMES:
            raise ValueError(
                f"unsupported URI scheme {scheme!r} in {value!r}; "
                "expected a local path, file:// or s3://bucket[/prefix]"
            )
        if not value.strip():
            raise ValueError("expected a non-empty path or URI")
        return value

    @property
    def sweep_uri(self) -> str:
        return self.output.rstrip("/") + "/" + self.name


def describe_error(err: ValidationError) -> str:
    """Every problem of a spec, named where the user wrote it, on one line."""
    return spec_errors.describe_error(err, SweepSpec)


def parse_spec(data: Any, source: str = "spec") -> SweepSpec:
    if data is None:
        raise BadInput(f"{source}: the spec is empty; expected a YAML mapping with name, tasks, search and output")
    if not isinstance(data, dict):
        raise BadInput(f"{source}: expected a YAML mapping at the top level, got {type(data).__name__}")
    try:
        # strict: no silent coercions (true is not 1, "10" is not 10)
        return SweepSpec.model_validate(data, strict=True)
    except ValidationError as err:
        raise BadInput(f"{source}: {describe_error(err)}") from None


def load_spec(path: str | Path) -> SweepSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise BadInput(f"{path}: cannot read the spec ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise BadInput(f"{path}: not a YAML text file (byte {err.start} is not UTF-8)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{path}: not valid YAML{where}: {getattr(err, 'problem', err)}") from None
    return parse_spec(data, str(path))


def parse_indices(text: str, tasks: TasksSpec) -> list[int]:
    """'3-7,9' -> [3..7, 9] (inclusive ranges), each inside the spec's task range."""
    if not text.strip():
        raise BadInput("--indices: empty; expected task indices like 0-9 or 3,5,7-8 (leave --indices out for all tasks)")
    chosen: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+))?\s*", part)
        if not match:
            raise BadInput(f"--indices: expected task indices like 0-9 or 3,5,7-8, got {text!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise BadInput(f"--indices: range {low}-{high} is reversed; write {high}-{low}")
        if low < tasks.start or high >= tasks.stop:
            raise BadInput(
                f"--indices: {low}-{high} is outside the spec's tasks {tasks.start}-{tasks.stop - 1}"
            )
        chosen.update(range(low, high + 1))
    return sorted(chosen)
