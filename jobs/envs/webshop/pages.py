r"""WebShop's pages as a value: which page shows, what it says, what can be clicked, and where
each click leads (WebShop's text env in its `text` observation mode, as AgentGym serves it).

Actions are read as WebShop's text env reads them (`parse_action`): a prefix of the action
matching `(.+)\[(.+)\]` (no newlines inside, the verb everything before the last "[" that a
"]" follows), the verb compared as is, the argument lowercased and not stripped.

Differences from WebShop, on purpose (docs/envs/webshop.md): "Next >" shows only while more
results follow (WebShop shows it on every results page, the pages after the last empty); the
done page shows the score alone (WebShop's also carries an MTurk code and hidden details); an
ended episode stays ended.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum

from thicket.envs.webshop.catalog import Catalog, Goal, Product
from thicket.envs.webshop.html_text import node, nodes
from thicket.envs.webshop.reward import reward as score
from thicket.envs.webshop.search import SearchIndex

SEP = " [SEP] "
PER_PAGE = 10
BUY, BACK, NEXT, PREV = "buy now", "back to search", "next >", "< prev"
SUB_PAGES = ("description", "features", "reviews")
_ACTION = re.compile(r"(.+)\[(.+)\]")  # re.match: a prefix of the action; "." stops at newlines


def parse_action(action: str) -> tuple[str, str | None]:
    """(verb, argument): WebShop's parse_action (no match: the whole action, no argument)."""
    match = _ACTION.match(action)
    return (action, None) if match is None else (match.group(1), match.group(2))


class Page(StrEnum):
    SEARCH = "search"
    RESULTS = "results"
    ITEM = "item"
    DESCRIPTION = "description"
    FEATURES = "features"
    REVIEWS = "reviews"
    DONE = "done"


@dataclass(frozen=True)
class ShopState:
    page: Page = Page.SEARCH
    keywords: str = ""
    hits: tuple[str, ...] = ()  # asins of the search's top results, best first
    page_no: int = 1
    asin: str | None = None
    options: tuple[tuple[str, str], ...] = ()  # (group, value) chosen on the item page
    reward: float = 0.0


@dataclass(frozen=True)
class Shop:
    """What the pages of one task are drawn from."""

    catalog: Catalog
    index: SearchIndex
    goal: Goal

    def product(self, state: ShopState) -> Product:
        assert state.asin is not None
        return self.catalog.by_asin[state.asin]

    def shown(self, state: ShopState) -> tuple[str, ...]:
        start = (state.page_no - 1) * PER_PAGE
        return state.hits[start : start + PER_PAGE]

    # --- what a page offers ---

    def clickables(self, state: ShopState) -> tuple[str, ...]:
        """The page's clickable values, lowercased, in page order (the search button excluded)."""
        if state.page is Page.RESULTS:
            more = state.page_no * PER_PAGE < len(state.hits)
            pager = (PREV,) * (state.page_no > 1) + (NEXT,) * more
            return (BACK, *pager, *(asin.lower() for asin in self.shown(state)))
        if state.page is Page.ITEM:
            values = tuple(dict.fromkeys(v for _, vs in self.product(state).options for v in vs))
            return (BACK, PREV, *SUB_PAGES, BUY, *values)  # WebShop's buttons first, then the options
        if state.page in (Page.DESCRIPTION, Page.FEATURES, Page.REVIEWS):
            return (BACK, PREV)
        return ()

    # --- what a page says ---

    def text(self, state: ShopState) -> str:
        head = ["Instruction:", *node(self.goal.instruction)]
        if state.page is Page.SEARCH:
            return SEP.join(["WebShop", *head, "Search"])
        if state.page is Page.DONE:
            return SEP.join(["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", str(state.reward)])
        if state.page is Page.RESULTS:
            return SEP.join([*head, "Back to Search", *self._results(state)])
        product = self.product(state)
        body = {
            Page.ITEM: lambda: self._item(product),
            Page.DESCRIPTION: lambda: node(product.description),
            Page.FEATURES: lambda: nodes(*(f" {bullet}" for bullet in product.bullets)),
            Page.REVIEWS: list,
        }[state.page]()
        return SEP.join([*head, "Back to Search", "< Prev", *body])

    def _results(self, state: ShopState) -> list[str]:
        lines = [f"Page {state.page_no} (Total results: {len(state.hits)})"]
        lines += ["< Prev"] * (state.page_no > 1) + ["Next >"] * (state.page_no * PER_PAGE < len(state.hits))
        for asin in self.shown(state):
            product = self.catalog.by_asin[asin]
            lines += nodes(asin, product.title, product.price_tag)
        return lines

    @staticmethod
    def _item(product: Product) -> list[str]:
        lines = [part for group, values in product.options for part in nodes(group, *values)]
        return [*lines, *nodes(product.title, f"Price: {product.price_tag}"), "Rating: N.A.",
                "Description", "Features", "Reviews", "Buy Now"]

    # --- where an action leads ---

    def act(self, state: ShopState, action: str) -> ShopState:
        """The state after `action`; the same state when the page does not accept it."""
        verb, arg = parse_action(action)
        if arg is None or state.page is Page.DONE:
            return state
        arg = arg.lower()
        if verb == "search":  # from any page, as WebShop's text env
            return ShopState(Page.RESULTS, arg, self.index.search(arg))
        if verb == "click" and arg != "search" and arg in self.clickables(state):
            return self._click(state, arg)
        return state

    def _click(self, state: ShopState, value: str) -> ShopState:
        if value == BACK:
            return ShopState()
        if state.page is Page.RESULTS:
            if value in (NEXT, PREV):
                return replace(state, page_no=state.page_no + (1 if value == NEXT else -1))
            asin = next(a for a in self.shown(state) if a.lower() == value)
            return replace(state, page=Page.ITEM, asin=asin, options=())
        if state.page is Page.ITEM:
            return self._click_item(state, value)
        return replace(state, page=Page.ITEM)  # "< prev" on a sub-page

    def _click_item(self, state: ShopState, value: str) -> ShopState:
        if value == PREV:
            return replace(state, page=Page.RESULTS, asin=None, options=())
        if value in SUB_PAGES:
            return replace(state, page=Page(value))
        if value == BUY:
            chosen = tuple(v for _, v in state.options)
            return replace(state, page=Page.DONE, reward=score(self.product(state), chosen, self.goal).reward)
        group = self.product(state).option_group[value]
        options = dict(state.options) | {group: value}
        return replace(state, options=tuple(options.items()))
