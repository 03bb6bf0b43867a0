"""thicket: tree-search rollouts of LLM agents, as training data for agent RL."""

__version__ = "0.1.0"
