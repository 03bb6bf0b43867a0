"""The uniform policy asks no LLM: its worker lines count policy samples, in the words of the
run's summary ("policy samples (no LLM)"), not LLM requests (issue 51)."""

from __future__ import annotations

import re

from tests.support.harness import sweep_spec, thicket


def test_uniform_worker_lines_say_policy_samples_as_the_summary_does(tmp_path):
    result = thicket("run", str(sweep_spec(tmp_path, count=2)), "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    finished = [line for line in result.stderr.splitlines() if " finished: " in line]
    assert len(finished) == 2, result.stderr
    for line in finished:
        assert re.search(r"task \d finished: committed, \d+ nodes, \d+ policy samples \(no LLM\) in ", line), line
    assert "LLM requests" not in result.stderr + result.stdout
    assert "policy samples (no LLM)" in result.stdout  # the summary's search line
