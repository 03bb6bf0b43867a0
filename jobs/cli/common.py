"""What the `thicket` commands share: the spec with command-line overrides, options, output files,
and the examples under each command's help."""

from __future__ import annotations

from pathlib import Path

import click

from thicket.errors import BadInput
from thicket.spec import SweepSpec, load_spec, parse_spec


def spec_with_overrides(spec_path: str, output: str | None, policy: str | None) -> SweepSpec:
    """The spec with command-line overrides applied, validated again."""
    spec = load_spec(spec_path)
    if output is None and policy is None:
        return spec
    data = spec.model_dump()
    if output is not None:
        data["output"] = output
    if policy is not None:
        data["policy"]["kind"] = policy
    return parse_spec(data, spec_path)


def plural(count: int, noun: str, plural: str | None = None) -> str:
    """'1 pod', '2 pods'; '1 index', '2 indexes'."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def check_output_file(path: str) -> Path:
    """-o PATH as a file to write: BadInput naming it and why when its folder is not there."""
    out = Path(path)
    if out.is_dir():
        raise BadInput(f"-o {path}: is a folder; give a file's path")
    if not out.resolve().parent.is_dir():
        raise BadInput(f"-o {path}: cannot write it (its folder {out.resolve().parent} does not exist)")
    return out


def write_text(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise BadInput(f"-o {path}: cannot write it ({err.strerror or err})") from None


def examples(*lines: str) -> str:
    """An epilog of example command lines, kept as written (click's \\b paragraph)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


allow_spec_change_option = click.option(
    "--allow-spec-change", is_flag=True,
    help="Grow trees even though SPEC differs from the sweep's stored spec.yaml in what determines them "
         "(the sweep then mixes both: spec.yaml keeps the first, spec-history/ the new one).")
metrics_port_option = click.option("--metrics-port", type=click.IntRange(0, 65535), default=0, show_default=True,
                                   help="Serve Prometheus metrics at :PORT/metrics while running (0: off).")
