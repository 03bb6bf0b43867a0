"""The webshop family's pages, turns, tasks, snapshots, catalogue and bad input: one test (or
more) per row of the rules table in docs/envs/webshop.md (rows named R1..R19 below). Expected
texts and rewards come from WebShop's templates and get_reward, not from the env's code."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from thicket.envs import make_env
from thicket.envs.webshop.catalog import DataFiles, load, name_nouns
from thicket.envs.webshop.env import WebShopEnv
from thicket.envs.webshop.generate import CATEGORIES, generate, synthetic_files
from thicket.envs.webshop.gold import gold_path
from thicket.envs.webshop.reward import fuzzy_match, reward
from thicket.errors import BadInput
from thicket.training.experts import webshop_plan

SEP = " [SEP] "


def shop(**env_args) -> WebShopEnv:
    env = make_env("webshop", **env_args)
    assert isinstance(env, WebShopEnv)
    return env


@pytest.fixture
def env() -> WebShopEnv:
    e = shop()
    e.reset_sync(0)
    return e


def to_results(env: WebShopEnv, query: str | None = None):
    return env.step_sync(f"search[{query or env.shop.goal.query}]")


def to_item(env: WebShopEnv):
    goal = env.shop.goal
    to_results(env)
    for _ in range(env.state.hits.index(goal.asin) // 10):
        env.step_sync("click[next >]")
    return env.step_sync(f"click[{goal.asin}]")  # upper case: clicks are case-insensitive


# --- pages and turns ------------------------------------------------------------------


def test_r1_reset_shows_the_search_page(env):
    instruction = env.shop.goal.instruction
    first = env.reset_sync(0)
    assert first.text == f"WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search"


def test_r2_search_page_lists_search_actions_unless_told_not_to():
    assert shop(search_actions=0).reset_sync(0).valid_actions is None  # free text only
    env = shop()  # 3 by default
    listed = env.reset_sync(0).valid_actions
    assert listed is not None and len(listed) == 3 and all(a.startswith("search[") for a in listed)
    words = env.shop.goal.instruction.split(", and price")[0]
    assert all(set(a[7:-1].split()) <= set(words.replace(",", "").split()) for a in listed)
    t = env.step_sync(listed[0])
    assert t.observation.text.split(SEP)[3].startswith("Page 1 (Total results: ")


def test_r2_r11_clicks_on_the_search_page_do_nothing(env):
    before = env.observation()
    for action in ("click[search]", "click[buy now]", "search[]", "buy", "click[back to search"):
        t = env.step_sync(action)
        assert (t.observation, t.reward, t.done) == (before, 0.0, False)


def test_r4_results_page_shows_ten_results_with_pager(env):
    t = to_results(env)
    hits = env.state.hits
    assert 10 < len(hits) <= 50
    parts = t.observation.text.split(SEP)
    assert parts[:5] == ["Instruction:", env.shop.goal.instruction, "Back to Search",
                         f"Page 1 (Total results: {len(hits)})", "Next >"]
    products = {p.asin: p for p in env.catalog.products}
    expected = [x for asin in hits[:10] for x in (asin, products[asin].title, products[asin].price_tag)]
    assert parts[5:] == expected
    assert t.observation.valid_actions == ("click[back to search]", "click[next >]",
                                           *(f"click[{a.lower()}]" for a in hits[:10]))
    t = env.step_sync("click[Next >]")
    assert t.observation.text.split(SEP)[3:6] == [f"Page 2 (Total results: {len(hits)})", "< Prev", "Next >"]
    last = (len(hits) - 1) // 10 + 1
    for _ in range(last - 2):
        t = env.step_sync("click[next >]")
    assert "click[next >]" not in t.observation.valid_actions  # the last page
    assert env.step_sync("click[< prev]").observation.text.split(SEP)[3].startswith(f"Page {last - 1} ")


def test_r3_search_works_from_every_page_as_in_webshop(env):
    """web_agent_text_env.step (princeton-nlp/WebShop): `search` with a non-empty argument
    searches whatever the page; the new results page has no options chosen."""
    fresh = to_results(env).observation
    to_item(env)
    env.step_sync(f"click[{env.catalog.by_asin[env.shop.goal.asin].options[0][1][0]}]")
    for page in ("features", None):
        if page:
            env.step_sync(f"click[{page}]")
        t = env.step_sync(f"search[{env.shop.goal.query}]")
        assert t.observation == fresh and env.state.options == () and env.state.asin is None
        to_item(env)


def test_r5_r6_a_result_opens_its_item_page(env):
    t = to_item(env)
    product = env.catalog.by_asin[env.shop.goal.asin]
    options = [x for group, values in product.options for x in (group, *values)]
    assert t.observation.text.split(SEP) == [
        "Instruction:", env.shop.goal.instruction, "Back to Search", "< Prev", *options, product.title,
        f"Price: {product.price_tag}", "Rating: N.A.", "Description", "Features", "Reviews", "Buy Now"]
    values = [f"click[{v}]" for _, vs in product.options for v in vs]
    # WebShop's clickables: the buttons (class btn) in page order, then the option radios
    assert t.observation.valid_actions == ("click[back to search]", "click[< prev]", "click[description]",
                                           "click[features]", "click[reviews]", "click[buy now]", *values)
    assert t.reward == 0.0 and not t.done


def test_r7_an_option_click_chooses_it_for_its_group(env):
    to_item(env)
    product = env.catalog.by_asin[env.shop.goal.asin]
    group, values = product.options[0]
    env.step_sync(f"click[{values[0]}]")
    env.step_sync(f"click[{values[1].upper()}]")
    assert dict(env.state.options) == {group: values[1]}


def test_r8_sub_pages_and_back(env):
    to_item(env)
    product = env.catalog.by_asin[env.shop.goal.asin]
    value = product.options[0][1][0]
    item = env.step_sync(f"click[{value}]").observation
    head = ["Instruction:", env.shop.goal.instruction, "Back to Search", "< Prev"]
    for page, body in (("description", [product.description]), ("features", list(product.bullets)),
                       ("reviews", [])):
        sub = env.step_sync(f"click[{page}]").observation
        assert sub.text.split(SEP) == head + body
        assert sub.valid_actions == ("click[back to search]", "click[< prev]")
        assert env.step_sync("click[buy now]").observation == sub  # not on this page
        assert env.step_sync("click[< prev]").observation == item
    assert env.state.options  # kept


def test_r9_item_prev_goes_back_to_the_same_results_page_and_clears_options(env):
    to_results(env)
    env.step_sync("click[next >]")
    results = env.observation()
    env.step_sync(f"click[{env.state.hits[10]}]")
    env.step_sync(f"click[{env.catalog.by_asin[env.state.hits[10]].options[0][1][0]}]")
    assert env.step_sync("click[< prev]").observation == results
    assert env.state.options == ()


def test_r10_back_to_search_from_every_page(env):
    start = env.observation()
    to_item(env)
    env.step_sync("click[features]")
    assert env.step_sync("click[back to search]").observation == start
    to_results(env)
    assert env.step_sync("click[Back to Search]").observation == start


def test_r11_values_of_other_pages_and_garbage_do_nothing(env):
    to_item(env)
    before = env.observation()
    for action in ("click[next >]", "click[purple unicorn]", "search[]", "click buy now", "Click[buy now]", ""):
        t = env.step_sync(action)
        assert (t.observation, t.reward, t.done) == (before, 0.0, False)


def test_r12_buy_now_ends_with_webshops_reward(env):
    goal = env.shop.goal
    to_item(env)
    product = env.catalog.by_asin[goal.asin]
    chosen = goal.options[:1]
    for value in chosen:
        env.step_sync(f"click[{value}]")
    t = env.step_sync("click[buy now]")
    expected = reward(product, chosen, goal).reward
    assert 0 < expected < 1  # one goal option not chosen
    assert (t.reward, t.done, t.success) == (expected, True, False)
    assert t.observation.text == f"Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] {expected}"
    assert t.observation.valid_actions == ()


def test_r12_rewards_are_zero_before_buying():
    env = shop()
    rng = random.Random(0)
    for task in range(5):
        obs = env.reset_sync(task)
        for _ in range(30):
            t = env.step_sync(rng.choice(obs.valid_actions))
            obs = t.observation
            if t.done:
                break
            assert t.reward == 0.0


def test_r13_after_done_nothing_changes(env):
    to_item(env)
    done = env.step_sync("click[buy now]")
    for action in ("click[back to search]", "search[x]", "click[buy now]"):
        t = env.step_sync(action)
        assert (t.observation, t.reward, t.done, t.success) == (done.observation, 0.0, True, False)


# --- tasks and snapshots ----------------------------------------------------------------


def test_r18_tasks_are_deterministic_and_bounded():
    a, b = shop(), shop()
    n = len(a.catalog.goals)
    assert [a.reset_sync(i) for i in (0, 7, n - 1)] == [b.reset_sync(i) for i in (0, 7, n - 1)]
    with pytest.raises(BadInput, match=rf"task {n} is out of range; .* has tasks 0\.\.{n - 1}"):
        a.reset_sync(n)
    with pytest.raises(BadInput, match="task -1 is out of range"):
        a.reset_sync(-1)


def test_r19_restore_then_step_equals_stepping_the_original():
    env, other = shop(), shop()
    rng = random.Random(1)
    checked = 0
    for task in range(12):
        obs = env.reset_sync(task)
        for _ in range(25):
            if not obs.valid_actions:
                break
            snap = env.snapshot_sync()
            action = rng.choice(obs.valid_actions)
            other.reset_sync((task + 1) % 12)  # a different episode first
            other.restore_sync(snap)
            assert other.observation() == obs
            t_other = other.step_sync(action)
            t = env.step_sync(action)
            assert t == t_other and other.snapshot_sync() == env.snapshot_sync()
            checked += 1
            env.restore_sync(snap)  # and the original itself can go back
            assert env.step_sync(action) == t
            obs = t.observation
    assert checked > 100


# --- the generated catalogue ------------------------------------------------------------


def test_the_generator_is_reproducible_by_seed(tmp_path):
    assert generate(300, 5) == generate(300, 5)
    assert generate(300, 5)[0] != generate(300, 6)[0]
    one, two = synthetic_files(300, 5, tmp_path / "a"), synthetic_files(300, 5, tmp_path / "b")
    for field in ("products", "attributes", "human_goals"):
        assert getattr(one, field).read_bytes() == getattr(two, field).read_bytes()
    assert load(one).goals == load(two).goals


def test_generated_attributes_never_fuzzy_match_each_other():
    for category in CATEGORIES:
        for a in category.attributes:
            for b in category.attributes:
                assert a == b or (not fuzzy_match(a, b) and a not in b), (a, b)


def test_partial_rewards_occur_in_the_generated_catalogue():
    """For nearly every goal some product of the same query earns 0 < r < 1 with the goal's options."""
    env = shop()
    catalog = env.catalog
    partial = 0
    goals = catalog.goals[:500]
    for goal in goals:
        rewards = {reward(p, goal.options, goal).reward for p in catalog.products if p.query == goal.query}
        partial += any(0 < r < 1 for r in rewards)
        assert max(rewards) == 1.0
    assert partial / len(goals) > 0.95


def test_the_expert_wins_every_generated_task_with_free_text_search():
    env = shop()
    wins = 0
    tasks = range(0, len(env.catalog.goals), 3)
    for task in tasks:
        goal = env.catalog.goal(task)
        plan = gold_path(goal, env.catalog.by_asin[goal.asin], env.index, listed=None)
        assert plan is not None
        env.reset_sync(task)
        for step in plan:
            t = env.step_sync(step.action)
        wins += t.success and t.reward == 1.0
    assert wins == len(tasks)


def test_with_listed_searches_the_expert_plays_only_listed_actions_and_wins_what_it_plans():
    """A policy held to the listed actions (constrain_actions) can play every expert plan: its
    search is one the page lists, every later action one the page offers."""
    env = shop()
    tasks = range(0, len(env.catalog.goals), 3)
    planned = 0
    for task in tasks:
        plan = webshop_plan(task)
        if plan is None:  # no listed search finds the product: nothing a listed-action policy could copy
            continue
        planned += 1
        observation = env.reset_sync(task)
        for step in plan.steps:
            assert step.action in observation.valid_actions, (task, step.action, observation.valid_actions)
            t = env.step_sync(step.action)
            observation = t.observation
        assert t.success and t.reward == 1.0, task
    assert planned / len(tasks) > 0.95


def test_human_and_synthetic_goals_from_the_same_files(tmp_path):
    files = synthetic_files(200, 2, tmp_path)
    human, synthetic = load(files), load(replace(files, human_goals=None))
    assert {g.asin for g in human.goals} == {g.asin for g in synthetic.goals}
    # synthetic goals: one per option combination of each goal product
    product = human.by_asin[human.goals[0].asin]
    combos = 1
    for _, values in product.options:
        combos *= len(values)
    assert sum(g.asin == product.asin for g in synthetic.goals) == combos


# --- bad input --------------------------------------------------------------------------


def write(folder: Path, products, attributes, human=None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (("items_shuffle_1000.json", products), ("items_ins_v2_1000.json", attributes),
                       ("items_human_ins.json", human)):
        if data is not None:
            (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))
    return folder


@pytest.fixture
def good(tmp_path) -> tuple[list, dict, dict]:
    products, attributes, human = generate(100, 0)
    return products, attributes, human


def one_line_error(**env_args) -> str:
    with pytest.raises(BadInput) as err:
        shop(**env_args)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_webshop_data_files_load_from_data_dir(tmp_path, good):
    folder = write(tmp_path / "d", *good)
    env = shop(data_dir=str(folder))
    assert env.reset_sync(0).text.startswith("WebShop [SEP] Instruction: ")
    assert len(env.catalog.products) == 100


@pytest.mark.parametrize("damage, expected", [
    (lambda p, a, h: ("[not json", a, h), r"items_shuffle_1000\.json: not valid JSON"),
    (lambda p, a, h: ({"asin": 1}, a, h), r"items_shuffle_1000\.json: expected a JSON list of products"),
    (lambda p, a, h: ([{"asin": "B1"}], a, h), r"items_shuffle_1000\.json: expected product 0 to have name"),
    (lambda p, a, h: ([{**p[0], "pricing": "$abc$"}], a, h), r"items_shuffle_1000\.json: expected product 0 "),
    (lambda p, a, h: (p, [1, 2], h), r"items_ins_v2_1000\.json: expected an object \{asin"),
    (lambda p, a, h: (p, {"B1": "x"}, h), r"items_ins_v2_1000\.json: .*entry 'B1' is not"),
    (lambda p, a, h: (p, a, {p[0]["asin"]: "x"}), r"items_human_ins\.json: .* is not a list"),
    (lambda p, a, h: (p, a, {p[0]["asin"]: [{"instruction": "x"}]}), r"items_human_ins\.json: .*lacks"),
    (lambda p, a, h: (p, a, {}), r"items_human_ins\.json: expected at least one goal"),
])
def test_malformed_files_are_one_line_errors_naming_the_file(tmp_path, good, damage, expected):
    folder = write(tmp_path / "d", *damage(*good))
    assert __import__("re").search(expected, one_line_error(data_dir=str(folder)))


def test_bad_env_args_and_folders_are_one_line_errors(tmp_path, good):
    assert "data_dir" in one_line_error(data_dir=str(tmp_path / "nowhere"))
    assert "exactly one items_shuffle" in one_line_error(data_dir=str(write(tmp_path / "e", None, good[1])))
    assert "env_args.products must be an integer from 100" in one_line_error(products="many")
    assert "env_args.search_actions" in one_line_error(search_actions=-1)
    assert "env_args.goals must be one of" in one_line_error(goals="robot")
    synthetic_only = write(tmp_path / "s", good[0], good[1])
    assert "goals 'human' needs" in one_line_error(data_dir=str(synthetic_only), goals="human")


def test_webshop_data_env_var_points_at_the_files(tmp_path, good, monkeypatch):
    monkeypatch.setenv("WEBSHOP_DATA", str(write(tmp_path / "w", *good)))
    assert len(shop().catalog.products) == 100


def test_files_without_type_nouns_fall_back_to_name_words(tmp_path, good):
    products = [{k: v for k, v in p.items() if k != "type_nouns"} for p in good[0]]
    catalog = load(DataFiles(*(write(tmp_path / "n", products, good[1], good[2]) / n for n in (
        "items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json"))))
    first = catalog.products[0]
    assert first.type_nouns == name_nouns(first.title)
    assert name_nouns("Rowan Wool Socks - Breathable Mesh, 2 Pack") == ("rowan", "wool", "socks", "breathable", "mesh")
