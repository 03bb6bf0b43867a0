"""WebShop's reward for buying `product` with `chosen` options against `goal` (its get_reward):

    r = (attributes matched + options matched + [price <= price_upper])
        / (goal attributes + goal options + 1) * r_type

A goal attribute matches when one of the product's attributes is a fuzzy match (thefuzz's
token set ratio, above 85: `token_set_ratio` below) or it is a substring of the lowercased title, features
or description. A goal option matches when a chosen option value is a fuzzy match, both
reduced to their first colour word first. r_type (1, 0.5, 0.1 or 0) compares the query, the
category path and the nouns of the two names.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapidfuzz import fuzz, utils
from thicket.envs.webshop.catalog import Goal, Product

FUZZY_THRESHOLD = 85
# WebShop's colour words, in its order: an option value stands for the first one it contains.
COLORS = (
    "alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy "
    "camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral "
    "cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass "
    "gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon "
    "mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter "
    "pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone "
    "stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow"
).split()


@dataclass(frozen=True)
class RewardParts:
    reward: float
    r_type: float
    attributes_matched: int
    options_matched: int
    price_ok: bool
    query_match: bool
    category_match: bool
    title_score: float


# thefuzz's force_ascii (on by default in its token_set_ratio) deletes the characters 128-255
# ("café" reads "caf"); characters above 255 stay.
_NOT_ASCII = {i: None for i in range(128, 256)}


def token_set_ratio(a: str, b: str) -> int:
    """thefuzz's fuzz.token_set_ratio with its defaults: characters 128-255 dropped, then
    lowercased with non-alphanumerics as spaces and trimmed, then rapidfuzz's token set
    ratio, rounded to an int (Python's round)."""
    return int(round(fuzz.token_set_ratio(utils.default_process(a.translate(_NOT_ASCII)),
                                          utils.default_process(b.translate(_NOT_ASCII)))))


def fuzzy_match(a: str, b: str) -> bool:
    return token_set_ratio(a, b) > FUZZY_THRESHOLD


def normalize_color(value: str) -> str:
    return next((color for color in COLORS if color in value), value)


def type_factor(product: Product, goal: Goal) -> tuple[float, bool, bool, float]:
    """(r_type, query match, category match, title score)."""
    query_match = product.query == goal.query
    mine = {c.strip() for c in product.product_category.split("›")}
    wanted = {c.strip() for c in goal.product_category.split("›")}
    category_match = len(mine & wanted) >= 2
    if goal.type_nouns:
        title_score = len(set(product.type_nouns) & set(goal.type_nouns)) / len(goal.type_nouns)
    else:
        title_score = 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return r_type, query_match, category_match, title_score


def attributes_matched(product: Product, goal: Goal) -> int:
    texts = (product.title.lower(), " ".join(product.bullets).lower(), product.description.lower())
    return sum(
        any(fuzzy_match(mine, wanted) for mine in product.attributes) or any(wanted in t for t in texts)
        for wanted in goal.attributes
    )


def options_matched(chosen: tuple[str, ...], goal: Goal) -> int:
    mine = [normalize_color(v) for v in chosen]
    return sum(any(fuzzy_match(m, normalize_color(wanted)) for m in mine) for wanted in goal.options)


def reward(product: Product, chosen: tuple[str, ...], goal: Goal) -> RewardParts:
    r_type, query_match, category_match, title_score = type_factor(product, goal)
    n_attr = attributes_matched(product, goal)
    n_opt = options_matched(chosen, goal)
    price_ok = product.price <= goal.price_upper
    total = (n_attr + n_opt + price_ok) / (len(goal.attributes) + len(goal.options) + 1) * r_type
    return RewardParts(total, r_type, n_attr, n_opt, price_ok, query_match, category_match, title_score)
