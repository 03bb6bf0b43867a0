"""A sweep's stored spec.yaml, and the check that a rerun grows its trees under the same spec.

A sweep folder holds the trees of one spec. A rerun (a resume, more tasks, a retried pod) is
compared with the stored spec.yaml on what determines the trees (TREE_FIELDS and the vLLM flags
in MODEL_FLAGS); a difference is bad input, unless the run allows it (--allow-spec-change): then
spec.yaml keeps the first spec and the new one goes to spec-history/. docs/spec.md has the rule.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import yaml

from thicket.errors import BadInput
from thicket.shards.storage import COMMITS
from thicket.spec import SweepSpec, parse_spec
from thicket.storage.store import Store

log = logging.getLogger("thicket.sweep")

SPEC_KEY = "spec.yaml"
HISTORY = "spec-history/"

# What the trees depend on: the env, the search, the policy's identity and sampling, the seed.
TREE_FIELDS = (
    "tasks.env", "tasks.env_args", "tasks.max_observation_chars", "tasks.env_server.adapter",
    "search",
    "policy.kind", "policy.model", "policy.temperature", "policy.top_p", "policy.max_tokens",
    "policy.constrain_actions", "policy.max_thought_chars", "policy.show_valid_actions", "policy.revision",
    "seed", "cluster.model",
)
# vLLM server flags (policy.server.args, cluster.vllm_args) that change the model or its samples.
MODEL_FLAGS = frozenset({
    "--dtype", "--quantization", "--revision", "--tokenizer", "--tokenizer-revision", "--tokenizer-mode",
    "--chat-template", "--generation-config", "--override-generation-config", "--max-model-len",
    "--kv-cache-dtype", "--hf-overrides", "--seed", "--logprobs-mode",
})
SHOWN = 3  # differences shown with their values; the rest are named
ABSENT = object()


def record_spec(store: Store, spec: SweepSpec, allow_change: bool = False) -> None:
    """Write spec.yaml on a sweep's first run; on a rerun, refuse (BadInput) a spec that grows
    other trees unless `allow_change`, and carry the new `datasets` section into spec.yaml."""
    text = dump(spec.model_dump(mode="json"))
    if store.put(SPEC_KEY, text, if_absent=True):
        return
    stored = read_stored(store)
    new = yaml.safe_load(text)
    differs = differences(normalized(stored), normalized(new))
    if differs and not any(True for _ in store.list(COMMITS)):
        log.info("%s/%s replaced: no tree was committed under it", store.uri, SPEC_KEY)
        store.put(SPEC_KEY, text)
        return
    if differs and not allow_change:
        raise BadInput(f"spec differs from the sweep's stored {SPEC_KEY} at {describe(differs)}: rerun with "
                       "--allow-spec-change to add trees grown under the new spec, or use a new name")
    if differs:
        key = f"{HISTORY}{hashlib.sha256(text).hexdigest()[:16]}.yaml"
        store.put(key, text, if_absent=True)
        log.warning("%s: growing trees under a spec that differs from its spec.yaml at %s (--allow-spec-change): "
                    "spec.yaml keeps the first spec, %s records this one", store.uri, describe(differs), key)
    if stored.get("datasets") != new["datasets"]:  # aggregation reads spec.yaml: the latest run's parameters
        store.put(SPEC_KEY, dump({**stored, "datasets": new["datasets"]}))
        log.info("%s/%s: datasets section updated to this run's", store.uri, SPEC_KEY)


def dump(data: dict[str, Any]) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


def read_stored(store: Store) -> dict[str, Any]:
    where = f"{store.uri}/{SPEC_KEY}"
    fix = "repair or delete it (the sweep's record of its spec), or use a new name"
    try:
        data = yaml.safe_load(store.get(SPEC_KEY))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise BadInput(f"{where}: the sweep's stored spec is not valid YAML{at}: {fix}") from None
    if not isinstance(data, dict):
        raise BadInput(f"{where}: the sweep's stored spec is not a YAML mapping (got {type(data).__name__}): {fix}")
    return data


def normalized(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with defaults filled as this thicket fills them (as stored, where it no longer validates)."""
    try:
        return parse_spec(data, SPEC_KEY).model_dump(mode="json")
    except BadInput:
        return data


def tree_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The leaves of `data` that determine the trees, by dotted path."""
    out: dict[str, Any] = {}
    for path in TREE_FIELDS:
        out.update(leaves(path, at(data, path)))
    for path in ("policy.server.args", "cluster.vllm_args"):
        args = at(data, path)
        out.update((f"{path} {flag}", value) for flag, value in model_flags(args if isinstance(args, list) else []))
    return out


def at(data: Any, path: str) -> Any:
    for part in path.split("."):
        data = data.get(part, ABSENT) if isinstance(data, dict) else ABSENT
    return data


def leaves(path: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(f"{path}.{key}", item)
    elif value is not ABSENT:
        yield path, value


def model_flags(args: list[str]) -> Iterator[tuple[str, Any]]:
    for i, arg in enumerate(args):
        flag, _, value = str(arg).partition("=")
        if flag in MODEL_FLAGS:
            following = args[i + 1] if i + 1 < len(args) else None
            yield flag, value or (following if following is not None and not str(following).startswith("--") else True)


def differences(stored: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(path, stored value, new value) of each tree-determining leaf that differs (ABSENT: not there)."""
    before, after = tree_fields(stored), tree_fields(new)
    paths = list(after) + [p for p in before if p not in after]
    return [(p, before.get(p, ABSENT), after.get(p, ABSENT)) for p in paths
            if before.get(p, ABSENT) != after.get(p, ABSENT)]


def describe(differs: list[tuple[str, Any, Any]]) -> str:
    shown = [f"{path} (stored {show(old)}, now {show(new)})" for path, old, new in differs[:SHOWN]]
    rest = [path for path, _, _ in differs[SHOWN:]]
    return ", ".join(shown) + (f" and {len(rest)} more ({', '.join(rest)})" if rest else "")


def show(value: Any) -> str:
    text = "absent" if value is ABSENT else json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."
