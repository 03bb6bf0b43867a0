"""ALFWorld's own games (a data folder in ALFWorld's layout, written here from generated
games): ALFWorld's selection rules and order, play through the env, bad data as BadInput,
and exit 2 through the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from thicket.envs import make_env
from thicket.envs.alfworld import cache
from thicket.envs.alfworld.env import AlfWorldEnv
from thicket.envs.alfworld.wording import Wording
from thicket.errors import BadInput

THICKET = str(Path(sys.executable).parent / "thicket")
GAMES = range(6)  # one of each task type


def _trial(split: Path, name: str, source: Path, **game_changes: Any) -> Path:
    trial = split / name / "trial_T20190907_000000_000000"
    trial.mkdir(parents=True)
    shutil.copy(source / cache.TRAJ_FILE, trial / cache.TRAJ_FILE)
    data = json.loads((source / cache.GAME_FILE).read_text()) | game_changes
    (trial / cache.GAME_FILE).write_text(json.dumps({k: v for k, v in data.items() if v is not None}))
    return trial


@pytest.fixture(scope="module")
def data_dir(alf_cache: Path, played: dict[int, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("alfworld-data")
    train = root / "json_2.1.1" / "train"
    sources = {task: cache.game_dir(task, Wording.V211, alf_cache) for task in GAMES}
    for task, source in sources.items():
        traj = json.loads((source / cache.TRAJ_FILE).read_text())
        p = traj["pddl_params"]
        # ALFWorld's folder names: type-object-mrecep-receptacle-scene; reversed task order
        _trial(train, f"{traj['task_type']}-{p['object_target']}-None-{p['parent_target'] or p['toggle_target']}-"
               f"{90 - task}", source)
    _trial(train, "pick_and_place_with_movable_recep-Pen-Mug-Desk-301", sources[0])  # "movable": skipped
    _trial(train, "pick_and_place_simple-AppleSliced-None-Fridge-1", sources[0])  # "Sliced": skipped
    _trial(train, "pick_and_place_simple-X-None-Y-2", sources[0], solvable=False)  # unsolvable: skipped
    _trial(train, "pick_and_place_simple-X-None-Y-3", sources[0], solvable=None)  # no solvable key: skipped
    (_trial(train, "pick_and_place_simple-X-None-Y-4", sources[0]) / cache.GAME_FILE).unlink()  # no game: skipped
    _trial(root / "json_2.1.1" / "valid_seen", "look_at_obj_in_light-X-None-DeskLamp-301", sources[1])
    return root


def _env(**args: Any) -> AlfWorldEnv:
    env = make_env("alfworld", **args)
    assert isinstance(env, AlfWorldEnv)
    return env


def _expected_order(data_dir: Path) -> list[str]:
    """The playable trial folders, in ALFWorld's walk order with names sorted."""
    train = data_dir / "json_2.1.1" / "train"
    keep = []
    for folder in sorted(p.name for p in train.iterdir()):
        trial = next((train / folder).iterdir())
        if "movable" in folder or "Sliced" in folder or not (trial / cache.GAME_FILE).exists():
            continue
        if json.loads((trial / cache.GAME_FILE).read_text()).get("solvable"):
            keep.append(folder)
    return keep


def test_tasks_follow_alfworlds_selection_and_order_and_their_walkthroughs_win(data_dir: Path) -> None:
    env = _env(data_dir=str(data_dir), split="train")
    order = _expected_order(data_dir)
    assert len(order) == len(GAMES)
    for task, folder in enumerate(order):
        obs = env.reset_sync(task)
        assert env.traj_data["task_type"] == folder.split("-")[0]
        assert obs.text.rsplit("\n\n", 1)[1] == f"Your task is to: {env.traj_data['turk_annotations']['anns'][0]['task_desc']}."
        *_, last = [env.step_sync(a) for a in env.walkthrough]
        assert (last.reward, last.done, last.success) == (1.0, True, True)


def test_the_filesystem_order_holds_the_same_games(data_dir: Path) -> None:
    sorted_env = _env(data_dir=str(data_dir), split="train")
    walk_env = _env(data_dir=str(data_dir), split="train", order="filesystem")
    assert sorted(map(str, walk_env.source.game_list())) == sorted(map(str, sorted_env.source.game_list()))


def test_task_types_filter_and_other_splits(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only = _env(data_dir=str(data_dir / "json_2.1.1"), split="train", task_types=[1])
    assert [p.parent.name.split("-")[0] for p in only.source.game_list()] == ["pick_and_place_simple"]
    monkeypatch.setenv("ALFWORLD_DATA", str(data_dir))
    seen = _env(split="valid_seen")
    assert len(seen.source.game_list()) == 1


def test_an_index_past_the_set_is_bad_input(data_dir: Path) -> None:
    env = _env(data_dir=str(data_dir), split="train")
    with pytest.raises(BadInput, match=r"task 6: .* holds 6 playable games \(tasks 0-5\)"):
        env.reset_sync(6)


def test_a_malformed_game_file_is_bad_input(data_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "json_2.1.1" / "train" / "pick_and_place_simple-X-None-Y-1" / "trial_T1"
    bad.mkdir(parents=True)
    (bad / cache.TRAJ_FILE).write_text('{"task_type": "pick_and_place_simple"}')
    (bad / cache.GAME_FILE).write_text("{not json")
    with pytest.raises(BadInput, match="not a readable JSON file") as err:
        _env(data_dir=str(tmp_path), split="train").reset_sync(0)
    assert "\n" not in str(err.value)


def test_a_game_the_engine_cannot_load_fails_its_tree_not_the_sweep(data_dir: Path, tmp_path: Path) -> None:
    from thicket.envs.protocol import ActionFailed

    train = tmp_path / "json_2.1.1" / "train"
    source = next((data_dir / "json_2.1.1" / "train").glob("pick_and_place_simple-*-9*/trial_*"))
    _trial(train, "pick_and_place_simple-X-None-Y-1", source, pddl_problem="(define (problem broken)")
    with pytest.raises(ActionFailed, match="does not load"):
        _env(data_dir=str(tmp_path), split="train").reset_sync(0)


def test_a_missing_data_folder_exits_2_through_the_cli(tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: alf\ntasks: {env: alfworld, env_args: {data_dir: /nonexistent/alfworld, split: train}, "
                    "start: 0, stop: 1, env_server: {mode: in_process}}\nsearch: {algorithm: sample, samples: 1, "
                    f"max_depth: 2}}\npolicy: {{kind: uniform}}\noutput: {tmp_path / 'out'}\nseed: 0\n")
    done = subprocess.run([THICKET, "run", str(spec), "--no-progress"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "env_args.data_dir" in done.stderr
