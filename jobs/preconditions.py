"""What `thicket run` would refuse on this machine, checked before anything starts, so that
`thicket validate` refuses the same: an env's data folder that is not there (or lacks the
env's files), a local model folder that is not there (with the close one that is), and an
output that cannot be written. Each is BadInput: one line naming the field, exit 2.

Nothing on S3 is checked here (`run` checks the bucket itself); nothing of a remote env
server's (its data lives there); and a policy.model that reads as a hub id (org/name) is left
as before: `validate` notes it (spec_notes.model_folder_note), `run` refuses it.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from thicket.errors import BadInput
from thicket.spec import PolicySpec, SweepSpec, TasksSpec
from thicket.spec_notes import model_folder_hint

WEBSHOP_FILES = "WebShop's items_*.json files"
ALFWORLD_FOLDER = "the folder alfworld-download fills (holding json_2.1.1/)"


def check_local_inputs(spec: SweepSpec, runs_here: bool = True) -> None:
    """BadInput for the first input `thicket run` would refuse. `runs_here`: the tasks and the
    policy run on this machine (`run`; `validate` of a sweep whose output is not on S3), so its
    data and model folders are checked too; a local output is checked in any case."""
    if runs_here:
        check_data_dir(spec.tasks)
        check_model_folder(spec.policy)
    check_output(spec)


# -- tasks.env_args.data_dir ---------------------------------------------------------------------


def _folder(value: object) -> Path | None:
    return Path(value).expanduser() if isinstance(value, str) and value else None


def check_data_dir(tasks: TasksSpec) -> None:
    """The data folder of webshop and alfworld (in process or in the sidecar: on this machine)."""
    if tasks.env_server.mode == "remote":
        return
    args = tasks.env_args
    if tasks.env == "webshop":
        _check_webshop(args)
    elif tasks.env == "alfworld":
        _check_alfworld(args)


def _is_folder(field: str, folder: Path, expected: str) -> None:
    if not folder.exists():
        raise BadInput(f"{field}: {folder} does not exist; expected {expected}")
    if not folder.is_dir():
        raise BadInput(f"{field}: {folder} is a file, not a folder; expected {expected}")


def _check_webshop(args: dict[str, object]) -> None:
    field, folder = "tasks.env_args.data_dir", _folder(args.get("data_dir"))
    if folder is None:
        field, folder = "tasks.env_args.data_dir (not given: $WEBSHOP_DATA)", _folder(os.environ.get("WEBSHOP_DATA"))
    if folder is None:
        return  # the generated catalogue
    _is_folder(field, folder, f"a folder with {WEBSHOP_FILES}")
    for pattern, preferred in (("items_shuffle*.json", "items_shuffle.json"), ("items_ins_v2*.json", "items_ins_v2.json")):
        if (folder / preferred).exists():
            continue
        found = sorted(p.name for p in folder.glob(pattern))
        if not found:
            raise BadInput(f"{field}: {folder} has no {pattern}; expected a folder with {WEBSHOP_FILES} "
                           "(items_shuffle*.json and items_ins_v2*.json)")
        if len(found) > 1:
            raise BadInput(f"{field}: {folder} holds several {pattern} ({', '.join(found)}); keep one, "
                           f"or name the one to use {preferred}")
    if args.get("goals") == "human" and not (folder / "items_human_ins.json").exists():
        raise BadInput(f"tasks.env_args.goals: human needs {folder / 'items_human_ins.json'}; "
                       "use goals: synthetic, or add the file")


def _check_alfworld(args: dict[str, object]) -> None:
    folder = _folder(args.get("data_dir"))
    if folder is None and args.get("split") is None and args.get("task_types") is None:
        return  # the generated games
    field = "tasks.env_args.data_dir"
    if folder is None:
        folder = _folder(os.environ.get("ALFWORLD_DATA"))
        if folder is None:
            raise BadInput(f"{field}: not given and ALFWORLD_DATA is not set; ALFWorld's own games "
                           f"(split, task_types) need {ALFWORLD_FOLDER}")
        field += " (not given: $ALFWORLD_DATA)"
    _is_folder(field, folder, ALFWORLD_FOLDER)
    split = str(args.get("split") or "train")
    if not ((folder / "json_2.1.1" / split).is_dir() or (folder / split).is_dir()):
        raise BadInput(f"{field}: {folder} has no json_2.1.1/{split} (nor {split}) folder; expected {ALFWORLD_FOLDER}")


# -- policy.model --------------------------------------------------------------------------------


def looks_local(model: str) -> bool:
    """A folder's path (/abs, ./x, ../x, ~/x, a/b/c, or a/b where a/ is a folder here), not a
    hub id (org/name) or a bare name, which `validate` only notes."""
    if model.startswith(("/", "./", "../", "~")) or model in (".", ".."):
        return True
    parts = model.rstrip("/").split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir())


def check_model_folder(policy: PolicySpec) -> None:
    """A local model folder to serve (policy kind vllm without url) must be one: as `run` needs it."""
    model = policy.model
    if not policy.launches_server or not model or not looks_local(model):
        return
    folder = Path(model)  # as `run` opens it (thicket.rollout.served_policy)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise BadInput(f"policy.model: {model} has no config.json, so it is not a model folder; "
                           f"{model_folder_hint(model)}, or give policy.url")
        return
    if folder.exists():
        raise BadInput(f"policy.model: {model} is a file, not a model folder; expected a folder with config.json, "
                       "or give policy.url")
    if close := close_folder(model):
        raise BadInput(f"policy.model: {model} does not exist; did you mean {close}?")
    raise BadInput(f"policy.model: {model} does not exist; {model_folder_hint(model)}, or give policy.url")


def close_folder(path: str) -> str | None:
    """The sibling folder whose name is closest to `path`'s, written as `path` is; None if none is close."""
    path = path.rstrip("/")
    parent = Path(path).parent
    try:
        names = sorted(p.name for p in parent.iterdir() if p.is_dir())
    except OSError:
        return None
    close = difflib.get_close_matches(Path(path).name, names, n=1, cutoff=0.6)
    return os.path.join(os.path.dirname(path), close[0]) if close else None


# -- output --------------------------------------------------------------------------------------


def check_output(spec: SweepSpec) -> None:
    """A local output: its sweep folder can be made and written (nothing is left behind)."""
    parsed = urlparse(spec.output)
    if parsed.scheme not in ("", "file"):
        return  # s3: `run` checks the bucket
    output = spec.output
    root = Path(parsed.netloc + parsed.path if parsed.scheme == "file" else output)  # as the store opens it
    if root.exists() and not root.is_dir():
        raise BadInput(f"output: {output} is a file; expected a folder (the sweep's folder {spec.name}/ goes in it)")
    sweep = root / spec.name
    nearest = sweep
    while not nearest.exists() and nearest != nearest.parent:
        nearest = nearest.parent
    if not nearest.is_dir():
        raise BadInput(f"output: {output}: {nearest} is a file, not a folder; expected a folder for the sweep")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".thicket-check-", dir=nearest))  # the only sure test (root, /proc)
    except OSError as err:
        raise BadInput(f"output: {output}: cannot write there ({nearest}: {err.strerror or err}); "
                       "expected a folder thicket can create and write") from None
