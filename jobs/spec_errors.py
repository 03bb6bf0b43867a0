"""A spec's validation errors as the user wrote the spec: every problem named, at the path
the user wrote (no union-member levels such as `search.mcts.max_depth`), an unknown key with
the closest known one, and no pydantic wording about tags and discriminators."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

ENV_ARGS_ERROR = "env_args"  # TasksSpec's own error type: ctx["problems"] lists (argument, message)


class _Union:
    """A union in the schema: its members' labels show up in error paths and are dropped."""

    def __init__(self, members: dict[str, type[BaseModel]] | None = None) -> None:
        self.members = members or {}


def _node(annotation: Any, discriminator: Any = None) -> type[BaseModel] | _Union | None:
    """What a field's annotation leads to: a model, a union, or nothing walkable."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _node(typing.get_args(annotation)[0], discriminator)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(args) == 1:
            return _node(args[0])
        if isinstance(discriminator, str) and models:
            tags: dict[str, type[BaseModel]] = {}
            for model in models:
                for tag in typing.get_args(model.model_fields[discriminator].annotation):
                    tags[str(tag)] = model
            return _Union(tags)
        return _Union()
    return None


def _walk(root: type[BaseModel], loc: tuple[int | str, ...]) -> tuple[list[int | str], type[BaseModel] | None, Any]:
    """The path as written (union labels dropped), the model holding its last key, and what
    the path leads to."""
    written: list[int | str] = []
    node: Any = root
    holder: type[BaseModel] | None = None
    for part in loc:
        if isinstance(node, _Union):  # a member's label (a tag, or 'constrained-int'): not written
            node = node.members.get(str(part))
            continue
        holder = node if isinstance(node, type) else None
        written.append(part)
        if isinstance(node, type) and isinstance(part, str) and part in node.model_fields:
            field = node.model_fields[part]
            node = _node(field.annotation, field.discriminator)
        else:
            node = None
    return written, holder, node


def _expected_tags(error: ErrorDetails) -> str:
    tags = str((error.get("ctx") or {}).get("expected_tags", ""))
    return ", ".join(tag.strip().strip("'") for tag in tags.split(","))


def _got(error: ErrorDetails) -> str:
    return f" (got {error['input']!r})" if "input" in error else ""


def _problems(error: ErrorDetails, root: type[BaseModel]) -> list[tuple[str, str]]:
    """(where, what) for one pydantic error: several for a spec's bad env_args."""
    path, holder, node = _walk(root, tuple(error["loc"]))
    where = ".".join(str(part) for part in path)
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == ENV_ARGS_ERROR:
        return [(f"{where}.env_args.{name}" if where else f"env_args.{name}", what) for name, what in ctx["problems"]]
    if kind == "union_tag_invalid":
        field = str(ctx.get("discriminator", "")).strip("'")
        return [(f"{where}.{field}", f"{ctx.get('tag')!r} is not one of {_expected_tags(error)}")]
    if kind == "union_tag_not_found":
        field = str(ctx.get("discriminator", "")).strip("'")
        tags = f"; expected one of {', '.join(node.members)}" if isinstance(node, _Union) and node.members else ""
        return [(f"{where}.{field}", "required field is missing" + tags)]
    if kind == "missing":
        return [(where, "required field is missing")]
    if kind == "extra_forbidden":
        name = str(path[-1]) if path else ""
        known = [n for n in holder.model_fields] if holder is not None else []
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
        if close:
            return [(where, f"unknown field; did you mean '{close[0]}'?")]
        return [(where, "unknown field" + (f"; expected one of {', '.join(known)}" if known else ""))]
    if kind in ("model_type", "model_attributes_type", "dict_type"):  # not "... or instance of TasksSpec"
        got = type(error.get("input")).__name__
        return [(where, f"Input should be a valid dictionary (a mapping of key: value), got {got}")]
    message = error["msg"].removeprefix("Value error, ")
    return [(where, message if kind == "value_error" else message + _got(error))]


def describe_problems(err: ValidationError, root: type[BaseModel]) -> list[str]:
    """One 'where: what' line per problem, unknown fields first (a typo explains a missing field)."""
    found: dict[str, list[str]] = {}
    errors = sorted(err.errors(), key=lambda e: e["type"] != "extra_forbidden")
    for error in errors:
        for where, what in _problems(error, root):
            found.setdefault(where or "spec", []).append(what)
    lines = []
    for where, whats in found.items():
        if len(whats) > 1 and all(w.startswith("Input should be ") for w in whats):
            # one value against each member of a plain union (an integer 1-4096, or 'auto')
            got = next((w[w.rfind(" (got "):] for w in whats if " (got " in w), "")
            alternatives = [w.removesuffix(got).removeprefix("Input should be ") for w in whats]
            whats = ["Input should be " + " or ".join(dict.fromkeys(alternatives)) + got]
        lines.extend(f"{where}: {what}" for what in dict.fromkeys(whats))
    return lines


def describe_error(err: ValidationError, root: type[BaseModel]) -> str:
    """Every problem, on one line joined by '; '."""
    return "; ".join(describe_problems(err, root))
