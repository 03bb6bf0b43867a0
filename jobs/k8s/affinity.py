"""Node affinities of the pods that must stay off GPU nodes (the aggregation, the model prefetch)."""

from __future__ import annotations

from typing import Any


def cpu_node_affinity(avoid: list[str]) -> dict[str, Any]:
    """A required node affinity: only nodes that carry none of the `avoid` labels (GPU nodes)."""
    terms = [{"matchExpressions": [{"key": key, "operator": "DoesNotExist"} for key in avoid]}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
