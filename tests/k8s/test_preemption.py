"""The rollout pod's shutdown window after SIGTERM (preemption, a drain) is the spec's, and the
pod's deadline leaves room for it."""

from __future__ import annotations

from tests.support.manifests import by_kind, spec_with
from thicket.k8s.render import render
from thicket.spec import parse_spec


def rollout_pod(spec):
    return by_kind(render(spec), "Job", "rollout")[0]["spec"]["template"]["spec"]


def test_the_grace_period_is_the_checkpoint_window_and_the_deadline_grows_with_it():
    base = spec_with()
    longer = parse_spec({**base.model_dump(mode="json", exclude_unset=True),
                         "run": {"checkpoint": {"grace_s": 300}}})
    before, after = rollout_pod(base), rollout_pod(longer)
    assert before["terminationGracePeriodSeconds"] == 60
    assert after["terminationGracePeriodSeconds"] == 300
    assert after["activeDeadlineSeconds"] - before["activeDeadlineSeconds"] == 240
