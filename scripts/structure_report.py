"""Prints the structure figures issue 16 tracks: import cycles between modules, app pairs that
import each other, function-level imports of project code, and the largest files.

    .venv/bin/python scripts/structure_report.py [--root apps]
"""

from __future__ import annotations

import argparse
import ast
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

PAGES = {"views", "forms", "urls", "admin", "templatetags", "management", "apps", "api", "api_urls"}


def module_name(path: Path) -> str:
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside ``if TYPE_CHECKING:``: not imported at run time."""
    up = parents.get(node)
    while up is not None:
        if isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test):
            return True
        up = parents.get(up)
    return False


def imports_of(tree: ast.Module, mod: str) -> tuple[set[str], int]:
    """Project imports of one module, and how many of them sit inside a function."""
    found: set[str] = set()
    nested = 0
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from pkg import mod" depends on pkg.mod; "from pkg import name" resolves to pkg
            names = [f"{node.module}.{a.name}" for a in node.names]
        names = [n for n in names if n.startswith(("apps.", "conductor_web"))]
        if not names or _type_checking_only(node, parents):
            continue
        found.update(names)
        up = parents.get(node)
        while up is not None and not isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef):
            up = parents.get(up)
        if up is not None:
            nested += 1
    return found, nested


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="apps")
    parser.add_argument("--largest", type=int, default=5)
    args = parser.parse_args()
    files = [p for p in Path(args.root).rglob("*.py") if "migrations" not in p.parts]
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = defaultdict(set)
    nested_total = 0
    for mod, path in modules.items():
        names, nested = imports_of(ast.parse(path.read_text()), mod)
        nested_total += nested
        for name in names:
            # resolve "pkg.mod.attr" to the longest known module
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != mod:
                graph[mod].add(name)

    # module cycles: strongly connected components with more than one module (Tarjan)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    sccs: list[list[str]] = []
    counter = 0

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10000)
    for v in list(modules):
        if v not in index:
            strong(v)

    def app(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    def mutual_pairs(keep: Callable[[str], bool]) -> list[tuple[str, ...]]:
        edges = {(app(a), app(b)) for a, bs in graph.items() if keep(a) for b in bs if app(a) != app(b)}
        return sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})

    mutual = mutual_pairs(lambda mod: True)
    # Pages (views, forms, urls, admin, template tags, commands) may read every app, and an
    # AppConfig fills the ports of the layers below it: the layer rule binds the rest.
    core = mutual_pairs(lambda mod: not any(part in PAGES for part in mod.split(".")[2:]))
    print(f"module cycles: {len(sccs)}")
    for comp in sccs:
        print("  " + " <-> ".join(comp))
    print(f"app pairs importing each other (pages included): {len(mutual)}")
    for a, b in mutual:
        print(f"  {a} <-> {b}")
    print(f"app pairs importing each other, core modules only: {len(core)}")
    for a, b in core:
        print(f"  {a} <-> {b}")
    print(f"function-level imports of project code: {nested_total}")
    sizes = sorted(((len(p.read_text().splitlines()), str(p)) for p in files), reverse=True)
    print("largest files:")
    for n, p in sizes[: args.largest]:
        print(f"  {n:5d} {p}")


if __name__ == "__main__":
    main()
