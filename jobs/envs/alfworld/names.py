"""Names of things, from THOR object ids to what the player reads.

A THOR id ("Cabinet|+00.68|+00.50|-02.20", "Sink|-01.90|+00.97|-01.50|SinkBasin") is
mangled into a PDDL name by fixed substitutions; Fast Downward lowercases it. ALFWorld
shows each entity as its class and a number ("cabinet 3", "sinkbasin 1", "loc 12"): the
class is the text before the first separator, with "basin" appended when the id holds
"basin"; the numbers of a class are handed out over the ids in sorted order, from the
highest down (the first id of a class gets the class's count). Entities whose id has no
separator keep it, followed by a space (ALFWorld's rule, kept so that official games read
as ALFWorld shows them).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

_MANGLE = {"-": "_minus_", "#": "-", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
_MANGLE_RE = re.compile("|".join(re.escape(k) for k in _MANGLE))
_SEPARATOR = "_bar_"


def mangle(thor_id: str) -> str:
    """The PDDL name of a THOR id, as Fast Downward will read it (lowercase)."""
    return _MANGLE_RE.sub(lambda m: _MANGLE[m.group()], thor_id).lower()


def _class_of(pddl_name: str) -> str | None:
    head, sep, _ = pddl_name.partition(_SEPARATOR)
    if not sep:
        return None
    return head + "basin" if "basin" in pddl_name else head


def display_names(pddl_names: Iterable[str]) -> dict[str, str]:
    """pddl name -> the name ALFWorld shows ("cabinet 3")."""
    ids = sorted(set(pddl_names))
    counts = Counter(c for c in map(_class_of, ids) if c is not None)
    left = dict(counts)
    names = {}
    for name in ids:
        cls = _class_of(name)
        if cls is None:
            names[name] = f"{name} "
            continue
        names[name] = f"{cls} {left[cls]}"
        left[cls] -= 1
    return names
