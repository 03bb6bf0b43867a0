"""report.html links each tree's page, written beside it (relative paths that open from the
datasets folder, locally or copied elsewhere), instead of printing `thicket show` commands (issue 51)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
THICKET = str(Path(sys.executable).parent / "thicket")


def test_the_report_links_every_trees_page_beside_it(tmp_path):
    data = yaml.safe_load((ROOT / "sweeps/demo.yaml").read_text())
    data |= {"policy": {"kind": "uniform", "concurrency": 8}, "output": str(tmp_path / "out")}
    data["tasks"]["stop"] = 202
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    result = subprocess.run([THICKET, "run", str(spec), "--no-progress"], cwd=ROOT, capture_output=True, text=True,
                            timeout=180, env=os.environ)
    assert result.returncode == 0, result.stderr
    datasets = tmp_path / "out" / "demo-textcraft-mcts" / "datasets"
    report = (datasets / "report.html").read_text()
    assert "thicket show" not in report
    links = re.findall(r'<a href="([^"]+)">tree</a>', report)
    assert links == ["tree-pages/task-00000200.html", "tree-pages/task-00000201.html"]
    for task, link in zip((200, 201), links):
        assert not Path(link).is_absolute()
        assert f"<h1>Task {task}</h1>" in (datasets / link).read_text()  # thicket show's page of that tree
