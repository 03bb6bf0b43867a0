"""Search actions to list on the search page, made from the instruction's own words.

WebShop's search is free text, so the search page lists no actions by default (valid_actions
None). With `search_actions: N` the env lists up to N `search[...]` actions, so a policy that
picks from a list (the uniform baseline) can play: the instruction's content words (before its
price clause), then shorter and shorter leading runs of them. Nothing from the goal's hidden
fields (its query, asin, attributes) is used.
"""

from __future__ import annotations

import re

_STOPWORDS = frozenset(
    "i im i'm am is are a an the for of to with and or in on me my need want looking find buy "
    "that this it its be get some please would like".split()
)


def content_words(instruction: str) -> list[str]:
    before_price = instruction.lower().split(", and price lower than")[0]
    words = [w for w in re.findall(r"[a-z0-9][a-z0-9'\-]*", before_price) if w not in _STOPWORDS]
    return list(dict.fromkeys(words))


def search_actions(instruction: str, n: int) -> tuple[str, ...]:
    words = content_words(instruction)
    queries: list[str] = []
    length = len(words)
    while length > 0 and len(queries) < n:
        query = " ".join(words[:length])
        if query not in queries:
            queries.append(query)
        length = length * 2 // 3 if length > 2 else length - 1
    return tuple(f"search[{q}]" for q in queries)
