"""Names and counts every rendered object shares (thicket.k8s.names): short stable Job names for
long sweep names, completions equal to the task ranges, and too many indexes for one Job."""

from __future__ import annotations

import copy

import pytest

from tests.support.manifests import BASE, rollout, variant_specs
from thicket.errors import BadInput
from thicket.k8s.names import MAX_JOB_NAME
from thicket.k8s.render import render
from thicket.spec import parse_spec


def test_long_sweep_names_give_short_stable_job_names():
    objects = render(variant_specs()["long-name"])
    for obj in objects:
        limit = MAX_JOB_NAME if obj["kind"] == "Job" else 63
        assert len(obj["metadata"]["name"]) <= limit
    assert {o["metadata"]["name"] for o in objects} == {o["metadata"]["name"] for o in render(variant_specs()["long-name"])}
    assert rollout(objects)["metadata"]["labels"]["thicket.dev/sweep"] == "a" * 63


def test_too_many_indexes_for_one_job_is_a_clear_error():
    data = copy.deepcopy(BASE)
    data["tasks"] = {"env": "textcraft", "start": 0, "stop": 200_000, "per_index": 1}
    data["cluster"] = {"max_failed_indexes": 20_000}
    with pytest.raises(BadInput, match=r"^tasks.per_index: 200000 pods"):
        render(parse_spec(data))
    # The default failure budget (5%) is capped at the 10,000 such a Job allows.
    assert rollout(render(parse_spec({**data, "cluster": {}})))["spec"]["maxFailedIndexes"] == 10_000
    data["cluster"] = {"max_failed_indexes": 1000, "parallelism": 64}
    assert rollout(render(parse_spec(data)))["spec"]["completions"] == 200_000


@pytest.mark.parametrize("start,stop,per_index", [(0, 1, 1), (0, 10, 10), (0, 11, 10), (5, 100, 7), (3, 4, 50)])
def test_completions_equal_the_number_of_task_ranges(start, stop, per_index):
    from thicket.k8s.names import index_count

    data = {**BASE, "tasks": {"env": "textcraft", "start": start, "stop": stop, "per_index": per_index}}
    spec = parse_spec(data)
    assert index_count(spec) == len(spec.tasks.index_ranges()) == rollout(render(spec))["spec"]["completions"]
