"""Step pairs whose two sides take the same parsed action: replies that differ in their thoughts only.

The env sees only the action, so such a pair says nothing about which action to take. What its
value gap says depends on the env (Env.deterministic, recorded per tree in the shards):
- deterministic: both sides reach the same state; the gap is the thought's alone (how it steers the
  policy's later replies, plus their sampling luck): a thought-level preference.
- stochastic, or not declared: the two sides may reach different states by the transition's draw,
  which neither reply chose; the gap mixes that luck into the thought's effect: no preference.
So they are dropped by default in every env, and DPOParams.thought_pairs keeps them where the env is
deterministic, only there. stats.json `preference_rows_same_action` counts them per dataset.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from thicket.aggregate.forest import Forest


def screen(forest: Forest, a: np.ndarray, b: np.ndarray, thought_pairs: bool,
           tally: Counter[str] | None = None, dataset: str = "dpo") -> np.ndarray:
    """Per step pair (siblings a[i], b[i]), whether it is kept; the same-action ones dropped and
    kept are counted in `tally` as "{dataset}/dropped" and "{dataset}/kept"."""
    same = forest.action_codes[a] == forest.action_codes[b]
    keep = ~same | (thought_pairs & forest.deterministic[a])
    if tally is not None:
        tally[f"{dataset}/dropped"] += int((same & ~keep).sum())
        tally[f"{dataset}/kept"] += int((same & keep).sum())
    return keep
