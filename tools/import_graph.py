"""The import graph of ``setl/``: print every import cycle and exit 1 if there is one.

setl's modules stand on floors (model and errors, config, stage contracts, connectors, pipeline
assembly, scheduler, node, CLI) and import only from their own floor or below. This script reads
every module under ``setl/`` with :mod:`ast`, without importing anything, and draws an arrow
A -> B for each import of module B in module A:

- every import counts: at module level, inside functions and methods, and under
  ``if TYPE_CHECKING:``. A function-level import that reaches up is a cycle in disguise, and a
  type-only one still ties the lower module to the upper for a reader and for mypy;
- ``from pkg import name`` points at ``pkg.name`` when that is a module, otherwise at ``pkg``;
- importing ``a.b.c`` points at ``a.b.c`` alone: the implicit import of the parent packages'
  ``__init__`` is not an arrow, so a package may re-export its submodules without every
  submodule appearing to import its siblings;
- imports made by ``importlib`` or ``__import__`` (entry-point loading) are not seen.

Usage: ``python3 tools/import_graph.py [--root DIR] [--edges]``. ``--edges`` prints every
arrow, one ``A -> B`` a line, before the cycles.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "setl"


def module_names(root: Path) -> dict[str, Path]:
    """Map each dotted module name under ``root/setl`` to its file."""
    names: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imported(
    module: str, is_package: bool, tree: ast.AST, names: dict[str, Path]
) -> Iterator[tuple[str, int]]:
    """Yield (module, line) for every import in ``tree`` of a module in ``names``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                submodule = f"{prefix}.{alias.name}"
                yield (submodule if submodule in names else prefix), node.lineno


def edges(root: Path) -> dict[str, dict[str, int]]:
    """Return ``{importer: {imported: first line}}`` between modules of the package."""
    names = module_names(root)
    graph: dict[str, dict[str, int]] = {name: {} for name in names}
    for name, path in names.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for target, line in _imported(name, path.name == "__init__.py", tree, names):
            if target in names and target != name:
                graph[name].setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Return the strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        # Iterative depth-first search: the graph may be deep enough to hit the recursion limit.
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    """Print the cycles of ``setl/`` (and with ``--edges`` every arrow); 1 if any cycle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--edges", action="store_true", help="print every arrow first")
    args = parser.parse_args(argv)
    graph = edges(args.root)
    if args.edges:
        for name in sorted(graph):
            for target, line in sorted(graph[name].items()):
                print(f"{name} -> {target}  (line {line})")
    found = cycles(graph)
    for number, component in enumerate(found, 1):
        members = set(component)
        print(f"cycle {number}: {len(component)} modules")
        for name in component:
            for target, line in sorted(graph[name].items()):
                if target in members:
                    print(f"  {name} -> {target}  (line {line})")
    if found:
        return 1
    print(f"no import cycle among {len(graph)} modules of {PACKAGE}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
