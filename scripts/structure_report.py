"""Prints the structure figures issues 16 and 41 track: import cycles between modules, app pairs
that import each other, function-level imports of project code, app modules importing the project
package (``conductor_web``), parameters typed ``Any`` (and those named for a domain object), and
the largest files.

    .venv/bin/python scripts/structure_report.py [--root apps]

The functions are importable: tests/core/test_structure.py checks the same figures in CI.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

PAGES = {"views", "forms", "urls", "admin", "templatetags", "management", "apps", "api", "api_urls"}
PROJECT_PREFIXES = ("apps.", "conductor_web")


@dataclass(frozen=True)
class NestedImport:
    """A project import inside a function body: `function` is the dotted path of the enclosing
    classes and functions (``Class.method``, ``outer.inner``)."""

    module: str
    function: str
    line: int
    names: tuple[str, ...]


def module_name(path: Path, base: Path | None = None) -> str:
    """``apps/x/y.py`` -> ``apps.x.y`` (relative to `base`, default: as given)."""
    parts = list((path.relative_to(base) if base else path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    return parents


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Inside ``if TYPE_CHECKING:``: not imported at run time."""
    up = parents.get(node)
    while up is not None:
        if isinstance(up, ast.If) and "TYPE_CHECKING" in ast.unparse(up.test):
            return True
        up = parents.get(up)
    return False


def _project_imports(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, list[str]]]:
    """Every run-time import of project code, with the names it depends on."""
    parents = _parents(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # "from pkg import mod" depends on pkg.mod; "from pkg import name" resolves to pkg
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        names = [n for n in names if n.startswith(PROJECT_PREFIXES)]
        if names and not _type_checking_only(node, parents):
            yield node, names


def nested_imports(tree: ast.Module, mod: str) -> list[NestedImport]:
    """The project imports of one module that sit inside a function body."""
    parents = _parents(tree)
    found = []
    for node, names in _project_imports(tree):
        scopes: list[str] = []
        inside_function = False
        up = parents.get(node)
        while up is not None:
            if isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                scopes.append(up.name)
                inside_function = inside_function or not isinstance(up, ast.ClassDef)
            up = parents.get(up)
        if inside_function:
            found.append(NestedImport(mod, ".".join(reversed(scopes)), node.lineno, tuple(names)))
    return found


def imports_of(tree: ast.Module, mod: str) -> tuple[set[str], int]:
    """Project imports of one module, and how many of them sit inside a function."""
    found = {name for _, names in _project_imports(tree) for name in names}
    return found, len(nested_imports(tree, mod))


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "migrations" not in p.parts)


def import_graph(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (function-level imports included)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, tree in modules.items():
        names, _ = imports_of(tree, mod)
        for name in names:
            # resolve "pkg.mod.attr" to the longest known module
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != mod:
                graph[mod].add(name)
    return graph


def module_cycles(graph: dict[str, set[str]], modules: Iterable[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
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
        for w in sorted(graph.get(v, ())):
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

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10000))
    try:
        for v in sorted(modules):
            if v not in index:
                strong(v)
    finally:
        sys.setrecursionlimit(limit)
    return sccs


def parse_tree(root: Path, base: Path | None = None) -> dict[str, ast.Module]:
    """Every non-migration module under `root`, parsed, by dotted name."""
    return {module_name(p, base): ast.parse(p.read_text(), str(p)) for p in source_files(root)}


def app(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def mutual_pairs(graph: dict[str, set[str]], keep: Callable[[str], bool]) -> list[tuple[str, ...]]:
    edges = {(app(a), app(b)) for a, bs in graph.items() if keep(a) for b in bs if app(a) != app(b)}
    return sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges})


DOMAIN_PARAMS = ("actor", "run", "user", "pool", "policy")


def any_params(tree: ast.Module) -> list[str]:
    """Names of the function parameters annotated plainly ``Any`` (``typing.Any`` too)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                annotation = arg.annotation if arg is not None else None
                if annotation is not None and ast.unparse(annotation).strip("'\"") in ("Any", "typing.Any"):
                    found.append(arg.arg)
    return found


def project_package_importers(modules: dict[str, ast.Module]) -> list[str]:
    """App modules (migrations aside) that import the project package ``conductor_web``."""
    return sorted(
        mod
        for mod, tree in modules.items()
        if not mod.startswith("conductor_web")
        and any(n.startswith("conductor_web") for _, names in _project_imports(tree) for n in names)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="apps")
    parser.add_argument("--largest", type=int, default=8)
    args = parser.parse_args()
    files = source_files(Path(args.root))
    modules = parse_tree(Path(args.root))
    graph = import_graph(modules)
    sccs = module_cycles(graph, modules)
    nested_total = sum(len(nested_imports(tree, mod)) for mod, tree in modules.items())

    mutual = mutual_pairs(graph, lambda mod: True)
    # Pages (views, forms, urls, admin, template tags, commands) may read every app, and an
    # AppConfig fills the ports of the layers below it: the layer rule binds the rest.
    core = mutual_pairs(graph, lambda mod: not any(part in PAGES for part in mod.split(".")[2:]))
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
    importers = project_package_importers(modules)
    print(f"modules importing conductor_web: {len(importers)}")
    for mod in importers:
        print(f"  {mod}")
    typed_any = [name for tree in modules.values() for name in any_params(tree)]
    domain = [name for name in typed_any if name in DOMAIN_PARAMS]
    print(f"parameters typed Any: {len(typed_any)}; named {'/'.join(DOMAIN_PARAMS)}: {len(domain)}")
    for name in DOMAIN_PARAMS:
        print(f"  {name}: {domain.count(name)}")
    over = [(n, p) for n, p in sizes if n > 600]
    print(f"modules over 600 lines: {len(over)}")
    print("largest files:")
    for n, p in sizes[: max(args.largest, len(over))]:
        print(f"  {n:5d} {p}")


if __name__ == "__main__":
    main()
