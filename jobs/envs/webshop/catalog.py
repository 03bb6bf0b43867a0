"""Products and goals, read from WebShop's own data files.

- products (`items_shuffle*.json`): a JSON list of objects with `asin`, `name`,
  `full_description`, `small_description` (a string or a list), `pricing` ("$12.99", a range
  "$10.00$20.00", or empty: $100), `customization_options` ({group: [{"value": ...}] | null}),
  `category`, `query`, `product_category` ("A › B › C"). thicket reads one more, optional key,
  `type_nouns`: the nouns of `name` that WebShop's type reward compares (it asks spaCy for them).
- attributes (`items_ins_v2*.json`): {asin: {"attributes": [...], "instruction": ...,
  "instruction_attributes": [...]}}.
- human goals (`items_human_ins.json`): {asin: [{"instruction", "instruction_attributes",
  "instruction_options"}]}.

As WebShop's loader does: option groups and values are lowercased ("/" becomes " | "), a product
without attributes gets ["DUMMY_ATTR"], asins "nan" or longer than 10 characters and repeated
asins are skipped, goals with no attributes are skipped, and a goal's price bound is the larger
of two of the next four $10 steps above the product's price (when there are two). Unlike it, the
draws are seeded per goal and per asin (not one global stream), so a catalogue's tasks are the
same in every process; task i is goal i after a shuffle seeded with 233.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cached_property
from pathlib import Path
from typing import Any

from thicket.errors import BadInput

PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))
NO_PRICE_BOUND = 1_000_000.0
GOAL_SHUFFLE_SEED = 233
_NOT_NOUNS = frozenset(
    "a an and the of for with in on to by from or & pack set new one two three four five six".split()
)


@dataclass(frozen=True)
class Product:
    asin: str
    title: str
    description: str
    bullets: tuple[str, ...]
    price: float
    price_tag: str
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (group, values) in the file's order
    attributes: tuple[str, ...]
    category: str
    query: str
    product_category: str
    type_nouns: tuple[str, ...]

    @cached_property
    def option_group(self) -> dict[str, str]:
        """value -> its group; a value in two groups belongs to the last (as WebShop's clickables)."""
        return {value: group for group, values in self.options for value in values}


@dataclass(frozen=True)
class Goal:
    asin: str
    instruction: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    price_upper: float
    query: str
    product_category: str
    type_nouns: tuple[str, ...]  # the nouns of the goal product's name


@dataclass(frozen=True)
class Catalog:
    products: tuple[Product, ...]
    goals: tuple[Goal, ...]
    source: str  # where it came from, for messages

    @cached_property
    def by_asin(self) -> dict[str, Product]:
        return {p.asin: p for p in self.products}

    def goal(self, task: int) -> Goal:
        if not 0 <= task < len(self.goals):
            raise BadInput(f"webshop: task {task} is out of range; {self.source} has tasks 0..{len(self.goals) - 1}")
        return self.goals[task]


@dataclass(frozen=True)
class DataFiles:
    products: Path
    attributes: Path
    human_goals: Path | None  # None: synthetic goals from the attribute file's instructions


# --- reading files -----------------------------------------------------------------


def _fail(path: Path, expected: str) -> BadInput:
    return BadInput(f"webshop: {path}: expected {expected}")


def _read_json(path: Path, kind: type, expected: str) -> Any:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"webshop: {path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadInput(f"webshop: {path}: not valid JSON ({err}); expected {expected}") from None
    if not isinstance(data, kind):
        raise _fail(path, expected)
    return data


def parse_pricing(pricing: Any) -> tuple[float, ...]:
    """"$12.99" -> (12.99,), "$10.00$20.00" -> (10.0, 20.0), empty -> (100.0,)."""
    if not pricing:
        return (100.0,)
    prices = tuple(float(Decimal(re.sub(r"[^\d.]", "", part))) for part in str(pricing).split("$")[1:])
    return prices[:2] or (100.0,)


def _price(asin: str, prices: tuple[float, ...]) -> tuple[float, str]:
    if len(prices) == 1:
        return prices[0], f"${prices[0]}"
    return random.Random(f"price:{asin}").uniform(*prices), f"${prices[0]} to ${prices[1]}"


def _options(raw: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    groups = []
    for name, contents in (raw or {}).items():
        if contents is None:
            continue
        values = tuple(str(c["value"]).strip().replace("/", " | ").lower() for c in contents)
        groups.append((str(name).lower(), values))
    return tuple(groups)


def name_nouns(name: str) -> tuple[str, ...]:
    """A stand-in for spaCy's nouns of a name, for files without `type_nouns`: its words less
    a few function words (an approximation: it keeps adjectives)."""
    return tuple(w for w in re.findall(r"[a-z]+", name.lower()) if w not in _NOT_NOUNS and len(w) > 1)


def _product(raw: dict[str, Any], attributes: dict[str, Any]) -> Product:
    asin = str(raw["asin"])
    price, tag = _price(asin, parse_pricing(raw.get("pricing")))
    bullets = raw["small_description"]
    info = attributes.get(asin) or {}
    nouns = raw.get("type_nouns")
    return Product(
        asin=asin,
        title=str(raw["name"]),
        description=str(raw["full_description"]),
        bullets=tuple(map(str, bullets)) if isinstance(bullets, list) else (str(bullets),),
        price=price,
        price_tag=tag,
        options=_options(raw.get("customization_options")),
        attributes=tuple(info.get("attributes") or ()) or ("DUMMY_ATTR",),
        category=str(raw["category"]),
        query=str(raw["query"]).lower().strip(),
        product_category=str(raw["product_category"]),
        type_nouns=tuple(map(str, nouns)) if isinstance(nouns, list) else name_nouns(str(raw["name"])),
    )


PRODUCT_KEYS = ("asin", "name", "full_description", "small_description", "category", "query", "product_category")


def read_products(path: Path, attributes: dict[str, Any]) -> tuple[Product, ...]:
    expected = f"a JSON list of products, each an object with {', '.join(PRODUCT_KEYS)}"
    raw = _read_json(path, list, expected)
    products, seen = [], set()
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or any(k not in item for k in PRODUCT_KEYS):
            missing = [k for k in PRODUCT_KEYS if not isinstance(item, dict) or k not in item]
            raise _fail(path, f"product {i} to have {', '.join(missing)} ({expected})")
        asin = str(item["asin"])
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        try:
            products.append(_product(item, attributes))
        except (KeyError, TypeError, AttributeError, InvalidOperation, ValueError) as err:
            raise _fail(path, f"product {i} ({asin}) in WebShop's product format ({type(err).__name__}: {err})") from None
    if not products:
        raise _fail(path, "at least one product")
    return tuple(products)


def read_attributes(path: Path) -> dict[str, Any]:
    expected = 'an object {asin: {"attributes": [...], "instruction": ..., "instruction_attributes": [...]}}'
    data = _read_json(path, dict, expected)
    for asin, info in data.items():
        if not isinstance(info, dict) or not isinstance(info.get("attributes", []), list):
            raise _fail(path, f"{expected}; entry {asin!r} is not")
    return data


# --- goals --------------------------------------------------------------------------


def _price_bound(product: Product, key: str) -> tuple[float, str]:
    above = [p for p in PRICE_STEPS if p > product.price][:4]
    if len(above) < 2:
        return NO_PRICE_BOUND, ""
    upper = max(random.Random(f"bound:{key}").sample(above, 2))
    return upper, f", and price lower than {upper:.2f} dollars"


def _goal(product: Product, text: str, attributes: list[Any], options: list[Any], key: str) -> Goal:
    upper, price_text = _price_bound(product, key)
    return Goal(
        asin=product.asin,
        instruction=text + price_text,
        attributes=tuple(map(str, attributes)),
        options=tuple(map(str, options)),
        price_upper=upper,
        query=product.query,
        product_category=product.product_category,
        type_nouns=product.type_nouns,
    )


def human_goals(path: Path, products: tuple[Product, ...]) -> list[Goal]:
    expected = '{asin: [{"instruction": ..., "instruction_attributes": [...], "instruction_options": [...]}]}'
    data = _read_json(path, dict, expected)
    goals = []
    for product in products:
        entries = data.get(product.asin) or []
        if not isinstance(entries, list):
            raise _fail(path, f"{expected}; entry {product.asin!r} is not a list")
        for k, entry in enumerate(entries):
            try:
                attributes, options = list(entry["instruction_attributes"]), list(entry.get("instruction_options") or [])
                text = str(entry["instruction"]).strip(".")
            except (KeyError, TypeError) as err:
                raise _fail(path, f"{expected}; goal {k} of {product.asin!r} lacks {err}") from None
            if attributes:
                goals.append(_goal(product, text, attributes, options, f"{product.asin}:{k}"))
    return goals


def synthetic_goals(attributes: dict[str, Any], products: tuple[Product, ...]) -> list[Goal]:
    """One goal per combination of a product's option values, as WebShop's synthetic goals."""
    goals = []
    for product in products:
        info = attributes.get(product.asin) or {}
        if not info.get("instruction") or not info.get("instruction_attributes"):
            continue
        groups = sorted(product.options)
        for k, combo in enumerate(itertools.product(*(values for _, values in groups))):
            wanted = ", and ".join(f"{name}: {value}" for (name, _), value in zip(groups, combo, strict=True))
            text = str(info["instruction"]) + (f" with {wanted}" if wanted else "")
            goals.append(_goal(product, text, info["instruction_attributes"], list(combo), f"{product.asin}:{k}"))
    return goals


def load(files: DataFiles) -> Catalog:
    attributes = read_attributes(files.attributes)
    products = read_products(files.products, attributes)
    if files.human_goals is not None:
        goals, source = human_goals(files.human_goals, products), files.human_goals
    else:
        goals, source = synthetic_goals(attributes, products), files.attributes
    if not goals:
        raise _fail(source, "at least one goal (with attributes) for a product of " + str(files.products))
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalog(products, tuple(goals), str(files.products.parent))
