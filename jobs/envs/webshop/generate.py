"""A seeded synthetic catalogue in WebShop's file formats (not WebShop's benchmark data).

A few categories of product kinds; every product of a kind shares its query, category path and
type nouns, and differs in brand, attributes, option values and price. A product's name is
"<Brand> <Kind>" ("Balovia Running Shoes"): plain words, each brand belonging to one kind and no
kind word shared between kinds, so that no word of a name (in any case) is in the name of a
product of another kind. WebShop's type reward compares the nouns its tagger (spaCy) finds in
the two names; with these names every tagger that finds a kind's head noun gives the same
reward as the `type_nouns` written here (docs/envs/webshop.md, R17). Each drawn product gets
several goals (different attributes and option values of its own) and two twins that differ from
it in exactly one of: an attribute of its first goal, that goal's option values, or a price above
any goal's bound, so buying near misses earns partial rewards.

Written to `cache_dir/synthetic-<products>-<seed>-v<version>/` (items_shuffle_synthetic.json,
items_ins_v2_synthetic.json, items_human_ins.json) through one atomic rename, so processes can
share the cache: the first complete folder wins.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from thicket.envs.cache_dir import cache_root, cached_folder
from thicket.envs.webshop.catalog import DataFiles

log = logging.getLogger("thicket.envs.webshop")

GENERATOR_VERSION = 3  # 3: names of brand and kind only, brands per kind (issue 50)
PRODUCTS_FILE = "items_shuffle_synthetic.json"
ATTRIBUTES_FILE = "items_ins_v2_synthetic.json"
HUMAN_GOALS_FILE = "items_human_ins.json"
GOALS_PER_PRODUCT = 8  # at most: distinct (attributes, options) draws of one product


@dataclass(frozen=True)
class Kind:
    query: str
    nouns: tuple[str, ...]  # its head noun(s): what any tagger finds in "<Brand> <Kind>"
    leaf: str
    brands: tuple[str, ...] = ()


@dataclass(frozen=True)
class Category:
    name: str
    path: str  # the two top levels of its product_category
    kinds: tuple[Kind, ...]
    attributes: tuple[str, ...]  # pairwise below the fuzzy threshold, none inside another
    options: tuple[tuple[str, tuple[str, ...]], ...]


def _kinds(*rows: str) -> tuple[Kind, ...]:
    """"query|noun noun|leaf" rows."""
    return tuple(Kind(q, tuple(n.split()), leaf) for q, n, leaf in (row.split("|") for row in rows))


CATEGORIES = (
    Category(
        "fashion", "Clothing, Shoes & Jewelry › Sport",
        _kinds("running shoes|shoes|Shoes", "rain jacket|jacket|Jackets", "yoga pants|pants|Pants",
               "wool socks|socks|Socks", "baseball cap|cap|Hats"),
        ("machine washable", "non slip", "quick drying", "breathable mesh", "water resistant", "arch support",
         "elastic waistband", "moisture wicking"),
        (("color", ("black", "white", "red", "blue", "grey", "green", "pink", "navy")),
         ("size", ("small", "medium", "large"))),
    ),
    Category(
        "beauty", "Beauty & Personal Care › Skin & Hair",
        _kinds("shampoo|shampoo|Shampoo", "hair conditioner|hair conditioner|Conditioner",
               "argan oil|oil|Oils", "face moisturizer|face moisturizer|Moisturizers", "lip balm|lip balm|Lips"),
        ("paraben free", "cruelty free", "sulfate free", "long lasting", "sensitive skin", "natural ingredients",
         "travel size", "dermatologist tested"),
        (("scent", ("lavender", "coconut", "vanilla", "rose", "eucalyptus")),
         ("size", ("small", "medium", "large"))),
    ),
    Category(
        "grocery", "Grocery & Gourmet Food › Pantry",
        _kinds("herbal tea|tea|Tea", "granola bar|bar|Bars", "protein powder|protein powder|Powders",
               "coffee beans|coffee beans|Coffee", "rice crackers|crackers|Snacks"),
        ("gluten free", "non gmo", "low sugar", "keto friendly", "usda organic", "high fiber", "plant based",
         "kosher certified"),
        (("flavor", ("vanilla", "chocolate", "strawberry", "mango", "peach", "caramel")),
         ("package", ("box", "bag", "jar"))),
    ),
    Category(
        "home", "Home & Kitchen › Decor",
        _kinds("throw pillow|pillow|Pillows", "bath towel|towel|Towels", "desk lamp|lamp|Lamps",
               "storage basket|basket|Baskets", "shower curtain|curtain|Curtains"),
        ("easy clean", "space saving", "eco friendly", "fade resistant", "dimmable light", "hypoallergenic",
         "heavy duty", "living room"),
        (("color", ("beige", "ivory", "grey", "teal", "yellow", "brown")),
         ("size", ("small", "medium", "large"))),
    ),
    Category(
        "electronics", "Electronics › Accessories",
        _kinds("wireless earbuds|earbuds|Earbuds", "wall charger|charger|Chargers",
               "phone case|phone case|Cases", "bluetooth speaker|speaker|Speakers", "hdmi cable|cable|Cables"),
        ("fast charging", "noise cancelling", "long battery life", "waterproof", "high definition", "usb c",
         "plug and play", "shockproof"),
        (("color", ("black", "white", "silver", "blue", "red")),),
    ),
)

BRANDS_PER_KIND = 4
# Made-up brand words (a head and a tail syllable), BRANDS_PER_KIND of them for each kind.
_BRAND_HEADS = ("Bal", "Cor", "Dun", "Fen", "Gal", "Hol", "Kes", "Lum", "Mar", "Nor")
_BRAND_TAILS = ("ovia", "enta", "arix", "umbo", "elle", "iscus", "onda", "arby", "ivex", "osta")


def _with_brands(categories: tuple[Category, ...]) -> tuple[Category, ...]:
    words = [head + tail for head in _BRAND_HEADS for tail in _BRAND_TAILS]
    out, n = [], 0
    for category in categories:
        kinds = []
        for kind in category.kinds:
            kinds.append(replace(kind, brands=tuple(words[n : n + BRANDS_PER_KIND])))
            n += BRANDS_PER_KIND
        out.append(replace(category, kinds=tuple(kinds)))
    return tuple(out)


CATEGORIES = _with_brands(CATEGORIES)
TEMPLATES = ("i need {attrs} {kind}, and {options}", "i am looking for {attrs} {kind} with {options}",
             "find me {attrs} {kind} in {options}")
_ASIN_CHARS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass
class _Draft:
    """A product being drawn (mutable until written)."""

    asin: str
    category: Category
    kind: Kind
    brand: str
    attributes: list[str]
    options: dict[str, list[str]]
    price: float

    def record(self) -> dict[str, Any]:
        attrs = self.attributes
        return {
            "asin": self.asin,
            "name": f"{self.brand} {self.kind.query.title()}",
            "full_description": f"This {self.kind.query} by {self.brand} is {attrs[0]} and {attrs[1]}. "
                                f"Made for every day.",
            "small_description": [f"{a.capitalize()}." for a in attrs] + [f"Sold by {self.brand}."],
            "pricing": f"${self.price:.2f}",
            "customization_options": {g: [{"value": v, "image": None} for v in vs] for g, vs in self.options.items()},
            "images": [""],
            "category": self.category.name,
            "query": self.kind.query,
            "product_category": f"{self.category.path} › {self.kind.leaf}",
            "type_nouns": list(self.kind.nouns),
        }


class _Generator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.asins: set[str] = set()

    def asin(self) -> str:
        while True:
            asin = "B0" + "".join(self.rng.choice(_ASIN_CHARS) for _ in range(8))
            if asin not in self.asins:
                self.asins.add(asin)
                return asin

    def draft(self, category: Category, kind: Kind) -> _Draft:
        rng = self.rng
        options = {g: sorted(rng.sample(vs, rng.randint(2, len(vs))), key=vs.index) for g, vs in category.options}
        return _Draft(self.asin(), category, kind, rng.choice(kind.brands), rng.sample(category.attributes, 3), options,
                      round(rng.uniform(5.0, 90.0), 2))

    def goals(self, draft: _Draft) -> list[dict[str, Any]]:
        drawn: dict[str, dict[str, Any]] = {}
        for _ in range(2 * GOALS_PER_PRODUCT):
            goal = self.goal(draft)
            key = json.dumps([sorted(goal["instruction_attributes"]), goal["instruction_options"]])
            drawn.setdefault(key, goal)
            if len(drawn) == GOALS_PER_PRODUCT:
                break
        return list(drawn.values())

    def goal(self, draft: _Draft) -> dict[str, Any]:
        rng = self.rng
        attrs = rng.sample(draft.attributes, rng.randint(1, 2))
        options = [rng.choice(vs) for vs in draft.options.values()]
        text = rng.choice(TEMPLATES).format(attrs=" and ".join(attrs), kind=draft.kind.query,
                                            options=" and ".join(options))
        return {"instruction": text, "instruction_attributes": attrs, "instruction_options": options}

    def twin(self, base: _Draft, goal: dict[str, Any]) -> _Draft:
        """A copy of `base` missing one thing the goal asks for."""
        rng = self.rng
        twin = _Draft(self.asin(), base.category, base.kind, rng.choice(base.kind.brands), list(base.attributes),
                      {g: list(vs) for g, vs in base.options.items()}, base.price)
        miss = rng.choice(("attribute", "option", "price"))
        if miss == "attribute":
            lost = rng.choice(goal["instruction_attributes"])
            spare = [a for a in base.category.attributes if a not in base.attributes]
            twin.attributes[twin.attributes.index(lost)] = rng.choice(spare)
        elif miss == "option":
            group = rng.choice(list(twin.options))
            pool = dict(base.category.options)[group]
            others = [v for v in pool if v not in goal["instruction_options"]]
            twin.options[group] = sorted(rng.sample(others, min(2, len(others))), key=pool.index)
        else:
            twin.price = round(base.price + 100.0, 2)  # above any bound drawn for the base
        return twin


def generate(products: int, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(products, attributes, human goals) records in WebShop's formats."""
    gen = _Generator(seed)
    kinds = [(c, k) for c in CATEGORIES for k in c.kinds]
    drafts: list[_Draft] = []
    goals: dict[str, list[dict[str, Any]]] = {}
    while len(drafts) < products:
        base = gen.draft(*kinds[len(drafts) % len(kinds)])
        drafts.append(base)
        if len(drafts) + 2 <= products:
            goals[base.asin] = gen.goals(base)
            drafts.extend(gen.twin(base, goals[base.asin][0]) for _ in range(2))
    gen.rng.shuffle(drafts)
    records = [d.record() for d in drafts]
    attributes = {d.asin: {"attributes": d.attributes, **_instruction(d, goals.get(d.asin))} for d in drafts}
    return records, attributes, goals


def _instruction(draft: _Draft, goals: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The synthetic-goal fields WebShop's attribute file carries (options are added per goal)."""
    if not goals:
        return {}
    wanted = goals[0]["instruction_attributes"]
    return {"instruction": f"i need {' and '.join(wanted)} {draft.kind.query}", "instruction_attributes": wanted}


def default_cache_dir() -> Path:
    return cache_root("webshop", "THICKET_WEBSHOP_CACHE")


def synthetic_files(products: int, seed: int, cache_dir: Path | None = None) -> DataFiles:
    """The generated catalogue's files, generating them on first use."""
    target = (cache_dir or default_cache_dir()) / f"synthetic-{products}-{seed}-v{GENERATOR_VERSION}"
    cached_folder(target, PRODUCTS_FILE, lambda work: _write(work, products, seed), log)  # the files appear together
    return DataFiles(target / PRODUCTS_FILE, target / ATTRIBUTES_FILE, target / HUMAN_GOALS_FILE)


def _write(work: Path, products: int, seed: int) -> str:
    for name, payload in zip((PRODUCTS_FILE, ATTRIBUTES_FILE, HUMAN_GOALS_FILE), generate(products, seed), strict=True):
        (work / name).write_text(json.dumps(payload), encoding="utf-8")
    return f"{products} products, seed {seed}"
