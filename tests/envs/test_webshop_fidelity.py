"""WebShop's own rules for reading actions, listing clickables and turning a page into text,
re-expressed from its code (princeton-nlp/WebShop) as cases played against thicket's env:

- web_agent_site/engine/engine.py `parse_action`: `re.match(r'(.+)\\[(.+)\\]', action)`, so a
  prefix of the action counts, "." stops at a newline and the verb is everything before the
  last "[" that a "]" follows; no match: no argument.
- web_agent_site/envs/web_agent_text_env.py `step`: the verb is compared as is ('search',
  'click'), the argument lowercased and not stripped; `search` with a non-empty argument
  searches from any page; `click` needs the argument among the page's clickables and not
  'search'; anything else changes nothing.
- same file, `get_available_actions`: clickables are the `btn` buttons and product links in page
  order (text lowercased), then the option radios (templates/item_page.html: Back to Search,
  < Prev, Description, Features, Reviews, Buy Now; then the options).
- same file, `convert_html_to_text` (BeautifulSoup, html.parser): each text node stripped; an
  empty field makes no node; a whitespace-only one collapses to "\\n" (skipped) or " " (an
  empty segment).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from thicket.envs import make_env
from thicket.envs.webshop.env import WebShopEnv
from thicket.envs.webshop.pages import Page, Shop, ShopState

SEP = " [SEP] "


@pytest.fixture
def env() -> WebShopEnv:
    e = make_env("webshop")
    assert isinstance(e, WebShopEnv)
    e.reset_sync(0)
    return e


def to_item(env: WebShopEnv) -> None:
    goal = env.shop.goal
    env.step_sync(f"search[{goal.query}]")
    for _ in range(env.state.hits.index(goal.asin) // 10):
        env.step_sync("click[next >]")
    env.step_sync(f"click[{goal.asin.lower()}]")
    assert env.state.page is Page.ITEM


@pytest.mark.parametrize("action", [
    "Click[features]",  # the verb is compared as is
    "CLICK[features]",
    "click[ features]",  # the argument is not stripped
    "click[ < prev ]",
    "click[buy now ]",
    " click[features]",  # the verb is " click"
    "click [features]",  # the verb is "click "
    "\nclick[features]",  # "." does not match the newline: no match at the start
    "click[feat\nures]",
    "click[features] and click[reviews]",  # the verb is "click[features] and click"
    "click[features",
    "click[]",
    "search[]",
    "Search[shoes]",
    "features",
    "",
])
def test_actions_webshop_ignores_change_nothing(env, action):
    to_item(env)
    before = env.observation()
    t = env.step_sync(action)
    assert (t.observation, t.reward, t.done) == (before, 0.0, False)
    assert env.state.page is Page.ITEM


@pytest.mark.parametrize("action, page", [
    ("click[< prev] please", Page.RESULTS),  # a prefix of the action is enough
    ("click[features]\nthank you", Page.FEATURES),
    ("click[FEATURES]", Page.FEATURES),  # the argument is lowercased
    ("click[Buy Now]", Page.DONE),
    ("click[buy now]]", Page.ITEM),  # the argument is "buy now]": not clickable
    ("think: click[x]. click[reviews]", Page.ITEM),  # the verb is "think: click[x]. click"
])
def test_actions_webshop_reads(env, action, page):
    to_item(env)
    env.step_sync(action)
    assert env.state.page is page


def test_search_arguments_are_lowercased_unstripped_and_read_from_a_prefix(env):
    query = env.shop.goal.query
    plain = env.step_sync(f"search[{query}]").observation
    for action in (f"search[{query.upper()}]", f"search[{query}] now", f"search[{query}]\nplease"):
        env.reset_sync(0)
        assert env.step_sync(action).observation == plain, action
    env.reset_sync(0)
    blank = env.step_sync("search[ ]").observation  # " " is not empty: WebShop searches it
    assert blank.text.split(SEP)[3] == "Page 1 (Total results: 0)"


def test_clickables_are_the_buttons_then_the_product_links_then_the_options(env):
    env.step_sync(f"search[{env.shop.goal.query}]")
    env.step_sync("click[next >]")
    shown = tuple(a.lower() for a in env.state.hits[10:20])
    assert env.shop.clickables(env.state) == ("back to search", "< prev", "next >", *shown)
    env.step_sync("click[< prev]")
    to_item(env)
    product = env.catalog.by_asin[env.shop.goal.asin]
    values = [v for _, vs in product.options for v in vs]
    assert env.shop.clickables(env.state) == (
        "back to search", "< prev", "description", "features", "reviews", "buy now", *values)


# --- text nodes ---------------------------------------------------------------------


def page_text(env: WebShopEnv, page: Page, **fields) -> list[str]:
    """The page of the goal's product, with the product's fields replaced."""
    product = replace(env.catalog.by_asin[env.shop.goal.asin], **fields)
    catalog = replace(env.catalog, products=tuple(product if p.asin == product.asin else p
                                                  for p in env.catalog.products))
    shop = Shop(catalog, env.index, env.shop.goal)
    return shop.text(ShopState(page=page, hits=(product.asin,), asin=product.asin)).split(SEP)


def test_text_nodes_show_stripped(env):
    item = page_text(env, Page.ITEM, title="  Padded Title \t", price_tag=" $9.99 ")
    assert item[-7:-5] == ["Padded Title", "Price:  $9.99"]  # <h4>Price: {{Price}}</h4>: inner spaces stay
    results = page_text(env, Page.RESULTS, title="  Padded Title \t", price_tag=" $9.99 ")
    assert results[-2:] == ["Padded Title", "$9.99"]  # templates/results_page.html: asin, Title, Price


@pytest.mark.parametrize("description, tail", [
    ("", ["< Prev"]),  # <p></p>: no text node
    ("\n  ", ["< Prev"]),  # collapsed to "\n": skipped
    ("  ", ["< Prev", ""]),  # collapsed to " ": an empty segment
    ("  Calm.  ", ["< Prev", "Calm."]),
])
def test_an_empty_description_ends_the_page_at_prev(env, description, tail):
    assert page_text(env, Page.DESCRIPTION, description=description)[-len(tail):] == tail
    assert page_text(env, Page.DESCRIPTION, description=description)[:-len(tail)][-1] == "Back to Search"


def test_features_are_each_a_node_after_a_space(env):
    # templates/features_page.html: <p class="product-info"> {{bulletpoint}}</p>
    text = page_text(env, Page.FEATURES, bullets=("", "  Two.  ", "Three."))
    assert text[-4:] == ["< Prev", "", "Two.", "Three."]
