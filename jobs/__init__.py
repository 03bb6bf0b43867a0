"""thicket: tree-search rollouts of LLM agents, as training data for agent RL."""

__version__ = "0.1.0"


def __getattr__(name: str):  # noqa: ANN202
    """`thicket.load`, imported on first use (it brings pyarrow; the CLI does not need it)."""
    if name == "load":
        from thicket.sweep_datasets import load

        return load
    raise AttributeError(f"module 'thicket' has no attribute {name!r}")
