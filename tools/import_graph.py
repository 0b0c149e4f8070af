"""The import graph of ``setl/``: print every import cycle and every arrow that runs up a floor,
and exit 1 if there is one.

setl's modules stand on floors and import only from their own floor or below (`FLOORS`, from the
ground up; docs/architecture.md draws them)::

    11 entry      cli (and its cluster_cmd, repair_cmd), the public API (setl/__init__), testing (nothing in
                  setl imports it)
    10 node       node (and its node_elected, node_reload, node_runs, node_status)
     9 observe    observe (metrics, lag, the HTTP page)
     8 control    control (the actions the CLI and the HTTP control API share, and long operations)
     7 scheduler  scheduler, runtime
     6 pipeline   pipeline (assembly of the stages from the config), verify (the consistency check)
     5 connectors connectors, sources, sinks, schema, transforms, ddltask, snapshot
     4 coord      ha, meta, retry, status, liveness
     3 contracts  stages, failpoints
     2 plugins    registry, plugins, routing
     1 config     config, tls, spark, alerts
     0 ground     errors, model, reads, values, ddl, tablecopy, logs, web, binlog_events (setl's binlog event
                  values), adapters (the libraries' internals), loop_marks (a channel's marker rows)

A module's floor is that of its top-level name under ``setl`` (``setl.sinks.mysql``: ``sinks``);
a module on no floor is an error, so a new package is placed deliberately. Within a floor any
arrow is allowed as long as it closes no cycle. `ALLOWED_UP` lists the known exceptions, each
with why and what removes it.

This script reads every module under ``setl/`` with :mod:`ast`, without importing anything, and
draws an arrow A -> B for each import of module B in module A:

- every import counts: at module level, inside functions and methods, and under
  ``if TYPE_CHECKING:``. A function-level import that reaches up is a cycle in disguise, and a
  type-only one still ties the lower module to the upper for a reader and for mypy;
- ``from pkg import name`` points at ``pkg.name`` when that is a module, otherwise at ``pkg``;
- importing ``a.b.c`` points at ``a.b.c`` alone: the implicit import of the parent packages'
  ``__init__`` is not an arrow, so a package may re-export its submodules without every
  submodule appearing to import its siblings;
- imports made by ``importlib`` or ``__import__`` (entry-point loading) are not seen.

It also measures every class under ``setl/`` and reports those over `MAX_CLASS_LINES` lines (a
class that long holds more than one role: split it along them) except the ones in
`BIG_CLASSES_ALLOWED`, a list that only shrinks.

Usage: ``python3 tools/import_graph.py [--root DIR] [--edges]``. ``--edges`` prints every
arrow, one ``A -> B`` a line, before the cycles and upward arrows.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "setl"

#: The floors, from the ground up: (name, the top-level names under ``setl`` standing on it).
#: ``setl`` itself is the package ``setl/__init__.py`` (the public API).
FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ground", ("_compiled", "errors", "model", "reads", "_reads", "values", "ddl", "tablecopy", "logs", "web",
                "binlog_events", "adapters", "loop_marks")),
    ("config", ("config", "tls", "dial", "spark", "alerts")),
    ("plugins", ("registry", "plugins", "routing")),
    ("contracts", ("stages", "failpoints")),
    ("coord", ("ha", "meta", "retry", "status", "liveness")),
    ("connectors", ("connectors", "sources", "sinks", "schema", "transforms", "ddltask", "snapshot")),
    ("pipeline", ("pipeline", "verify")),
    ("scheduler", ("scheduler", "runtime")),
    ("control", ("control",)),
    ("observe", ("observe",)),
    ("node", ("node", "node_elected", "node_reload", "node_runs", "node_status")),
    ("entry", ("cli", "cluster_cmd", "repair_cmd", "setl", "testing")),
)

#: Arrows up a floor that are known and tolerated for now: (importer, imported) -> why.
ALLOWED_UP: dict[tuple[str, str], str] = {}

#: No class in ``setl/`` is longer than this many lines (its ``class`` line to its last line).
MAX_CLASS_LINES = 400

#: Classes still over `MAX_CLASS_LINES` ("module:Class") -> why. It only shrinks: a class listed
#: here that is no longer over the limit (or gone) fails the check too, so the list stays honest.
BIG_CLASSES_ALLOWED: dict[str, str] = {}


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


def floor_of(module: str) -> int | None:
    """The floor number of a dotted module name under ``setl``, or None when it is on no floor."""
    parts = module.split(".")
    area = parts[1] if len(parts) > 1 else parts[0]
    for number, (_, areas) in enumerate(FLOORS):
        if area in areas:
            return number
    return None


def upward(graph: dict[str, dict[str, int]]) -> tuple[list[tuple[str, str, int]], list[str]]:
    """The arrows from a lower floor to a higher one (importer, imported, line), those in
    `ALLOWED_UP` left out, and the modules on no floor."""
    up: list[tuple[str, str, int]] = []
    homeless = sorted(name for name in graph if floor_of(name) is None)
    for name in sorted(graph):
        low = floor_of(name)
        for target, line in sorted(graph[name].items()):
            high = floor_of(target)
            if low is None or high is None or high <= low or (name, target) in ALLOWED_UP:
                continue
            up.append((name, target, line))
    return up, homeless


def class_lengths(root: Path) -> dict[str, tuple[int, int]]:
    """Map every class under ``root/setl`` ("module:Class", nested ones "module:Outer.Inner") to
    (its first line, its length in lines)."""
    found: dict[str, tuple[int, int]] = {}
    for name, path in module_names(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))

        def visit(node: ast.AST, prefix: str, name: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                    found[f"{name}:{prefix}{child.name}"] = (child.lineno, (child.end_lineno or first) - first + 1)
                    visit(child, f"{prefix}{child.name}.")
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.If, ast.Try)):
                    visit(child, prefix)

        visit(tree, "")
    return found


def big_classes(root: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """The classes over `MAX_CLASS_LINES` not in `BIG_CLASSES_ALLOWED` (name, lines), and the
    entries of `BIG_CLASSES_ALLOWED` that are stale (the class is gone from its module, or no longer
    over; an entry whose module is not under ``root`` is not looked at)."""
    lengths = class_lengths(root)
    modules = module_names(root)
    over = sorted((name, length) for name, (_, length) in lengths.items()
                  if length > MAX_CLASS_LINES and name not in BIG_CLASSES_ALLOWED)
    stale = sorted(name for name in BIG_CLASSES_ALLOWED if name.split(":")[0] in modules
                   and (name not in lengths or lengths[name][1] <= MAX_CLASS_LINES))
    return over, stale


def main(argv: list[str] | None = None) -> int:
    """Print the cycles of ``setl/`` and its arrows up a floor (and with ``--edges`` every arrow);
    1 if there is any, or a module on no floor."""
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
    up, homeless = upward(graph)
    for name, target, line in up:
        low, high = FLOORS[floor_of(name) or 0][0], FLOORS[floor_of(target) or 0][0]
        print(f"upward: {name} ({low}) -> {target} ({high})  (line {line})")
    for name in homeless:
        print(f"no floor: {name} (add its top-level name to FLOORS in tools/import_graph.py)")
    over, stale = big_classes(args.root)
    for name, length in over:
        print(f"too long: class {name} has {length} lines (at most {MAX_CLASS_LINES}: split it along its roles)")
    for name in stale:
        print(f"stale: {name} is no longer over {MAX_CLASS_LINES} lines (remove it from BIG_CLASSES_ALLOWED)")
    if found or up or homeless or over or stale:
        return 1
    print(f"no import cycle among {len(graph)} modules of {PACKAGE}/, and no arrow up a floor")
    allowed = f" but the {len(BIG_CLASSES_ALLOWED)} listed in BIG_CLASSES_ALLOWED" if BIG_CLASSES_ALLOWED else ""
    print(f"no class over {MAX_CLASS_LINES} lines{allowed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
