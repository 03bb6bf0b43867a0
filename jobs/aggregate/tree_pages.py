"""Each committed tree's page (what `thicket show SWEEP --task N` renders) written beside
report.html, which links them by relative path: `datasets/tree-pages/task-00000200.html`.
Up to MAX_TREE_PAGES trees, the first tasks; the report names the command for the others."""

from __future__ import annotations

from collections.abc import Iterable

from thicket.aggregate.writer import WrittenFile, put_file
from thicket.show import tree_page
from thicket.storage.store import Store

MAX_TREE_PAGES = 200
FOLDER = "tree-pages/"


def tree_page_path(task: int) -> str:
    """A tree's page, relative to the datasets folder (where report.html is)."""
    return f"{FOLDER}task-{task:08d}.html"


def write_tree_pages(store: Store, tasks: Iterable[int]) -> tuple[dict[int, str], list[WrittenFile]]:
    """Write the pages of the first MAX_TREE_PAGES of `tasks`: (task -> relative path, the files)."""
    pages: dict[int, str] = {}
    files: list[WrittenFile] = []
    for task in sorted(tasks)[:MAX_TREE_PAGES]:
        path = tree_page_path(task)
        files.append(put_file(store, path, tree_page(store, task).encode()))
        pages[task] = path
    return pages, files
