"""thicket: tree-search rollouts of LLM agents, as training data for agent RL."""

from thicket.version import __version__

__all__ = ["__version__", "load"]


def __getattr__(name: str):  # noqa: ANN202
    """`thicket.load`, imported on first use (it brings pyarrow; the CLI does not need it)."""
    if name == "load":
        from thicket.sweep_datasets import load

        return load
    raise AttributeError(f"module 'thicket' has no attribute {name!r}")
