"""TextWorld with several trees (envs) at once: games generated from a cold cache and played
concurrently in one process (the worker's threads), in `thicket serve-env` over HTTP (with this
process generating into the same cache), and through `thicket run` (cold cache, then warm).
TextWorld's parsers are module-level and not thread-safe: before the fix, concurrent first
resets failed (IndexError: pop from empty list, TypeError: 'NoneType' object is not iterable)."""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.support.dataset_checks import check_sweep
from thicket.envs import make_env
from thicket.envs.client import ClientConfig, EnvClient
from thicket.envs.process import EnvServerProcess
from thicket.envs.protocol import Env
from thicket.envs.textworld_games import TextWorldEnv
from thicket.envs.textworld_generate import GameSettings

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")
TW_ARGS = {"world_size": 3, "nb_objects": 6, "quest_length": 3}
TASKS = [0, 1, 2, 0]  # three games, one of them asked for by two envs at once
COOKING = {"challenge": "tw-cooking", "settings": {"recipe": 1, "take": 1, "go": 1, "open": False}}
GENERATED = re.compile(r"textworld: (\S+)/task_(\d+) generated")
KEPT = re.compile(r"textworld: (\S+)/task_(\d+): another process published it first")


def cache_listing(cache: Path) -> dict[str, bool]:
    """Every entry of a cache folder, hidden ones (unfinished generations) included: whether it
    holds a game and its JSON."""
    return {str(p.relative_to(cache)): {"game.json", "game.z8"} <= {c.name for c in p.iterdir()}
            for p in sorted(cache.glob("*/*"))}


def complete_games(key: str, tasks: set[int]) -> dict[str, bool]:
    return {f"{key}/task_{t}": True for t in sorted(tasks)}


def settings_key(**args: Any) -> str:
    env = make_env("textworld", **args)
    assert isinstance(env, TextWorldEnv)
    return env.settings.key


async def episode(env: Env, task: int, plan: list[str] | None = None) -> dict[str, Any]:
    """Reset (unless `plan` is given: then the env is reset already), play the walkthrough one
    step at a time (yielding to the other episodes between steps), then restore the state
    before the last step and win again."""
    first = None
    if plan is None:
        first = await env.reset(task)
        plan = list(env.walkthrough)  # type: ignore[attr-defined]
    reset_at = time.monotonic()
    transitions, state = [], None
    for i, action in enumerate(plan):
        if i == len(plan) - 1:
            state = await env.snapshot()
        transitions.append(await env.step(action))
        await asyncio.sleep(0)
    played_at = time.monotonic()
    await env.restore(state)
    again = await env.step(plan[-1])
    view = [(t.observation.text, t.observation.valid_actions, t.reward, t.done, t.success) for t in transitions]
    return {"first": first, "plan": plan, "view": view, "again": (again.reward, again.done, again.success),
            "state": state, "reset_at": reset_at, "played_at": played_at}


def assert_won(result: dict[str, Any]) -> None:
    view = result["view"]
    assert view and not any(done for *_, done, _ in view[:-1])
    assert view[-1][2:] == (1.0, True, True)
    assert result["again"] == (1.0, True, True)


async def test_envs_generate_and_play_concurrently_in_one_process(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger="thicket.envs.textworld")
    stdout = sys.stdout
    cache = tmp_path / "cache"  # cold

    def make() -> Env:
        return make_env("textworld", cache_dir=str(cache), **TW_ARGS)

    # Four envs reset at once (in threads, as the worker's trees do); each plays its game on the
    # event loop as soon as it has it, while the others are still generating or loading theirs.
    envs = [make() for _ in TASKS]
    results = await asyncio.gather(*(episode(env, task) for env, task in zip(envs, TASKS, strict=True)))
    for result in results:
        assert_won(result)
        assert result["first"].valid_actions and result["first"].text.strip()
    assert min(r["played_at"] for r in results) < max(r["reset_at"] for r in results)  # overlapped
    assert results[0]["first"] == results[3]["first"] and results[0]["view"] == results[3]["view"]
    assert len({(r["first"].text, tuple(r["plan"])) for r in results}) == 3

    # each game generated once, though two envs asked for task 0 at the same time
    key = settings_key(**TW_ARGS)
    generated = [m.groups() for r in caplog.records if (m := GENERATED.search(r.getMessage()))]
    assert sorted(generated) == [(key, "0"), (key, "1"), (key, "2")]
    assert cache_listing(cache) == complete_games(key, {0, 1, 2})  # nothing half-made left behind
    assert sys.stdout is stdout  # generating never swaps the process's stdout

    # a fresh env restored from another's snapshot loads the game first (off the event loop)
    fresh = make()
    await fresh.restore(results[1]["state"])
    last = await fresh.step(results[1]["plan"][-1])
    assert (last.reward, last.done, last.success) == (1.0, True, True)
    for env in [*envs, fresh]:
        await env.close()


async def test_serve_env_generates_and_plays_instances_concurrently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture):
    """Four instances of one `thicket serve-env` reset at once from a cold cache (two on the same
    task), while this process generates task 0 into the same cache (two processes sharing it);
    then all four play at once and branch back."""
    caplog.set_level(logging.INFO, logger="thicket.envs.textworld")
    # the server's warm-up generates the default game (task 0) in a cold cache of its own
    monkeypatch.setenv("THICKET_TEXTWORLD_CACHE", str(tmp_path / "default"))
    server = EnvServerProcess(["textworld"], startup_timeout_s=180).start()
    try:
        await server.wait_ready()
        cache = tmp_path / "cache"  # cold
        args = {**TW_ARGS, "cache_dir": str(cache)}
        key = settings_key(**args)
        local = TextWorldEnv(GameSettings(**TW_ARGS), cache)
        async with EnvClient(ClientConfig(server.url, timeout_s=180)) as client:
            envs = [await client.env("textworld", args) for _ in TASKS]
            mine, *firsts = await asyncio.gather(local.reset(0), *(env.reset(t) for env, t in zip(envs, TASKS, strict=True)))
            assert cache_listing(cache) == complete_games(key, {0, 1, 2})  # nothing half-made left behind
            assert firsts[0] == firsts[3] == mine

            # the walkthroughs, from the games the server made (loaded here, not generated again)
            plans = {}
            for task in sorted(set(TASKS)):
                assert await local.reset(task) == firsts[TASKS.index(task)]
                plans[task] = list(local.walkthrough)
            await local.close()
            assert len({(firsts[TASKS.index(t)].text, tuple(plan)) for t, plan in plans.items()}) == 3

            # all four instances play at once, interleaved step by step, and branch back
            results = await asyncio.gather(*(episode(env, t, plans[t]) for env, t in zip(envs, TASKS, strict=True)))
            for result in results:
                assert_won(result)
            assert results[0]["view"] == results[3]["view"]
            for env in envs:
                await env.close()
        log = server.log_path.read_text() if server.log_path else ""
        assert " raised " not in log and "Traceback" not in log, log[-3000:]
        # each game generated once in the server, though two instances asked for task 0 at once;
        # task 0 was generated by both processes, and published by one of them only
        logs = log + "\n".join(r.getMessage() for r in caplog.records)
        assert sorted(m.groups() for m in GENERATED.finditer(logs) if m.group(1) == key) == [
            (key, "0"), (key, "1"), (key, "2")], logs[-3000:]
        assert [m.groups() for m in KEPT.finditer(logs)] == [(key, "0")], logs[-3000:]
        assert cache_listing(cache) == complete_games(key, {0, 1, 2})
    finally:
        server.stop()


def spec(tmp_path: Path, name: str, **run: Any) -> Path:
    data = {
        "name": name,
        "tasks": {"env": "textworld", "env_args": COOKING, "start": 0, "stop": 3, "per_index": 3},
        "search": {"algorithm": "dense", "width": 3, "max_depth": 8, "run_budget": 30, "target_pairs": 5},
        "policy": {"kind": "uniform"},
        "output": str(tmp_path / "out"),
        "run": {"trees_in_flight": 3, "progress": False},
        "seed": 0,
    }
    if run:
        data["tasks"]["env_server"] = run  # type: ignore[index]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def thicket_run(path: Path, cache: Path) -> str:
    """`thicket run` in a child process; its log."""
    done = subprocess.run([THICKET, "run", str(path), "--no-progress"], cwd=ROOT, text=True, capture_output=True,
                          env={**os.environ, "THICKET_TEXTWORLD_CACHE": str(cache)}, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tasks        3 (3 grown, 0 already committed, 0 failed, 0 timed out, 0 not run)" in done.stdout, done.stdout
    events = re.findall(r"task (\d) (started|finished)", done.stderr)
    assert [e for _, e in events[:3]] == ["started"] * 3 and len(events) == 6, events  # three trees at once
    return done.stderr


def roots(sweep: Path) -> dict[int, str]:
    """Each task's root observation, from the committed trees."""
    files = glob.glob(str(sweep / "trees" / "**" / "*.parquet"), recursive=True)
    rows = pa.concat_tables([pq.read_table(f, columns=["task", "depth", "observation"]) for f in files]).to_pylist()
    found = [(r["task"], r["observation"]) for r in rows if r["depth"] == 0]
    assert len(found) == 3 and len(rows) > 3 * 5
    return dict(found)


def test_cli_run_grows_three_cooking_trees_at_once_from_a_cold_cache_then_a_warm_one(tmp_path: Path):
    """The issue's sweep: tw-cooking, three trees at once, cold game cache, the envs in the
    sidecar `thicket serve-env` (the default); then a fresh run on the warm cache with the envs
    in the worker's own process (its first loads of the games parse their logic at once)."""
    cache = tmp_path / "cache"
    thicket_run(spec(tmp_path, "cold"), cache)
    key = settings_key(**COOKING)
    listing = cache_listing(cache)
    assert {k: v for k, v in listing.items() if k.startswith(key)} == complete_games(key, {0, 1, 2})
    assert all(listing.values()), listing  # the server's warm-up game besides; nothing half-made

    log = thicket_run(spec(tmp_path, "warm", mode="in_process"), cache)
    assert not GENERATED.search(log) and not KEPT.search(log)  # loaded, not generated again
    assert cache_listing(cache) == listing
    assert roots(tmp_path / "out" / "warm") == roots(tmp_path / "out" / "cold")
    # the running score's datasets, every row by the definitions (the family matrix of
    # tests/aggregate/test_every_family.py leaves TextWorld to this sweep)
    for run in ("cold", "warm"):
        checked = check_sweep(tmp_path / "out" / run)
        assert checked["nodes"] > 3 and sum(n for name, n in checked.items() if name != "nodes") > 0
        stats = json.loads((tmp_path / "out" / run / "datasets" / "stats.json").read_text())
        assert stats["reward_semantics"] == {"running": 3}
