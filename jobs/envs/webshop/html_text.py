"""How WebShop's `text` observation shows the text a template puts in one HTML element.

WebShop renders a page's HTML and joins its visible text nodes with " [SEP] ", each stripped
(web_agent_text_env.convert_html_to_text, over BeautifulSoup's html.parser). So a field's text
shows stripped; an empty field makes no text node and no segment; BeautifulSoup collapses a
whitespace-only node to "\\n" when it holds a newline (then skipped) and to " " otherwise (then
an empty segment).
"""

from __future__ import annotations

_HTML_SPACE = frozenset(" \t\n\r\f")


def node(text: str) -> list[str]:
    """The segments (none or one) that an element holding exactly `text` adds to the page."""
    if not text:
        return []
    if all(c in _HTML_SPACE for c in text):
        return [] if "\n" in text else [""]
    return [text.strip()]


def nodes(*texts: str) -> list[str]:
    return [segment for text in texts for segment in node(text)]
