"""The layer rule (docs/architecture.md): every unit of the package imports only units below it.

A unit is `jobspec`, a folder of `entrypoint/` or a top module of it. Every import counts, at module level
or inside a function, `TYPE_CHECKING` blocks included: a cycle closed by a function-level import is still a
cycle. Also a script: `python tests/unit/test_layers.py` prints each unit's imports and every problem.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. A unit may import the units before it, never one after it.
ORDER = (
    "errors",
    "jobspec",
    "notices",
    "store",
    "job",
    "data",
    "training",
    "evaluation",
    "tracking",
    "report",
    "kinds",
    "context",
    "trial",
    "phases",
    "runner",
    "follower",
    "processes",
    "commands",
    "cli",
    "cli_reference",
)

# Units only these may import, whatever the order allows: phases are orchestration, run by the runner alone.
ONLY_IMPORTED_BY = {"phases": {"runner"}}


def unit_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "jobspec":
        return "jobspec"
    if parts[0] != "entrypoint" or len(parts) == 1:
        return None
    return parts[1]


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, root: Path = ROOT) -> set[str]:
    """Every module `path` imports, resolved to absolute names (`from a import b` counts as a and a.b)."""
    module, found = _module_name(path, root), set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def unit_graph(root: Path = ROOT) -> dict[str, dict[str, set[str]]]:
    """unit -> imported unit -> the files (relative) that import it."""
    graph: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for path in sorted([*root.glob("entrypoint/**/*.py"), *root.glob("jobspec/**/*.py")]):
        source = unit_of(_module_name(path, root))
        if source is None:  # entrypoint/__init__.py
            continue
        graph[source]  # every unit appears, even one that imports nothing
        for name in imports_of(path, root):
            target = unit_of(name)
            if target and target != source:
                graph[source][target].add(str(path.relative_to(root)))
    return graph


def module_graph(root: Path = ROOT) -> dict[str, dict[str, set[str]]]:
    """module -> imported module (of this package; `from a import b` resolved to the module it names)."""
    paths = {
        _module_name(path, root): path for path in [*root.glob("entrypoint/**/*.py"), *root.glob("jobspec/**/*.py")]
    }
    graph: dict[str, dict[str, set[str]]] = defaultdict(dict)
    for module, path in sorted(paths.items()):
        graph[module]
        for name in imports_of(path, root):
            parts = name.split(".")
            while parts and ".".join(parts) not in paths:
                parts.pop()
            target = ".".join(parts)
            if target and target != module:
                graph[module][target] = {str(path.relative_to(root))}
    return graph


def cycles(graph: dict[str, dict[str, set[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(unit: str) -> None:
        index[unit] = low[unit] = counter[0]
        counter[0] += 1
        stack.append(unit)
        on_stack.add(unit)
        for target in graph.get(unit, {}):
            if target not in index:
                visit(target)
                low[unit] = min(low[unit], low[target])
            elif target in on_stack:
                low[unit] = min(low[unit], index[target])
        if low[unit] == index[unit]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == unit:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for unit in sorted(graph):
        if unit not in index:
            visit(unit)
    return found


def upward(graph: dict[str, dict[str, set[str]]]) -> list[str]:
    """Every import of a unit declared later in ORDER (or of a unit ORDER does not name)."""
    rank = {unit: i for i, unit in enumerate(ORDER)}
    problems = []
    for source, targets in sorted(graph.items()):
        if source not in rank:
            problems.append(f"{source}: not in ORDER (tests/unit/test_layers.py); place it in the layers")
            continue
        for target, files in sorted(targets.items()):
            if target not in rank:
                problems.append(f"{target}: not in ORDER (imported by {source})")
            elif rank[target] > rank[source]:
                problems.append(f"{source} -> {target} points up, in {', '.join(sorted(files))}")
    return problems


def test_no_import_cycle_between_units():
    found = cycles(unit_graph())
    assert not found, f"import cycles between units: {found}"


def test_no_import_cycle_between_modules_either():
    """Within a unit too (a package's __init__ and its modules): kinds/ keeps its protocols in base.py."""
    found = cycles(module_graph())
    assert not found, f"import cycles between modules: {found}"


def test_no_import_points_up_the_layers():
    problems = upward(unit_graph())
    assert not problems, "\n".join(problems)


def test_phases_are_imported_by_the_runner_alone():
    graph = unit_graph()
    for unit, allowed in ONLY_IMPORTED_BY.items():
        importers = {source for source, targets in graph.items() if unit in targets}
        assert importers <= allowed, f"{unit} imported by {sorted(importers - allowed)}"


def test_every_unit_is_placed_and_the_order_names_only_real_units():
    graph = unit_graph()
    assert set(graph) == set(ORDER), (
        f"only in the code: {set(graph) - set(ORDER)}; only in ORDER: {set(ORDER) - set(graph)}"
    )


def test_the_check_sees_a_cycle_closed_by_a_function_level_import(tmp_path):
    for name, body in {
        "a/__init__.py": "",
        "a/x.py": "from entrypoint.b import y\n",
        "b/__init__.py": "",
        "b/y.py": "def f():\n    from entrypoint.a.x import g\n",
    }.items():
        path = tmp_path / "entrypoint" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
    graph = unit_graph(tmp_path)
    assert cycles(graph) == [["a", "b"]]
    assert any("points up" in p for p in upward({"store": {"kinds": {"x.py"}}, "kinds": {}}))


def test_relative_imports_resolve_to_their_unit(tmp_path):
    path = tmp_path / "entrypoint" / "data" / "x.py"
    path.parent.mkdir(parents=True)
    path.write_text("from ..store import base\nfrom . import y\n")
    graph = unit_graph(tmp_path)
    assert set(graph["data"]) == {"store"}


if __name__ == "__main__":
    graph = unit_graph()
    for unit in sorted(graph, key=lambda u: ORDER.index(u) if u in ORDER else len(ORDER)):
        print(f"{unit:<11} -> {', '.join(sorted(graph[unit])) or '(nothing)'}")
    problems = [f"cycle: {' <-> '.join(c)}" for c in cycles(graph)] + upward(graph)
    print("\n".join(problems) if problems else "no cycle between units, no import points up")
    sys.exit(1 if problems else 0)
