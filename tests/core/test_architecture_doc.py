"""docs/architecture.md checked against the code where it can be (issue 41 item 7): every repository
path and every project module (or name in one) it quotes exists, and the layers it draws are the
import-linter contract's, in its order, with every other package named as outside it."""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"][
    "contracts"
]
LAYERS = next(c for c in CONTRACTS if c["name"].startswith("Layers point one way"))["layers"]

QUOTED = re.findall(r"`([^`\n]+)`", DOC)
TOP = ("apps", "conductor_web", "tests", "templates", "static", "docs", "scripts", "bench", "deploy")
PATH = re.compile(rf"^(?:{'|'.join(TOP)})/[\w./<>*-]*$")
DOTTED = re.compile(r"^((?:apps|conductor_web|tests)(?:\.\w+)+)")


def _layer_names(layer: str) -> list[str]:
    return [name.strip().removeprefix("apps.") for name in layer.split("|")]


def test_every_path_the_doc_names_exists() -> None:
    paths = sorted({q for q in QUOTED if PATH.match(q)})
    assert len(paths) > 30, "the doc's paths were not found: did the quoting change?"
    # A placeholder (<app>, <area>, <thing>) stands for any name: at least one file must match.
    missing = [p for p in paths if not list(ROOT.glob(re.sub(r"<[^>]+>", "*", p).rstrip("/") or "."))]
    assert missing == []


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        base = ROOT.joinpath(*parts[:cut])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            obj = importlib.import_module(module)
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


def test_every_module_and_name_the_doc_names_exists() -> None:
    names = sorted({m.group(1) for q in QUOTED if not q.endswith(".py") and (m := DOTTED.match(q))})
    assert len(names) > 40, "the doc's module names were not found: did the quoting change?"
    assert [n for n in names if not _resolves(n)] == []


def test_the_layers_the_doc_draws_are_the_contracts() -> None:
    contract = [name for layer in LAYERS for name in _layer_names(layer)]
    # The one-line statement of the order: "`api` → `experiments` → ... → `engine`".
    line = next(line for line in DOC.splitlines() if "**Layers point one way**" in line)
    start = DOC.index(line)
    statement = DOC[start : DOC.index(".", DOC.index("`engine`", start))]
    order = [name for layer in re.findall(r"`([a-z_ |]+)`", statement) for name in _layer_names(layer)]
    assert order == contract
    # The box: one row per layer, its first word the layer's name.
    box = re.findall(r"^ │ ([a-z_]+(?: \| [a-z_]+)?) ", DOC, flags=re.MULTILINE)
    assert [name for layer in box for name in _layer_names(layer)] == contract


def test_every_package_is_in_the_contract() -> None:
    """Issue 41: no package sits outside the layers, and the doc says so."""
    contract = {name for layer in LAYERS for name in _layer_names(layer)}
    apps = {p.parent.name for p in (ROOT / "apps").glob("*/__init__.py")}
    assert apps | {"conductor_web"} == contract
    assert "**Outside the layer contract**" not in DOC
    assert "Every package is in the layer contract" in DOC


def test_the_infrastructure_package_imports_no_feature() -> None:
    """The doc's bottom package (`apps.core`) has its own contract naming every other app."""
    contract = next(c for c in CONTRACTS if c["name"] == "apps.core imports no feature")
    apps = {p.parent.name for p in (ROOT / "apps").glob("*/__init__.py")}
    forbidden = {m.removeprefix("apps.") for m in contract["forbidden_modules"]}
    assert forbidden == (apps - {"core", "engine"}) | {"conductor_web"}


PAGES = {"views", "forms", "urls", "admin", "templatetags", "management", "migrations", "apps"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _runs_modules() -> dict[str, set[str]]:
    """Each runs module's imports; a package (``execution``, ``sink``: issue 41) is one module
    importing what any of its files imports, so a split does not hide what it reaches."""
    modules: dict[str, set[str]] = {}
    for path in (ROOT / "apps" / "runs").iterdir():
        if path.name.startswith("_") or path.stem in PAGES:
            continue
        if path.suffix == ".py":
            modules[path.stem] = _imports(path)
        elif (path / "__init__.py").is_file():
            modules[path.name] = set().union(*(_imports(f) for f in path.rglob("*.py")))
    return modules


def test_the_doc_names_every_runs_module_that_reaches_workers_policies_or_learning() -> None:
    reaching = {
        name
        for name, imports in _runs_modules().items()
        if any(m.startswith(("apps.workers", "apps.policies", "apps.learning")) for m in imports)
    }
    assert {"execution", "sink"} <= reaching  # the packages are scanned
    start = DOC.index("`apps.runs.integration` is the main seam")
    seam = DOC[start : DOC.index("Inside runs", start)]
    named = set(re.findall(r"`(\w+)`", seam))
    assert "integration" in reaching
    assert reaching - {"integration"} <= named, (
        "a runs module reaching workers/policies/learning the doc omits"
    )


def test_the_doc_names_every_module_that_writes_guardian_grants() -> None:
    writers = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "apps").rglob("*.py")
        if "migrations" not in path.parts
        and re.search(r"\b(assign_perm|remove_perm)\(", path.read_text("utf-8"))
    }
    start = DOC.index("Guardian grants are written in")
    statement = DOC[start : DOC.index("Every member gets", start)]
    assert writers == set(re.findall(r"`(apps/[\w/]+\.py)`", statement))
