"""WebShop's reward on crafted products, each expected value worked out by hand from WebShop's
get_reward: (attributes + options + [price <= bound]) / (|attributes| + |options| + 1) * r_type,
fuzzy matches = thefuzz's token_set_ratio (lowercased, punctuation as spaces, rounded) > 85,
options reduced to their first WebShop colour word, r_type from query / category / name nouns."""

from __future__ import annotations

from dataclasses import replace

import pytest

from thicket.envs.webshop.catalog import Goal, Product
from thicket.envs.webshop.reward import reward, token_set_ratio

GOAL = Goal(
    asin="B000000001",
    instruction="i need gluten free and non gmo herbal tea, and flavor vanilla and box",
    attributes=("gluten free", "non gmo"),
    options=("vanilla", "box"),
    price_upper=30.0,
    query="herbal tea",
    product_category="Grocery › Pantry › Tea",
    type_nouns=("tea",),
)
TEA = Product(
    asin="B000000001",
    title="Kestrel Herbal Tea",
    description="A calm blend.",
    bullets=("Steep 5 minutes.",),
    price=20.0,
    price_tag="$20.0",
    options=(("flavor", ("vanilla", "mango")), ("package", ("box", "bag"))),
    attributes=("gluten free", "non gmo", "low sugar"),
    category="grocery",
    query="herbal tea",
    product_category="Grocery › Pantry › Tea",
    type_nouns=("tea",),
)
ALL = ("vanilla", "box")


def r(product: Product = TEA, chosen: tuple[str, ...] = ALL, goal: Goal = GOAL) -> float:
    return reward(product, chosen, goal).reward


def test_everything_matching_is_one():
    assert r() == 1.0


@pytest.mark.parametrize("attributes, text, expected", [
    (("gluten free", "low sugar"), "A calm blend.", 4 / 5),  # "non gmo" nowhere
    (("low sugar",), "A calm blend.", 3 / 5),
    (("low sugar",), "Non GMO and gluten free.", 5 / 5),  # found in the description instead
    (("Gluten-Free", "non gmo"), "A calm blend.", 5 / 5),  # punctuation and case do not count
    (("gluten free tea", "non gmo"), "A calm blend.", 5 / 5),  # token set: the goal's words are a subset
    (("sugar free", "non gmo"), "A calm blend.", 4 / 5),  # shares only "free": ratio 57
])
def test_the_attribute_share_moves_the_reward(attributes, text, expected):
    assert r(replace(TEA, attributes=attributes, description=text)) == pytest.approx(expected)


def test_an_attribute_in_the_title_or_features_counts():
    bare = replace(TEA, attributes=("low sugar",))
    assert r(replace(bare, title="Kestrel Non GMO Herbal Tea")) == pytest.approx(4 / 5)
    assert r(replace(bare, bullets=("Certified gluten free.", "Non GMO."))) == pytest.approx(5 / 5)


@pytest.mark.parametrize("chosen, expected", [
    (("vanilla",), 4 / 5), ((), 3 / 5), (("mango", "bag"), 3 / 5), (("box", "vanilla"), 5 / 5),
])
def test_the_chosen_options_move_the_reward(chosen, expected):
    assert r(chosen=chosen) == pytest.approx(expected)


def test_options_compare_by_their_first_colour_word():
    goal = replace(GOAL, options=("navy blue",), attributes=("gluten free",))
    # "navy blue" contains "blue" first in WebShop's colour list: it reads as "blue"
    assert r(chosen=("blue",), goal=goal) == pytest.approx(3 / 3)
    dark = replace(goal, options=("dark red",))  # reads as "dark": "red" does not match
    assert r(chosen=("red",), goal=dark) == pytest.approx(2 / 3)


@pytest.mark.parametrize("price, expected", [(29.99, 1.0), (30.0, 1.0), (30.01, 4 / 5), (95.0, 4 / 5)])
def test_the_price_bound_moves_the_reward(price, expected):
    assert r(replace(TEA, price=price)) == pytest.approx(expected)


def test_a_goal_without_options_divides_by_attributes_plus_one():
    goal = replace(GOAL, options=())
    assert r(chosen=(), goal=goal) == 1.0
    assert r(replace(TEA, price=99.0), chosen=(), goal=goal) == pytest.approx(2 / 3)


OTHER = replace(TEA, query="green tea", product_category="Grocery › Drinks › Green Tea")  # shares 1 level


@pytest.mark.parametrize("product, goal_nouns, expected", [
    (TEA, ("tea",), 1.0),  # same query
    (replace(OTHER, product_category="Grocery › Pantry › Green Tea"), ("tea",), 1.0),  # 2 levels shared
    (OTHER, ("tea",), 1.0),  # title score 1 > 0.2
    (replace(OTHER, type_nouns=("tea",)), ("herbal", "tea", "bags", "box", "leaves"), 0.5),  # 1/5 = 0.2: no match
    (replace(OTHER, type_nouns=("tea",)), tuple("abcdefghij") + ("tea",), 0.1),  # 1/11 < 0.1
    (replace(TEA, type_nouns=("coffee",)), ("tea",), 0.0),  # no shared noun: 0 despite the same query
    (OTHER, (), 0.5),  # no goal nouns: title score 0.2, and nothing else matches
    (TEA, (), 1.0),  # no goal nouns, same query
])
def test_the_type_factor_scales_the_reward(product, goal_nouns, expected):
    assert r(product, goal=replace(GOAL, type_nouns=goal_nouns)) == pytest.approx(expected)


def test_all_factors_together():
    # one attribute, one option, price over the bound, r_type 0.5: (1 + 1 + 0) / 5 * 0.5
    product = replace(OTHER, attributes=("gluten free",), price=31.0, type_nouns=("tea",))
    goal = replace(GOAL, type_nouns=("herbal", "tea", "bags", "box", "leaves"))
    parts = reward(product, ("vanilla", "bag"), goal)
    assert (parts.attributes_matched, parts.options_matched, parts.price_ok, parts.r_type) == (1, 1, False, 0.5)
    assert parts.reward == pytest.approx(0.2)


# thefuzz's fuzz.token_set_ratio(a, b) with its defaults (force_ascii=True: characters 128-255
# deleted first, others kept), the values thefuzz 0.22.1 gives; WebShop's goal.py calls it so.
@pytest.mark.parametrize("a, b, score", [
    ("café", "cafe", 86),  # "caf" vs "cafe"
    ("café latte", "cafe latte", 95),
    ("crème brûlée", "creme brulee", 86),
    ("ü", "u", 0),  # nothing left of "ü"
    ("łódź", "lodz", 29),  # "ł" and "ź" are above 255: kept
    ("Gluten-Free", "gluten free", 100),
])
def test_fuzzy_scores_are_thefuzzs_with_force_ascii(a, b, score):
    assert token_set_ratio(a, b) == score == token_set_ratio(b, a)


def test_an_accented_option_or_attribute_matches_as_in_webshop():
    goal = replace(GOAL, options=("café", "box"))
    assert r(chosen=("cafe", "box"), goal=goal) == 1.0  # 86 > 85
    crafted = replace(TEA, attributes=("cafe", "non gmo"))
    assert r(crafted, goal=replace(GOAL, attributes=("café", "non gmo"))) == 1.0
