"""A gold path for a task: search, page to the goal's product, choose its options, buy.

Where the search page lists its searches (`search_actions` > 0), the path searches with the
first listed one whose results hold the product, so that a policy held to the listed actions
(constrain_actions) can play it, and there is none where no listed search finds it. Where
search is free text, it searches the goal's query (a hidden field: an expert's privilege),
then, while the product is not among the top results, the instruction's content words, then
the product's title, then its title and description.
"""

from __future__ import annotations

from dataclasses import dataclass

from thicket.envs.webshop.catalog import Goal, Product
from thicket.envs.webshop.pages import PER_PAGE
from thicket.envs.webshop.queries import content_words
from thicket.envs.webshop.reward import fuzzy_match, normalize_color, token_set_ratio
from thicket.envs.webshop.search import SearchIndex


@dataclass(frozen=True)
class GoldStep:
    thought: str
    action: str


def _best_value(product: Product, wanted: str) -> str | None:
    """The product's option value that matches `wanted` best, if any matches at all."""
    values = [v for _, vs in product.options for v in vs]
    matching = [v for v in values if fuzzy_match(normalize_color(v), normalize_color(wanted))]
    if not matching:
        return None
    return max(matching, key=lambda v: token_set_ratio(v, wanted))


def gold_path(goal: Goal, product: Product, index: SearchIndex,
              listed: tuple[str, ...] | None = None) -> list[GoldStep] | None:
    """`listed`: the search page's listed search actions (None: free text)."""
    free = (goal.query, " ".join(content_words(goal.instruction)), product.title.lower(),
            f"{product.title} {product.description}".lower())
    candidates = [a.removeprefix("search[").removesuffix("]") for a in listed] if listed else free
    for keywords in candidates:
        hits = index.search(keywords)
        if goal.asin in hits:
            break
    else:
        return None
    steps = [GoldStep(f"search for {keywords}.", f"search[{keywords}]")]
    for page in range(hits.index(goal.asin) // PER_PAGE):
        steps.append(GoldStep(f"the product is after page {page + 1}.", "click[next >]"))
    steps.append(GoldStep(f"open {product.title}.", f"click[{goal.asin.lower()}]"))
    for wanted in goal.options:
        value = _best_value(product, wanted)
        if value is not None:
            steps.append(GoldStep(f"choose {wanted}.", f"click[{value}]"))
    steps.append(GoldStep("it matches: buy it.", "click[buy now]"))
    return steps
