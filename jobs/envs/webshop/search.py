"""BM25 search over the text WebShop indexes for each product: title, description, first
feature and the option text ("color: red, blue, and size: small"), lowercased.

WebShop ranks with pyserini's Lucene (Porter stemming); this is bm25s with its own tokenizer
(English stopwords, no stemming), so rankings differ from WebShop's for the same catalogue.
Ties are broken by catalogue order and only documents sharing a word with the query are hits.
"""

from __future__ import annotations

import functools

import bm25s
import numpy as np
from thicket.envs.webshop.catalog import Product

SEARCH_RETURN_N = 50


def document(product: Product) -> str:
    options = ", and ".join(f"{group}: {', '.join(values)}" for group, values in product.options)
    first_feature = product.bullets[0] if product.bullets else ""
    return " ".join([product.title, product.description, first_feature, options]).lower()


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class SearchIndex:
    def __init__(self, products: tuple[Product, ...]) -> None:
        self.asins = tuple(p.asin for p in products)
        self._bm25 = bm25s.BM25()
        self._bm25.index(_tokens([document(p) for p in products]), show_progress=False)
        self._vocab = set(self._bm25.vocab_dict)
        self.search = functools.lru_cache(maxsize=4096)(self._search)

    def _search(self, keywords: str) -> tuple[str, ...]:
        """The asins of the top hits (at most 50) for `keywords`, best first."""
        words = [w for w in _tokens([keywords.lower()])[0] if w in self._vocab]
        if not words:
            return ()
        scores = self._bm25.get_scores(words)
        order = np.lexsort((np.arange(len(scores)), -scores))
        hits = [i for i in order[:SEARCH_RETURN_N] if scores[i] > 0]
        return tuple(self.asins[i] for i in hits)
