"""Owner references: the sweep's ConfigMap and RBAC belong to its rollout and aggregation Jobs, so
the Jobs' TTL cleans them too (the fake API server collects garbage as Kubernetes does, at once),
and `submit --replace` / `--resume`, which delete Jobs to recreate them, never lose them."""

from __future__ import annotations

import pytest

from tests.support.manifests import BASE
from thicket.k8s.client import connect
from thicket.k8s.render import render
from thicket.k8s.submit import cancel, submit
from thicket.spec import parse_spec

DEPENDENTS = [("configmaps", "tc-spec"), ("serviceaccounts", "tc-aggregate"), ("roles", "tc-aggregate"),
              ("rolebindings", "tc-aggregate")]


def live(fake, plural, name):
    return fake.get(plural, "thicket", name)


def owners(fake, plural, name):
    return {(ref["name"], ref["uid"]) for ref in live(fake, plural, name)["metadata"].get("ownerReferences", [])}


def job_uids(fake):
    return {(name, live(fake, "jobs", name)["metadata"]["uid"]) for name in ("tc", "tc-aggregate")}


def finish(fake, *names):
    for name in names:
        live(fake, "jobs", name)["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}


@pytest.fixture()
def submitted(fake):
    spec = parse_spec(BASE)
    submit(connect(), spec, render(spec), echo=lambda _: None)
    return fake, spec


def test_the_sweeps_objects_belong_to_its_rollout_and_aggregation_jobs(submitted):
    fake, _ = submitted
    for plural, name in DEPENDENTS:
        assert owners(fake, plural, name) == job_uids(fake), (plural, name)
    assert "ownerReferences" not in live(fake, "jobs", "tc-prefetch")["metadata"]


def test_they_go_when_both_jobs_are_deleted_by_their_ttl_not_before(submitted):
    fake, _ = submitted
    connect().delete("Job", "thicket", "tc")  # the rollout's TTL passes first
    assert all(live(fake, plural, name) is not None for plural, name in DEPENDENTS)
    connect().delete("Job", "thicket", "tc-aggregate")
    assert all(live(fake, plural, name) is None for plural, name in DEPENDENTS)


@pytest.mark.parametrize("how", ["resume", "replace"])
def test_recreating_the_jobs_keeps_the_objects_and_hands_them_to_the_new_jobs(submitted, how):
    fake, spec = submitted
    before = {key: live(fake, *key)["metadata"]["uid"] for key in DEPENDENTS}
    if how == "resume":
        finish(fake, "tc", "tc-aggregate-wait", "tc-aggregate")
        submit(connect(), spec, render(spec), resume=True, echo=lambda _: None)
    else:
        changed = parse_spec({**BASE, "search": {"algorithm": "mcts", "iterations": 4}})
        submit(connect(), changed, render(changed), replace=True, echo=lambda _: None)
    # Never collected with the old Jobs (a new uid would mean deleted and created again).
    assert {key: live(fake, *key)["metadata"]["uid"] for key in DEPENDENTS} == before
    for plural, name in DEPENDENTS:
        assert owners(fake, plural, name) == job_uids(fake)


def test_cancel_still_deletes_everything(submitted):
    fake, _ = submitted
    cancel(connect(), "thicket", "tc", echo=lambda _: None)
    assert all(live(fake, plural, name) is None for plural, name in DEPENDENTS)
    assert not [key for key in fake.objects if key[0] == "jobs"]
