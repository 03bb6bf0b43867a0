"""thicket's modules import each other without circles, counting every import a module
makes (at its top, in functions, and under TYPE_CHECKING): a circle means two modules are one
concept split in two, or a lower one that knows a higher one.

And they import down their layers, never up. From the bottom:

1. the core: every module not named below (the spec, including its `cluster` section in
   thicket.cluster_spec, the rollout, search, shards, storage, envs, aggregation, ...);
2. Kubernetes: thicket.k8s and everything under it (it renders the spec, drives the cluster);
3. the command line: thicket.cli and everything under it (the `thicket` group and its commands;
   the cluster commands it registers are thicket.k8s.commands, of layer 2).

A module may import its own layer and those below it: nothing in the core imports thicket.k8s,
and neither the core nor thicket.k8s imports thicket.cli.

Inside the core, the packages that one sweep's data flows through are ranked too (CORE_ORDER,
lowest first): the estimators, storage, envs, policies, search, shards, then what runs them
(rollout), what reads what they wrote (aggregate), and what measures or trains a policy
through all of that (evaluation, training). A ranked package imports only those ranked below
it (and modules not ranked); so aggregation, for one, never imports `thicket eval`'s code."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"thicket": ROOT / "jobs", "thicket.storage": ROOT / "storage"}
LAYERS = ("thicket.k8s", "thicket.cli")  # above the core, lowest first
CORE_ORDER = ("thicket.estimators", "thicket.storage", "thicket.envs", "thicket.policy", "thicket.search",
              "thicket.shards", "thicket.rollout", "thicket.aggregate", "thicket.evaluation", "thicket.training")


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's thicket modules it imports (`from thicket.x import y` counts x, and y
    where y is a module)."""
    graph: dict[str, set[str]] = {name: set() for name in found}
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            graph[name].update(t for t in targets if t in found and t != name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_the_oracle_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    graph = imports(modules())
    assert sum(len(targets) for targets in graph.values()) > 100  # the walk found the imports
    assert circles(graph) == []


def rank_in(packages: tuple[str, ...], module: str) -> int:
    """1, 2, ... for the packages named (a package and every module under it), 0 for the others."""
    for rank, package in enumerate(packages, start=1):
        if module == package or module.startswith(package + "."):
            return rank
    return 0


def layer(module: str) -> int:
    """0 for the core, then 1, 2, ... for LAYERS' packages."""
    return rank_in(LAYERS, module)


def core_rank(module: str) -> int:
    """1, 2, ... for CORE_ORDER's packages, 0 for every other module (not ranked)."""
    return rank_in(CORE_ORDER, module)


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer's module, as 'importer -> imported'."""
    return [f"{name} -> {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
            if layer(target) > layer(name)]


def test_the_layer_oracle_ranks_packages_not_prefixes():
    assert [layer(m) for m in ("thicket.spec", "thicket.k8s", "thicket.k8s.render", "thicket.cli",
                               "thicket.cli.spec_commands", "thicket.k8sx", "thicket.client")] == [0, 1, 1, 2, 2, 0, 0]
    assert upward({"thicket.spec": {"thicket.k8s.values"}, "thicket.k8s.render": {"thicket.spec"}}) == [
        "thicket.spec -> thicket.k8s.values"]


def test_no_module_imports_a_higher_layer():
    graph = imports(modules())
    assert {"thicket.k8s", "thicket.cli"} <= graph.keys()  # the layers are there to check
    assert any(layer(name) == 2 and layer(target) == 1 for name, targets in graph.items() for target in targets)
    assert upward(graph) == []


def upward_in_core(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher-ranked core package by a ranked one, as 'importer -> imported'."""
    return [f"{name} -> {target}" for name, targets in sorted(graph.items()) for target in sorted(targets)
            if core_rank(name) and core_rank(target) > core_rank(name)]


def test_the_core_order_oracle_catches_aggregation_importing_evaluation():
    assert upward_in_core({"thicket.aggregate.policy_figures": {"thicket.evaluation.estimate", "thicket.shards"},
                           "thicket.evaluation.run": {"thicket.aggregate", "thicket.estimators"},
                           "thicket.spec": {"thicket.aggregate"}}) == [
        "thicket.aggregate.policy_figures -> thicket.evaluation.estimate"]


def test_no_core_package_imports_a_higher_ranked_one():
    graph = imports(modules())
    assert all(any(core_rank(name) == rank for name in graph) for rank in range(1, len(CORE_ORDER) + 1))
    assert upward_in_core(graph) == []
