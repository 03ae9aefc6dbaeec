"""The package's shape: wings that import only downwards, and no import cycles.

The wing order is the reading order of a trace's journey (the README's code map and each wing's
`__init__`): a wing may import any wing to its left, never one to its right. Lazy imports inside functions
count too: they are still a dependency, only a later one.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "linker"
WINGS = ["model", "read", "link", "plan", "write", "schedule", "pipeline", "sim", "batch", "cli"]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path) -> set[str]:
    """Every ``linker`` module or package named by an import statement anywhere in the file."""
    found: set[str] = set()
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {name for name in found if name == "linker" or name.startswith("linker.")}


def wing_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in PACKAGE.rglob("*.py")}


def test_the_top_level_holds_wings_and_the_command_only():
    loose = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py"}
    assert loose <= {"__init__.py", "cli.py", "pipeline.py"}, loose
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= set(WINGS), folders
    for folder in folders:
        init = PACKAGE / folder / "__init__.py"
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), f"{folder}/__init__.py has no map"


def test_no_wing_imports_one_to_its_right():
    modules = all_modules()
    upward = []
    for name, path in modules.items():
        here = wing_of(name)
        if here is None:
            continue
        for target in imported_modules(path):
            there = wing_of(target)
            if there in WINGS and there != here and WINGS.index(there) > WINGS.index(here):
                upward.append(f"{name} -> {target}")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_cycles():
    modules = all_modules()
    graph = {name: {t for t in imported_modules(path) if t in modules and t != name} for name, path in modules.items()}
    # A package's __init__ importing its own modules is how a map re-exports; a module importing its
    # own package's __init__ is not a cycle worth naming, so edges into a package are dropped.
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    graph = {name: {t for t in targets if t not in packages} for name, targets in graph.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, trail: list[str]) -> bool:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle.extend(trail[trail.index(nxt):] + [node, nxt] if nxt in trail else [node, nxt])
                return True
            if nxt not in state and visit(nxt, trail + [node]):
                return True
        state[node] = 2
        return False

    for start in sorted(graph):
        if start not in state and visit(start, []):
            break
    assert not cycle, " -> ".join(cycle)
