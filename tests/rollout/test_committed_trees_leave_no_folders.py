"""A committed tree's checkpoint goes with its folder: a local sweep that ran to the end keeps no
empty `checkpoints/task-*/` folders, nor an empty `checkpoints/` (issue 51)."""

from __future__ import annotations

from tests.support.harness import NAME, sweep_spec, thicket
from thicket.rollout.checkpoint import CHECKPOINTS


def test_a_finished_local_run_leaves_no_checkpoint_folders(tmp_path):
    spec = sweep_spec(tmp_path, count=2, run={"checkpoint": {"every_calls": 4}})  # segments saved as trees grow
    result = thicket("run", str(spec), "--no-aggregate", "--output", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    sweep = tmp_path / "out" / NAME
    assert (sweep / "trees").is_dir()
    assert not (sweep / CHECKPOINTS).exists(), sorted(p.name for p in (sweep / CHECKPOINTS).iterdir())
