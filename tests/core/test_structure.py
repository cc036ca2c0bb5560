"""Issue #16: no import circle between project modules, and no function-level import of project
code used to dodge one. A static (AST) check with the functions of scripts/structure_report.py:
no Django, no database, no timing.

A new function-level import fails `test_function_level_imports_are_listed`. Hoist it to the top
of its module. If that makes a circle, the lower module is calling up: give it a port (a protocol
or a registry filled in the higher app's ``AppConfig.ready()``; docs/architecture.md, "Ports").
Only the cases below stay inside a function, each with its reason.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("apps", "conductor_web")


def _load_report() -> ModuleType:
    name = "structure_report"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / "structure_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


report = _load_report()

READY = "AppConfig.ready(): Django's place for imports that need the app registry (models, receivers)"
EGRESS_CLIENT = "the egress-checked httpx2 client (_egress_http) loads with the first SDK worker"
PROVIDER_SDK = "a provider SDK (openai, anthropic) loads only when a worker of its kind is built"
APPS_PY = "apps.py is imported while the app registry loads: a models import at its top would fail"

# (module, function) -> why the import stays inside the function.
ALLOWED: dict[tuple[str, str], str] = {
    ("apps.api.apps", "ApiConfig.ready"): READY,
    ("apps.audit.apps", "AuditConfig.ready"): READY,
    ("apps.audit.apps", "_start_in_worker"): f"a Celery signal receiver connected in ready(); {APPS_PY}",
    ("apps.experiments.apps", "ExperimentsConfig.ready"): READY,
    ("apps.feedback.apps", "FeedbackConfig.ready"): READY,
    ("apps.governance.apps", "GovernanceConfig.ready"): READY,
    ("apps.insights.apps", "InsightsConfig.ready"): READY,
    ("apps.policies.apps", "PoliciesConfig.ready"): READY,
    ("apps.runs.apps", "RunsConfig.ready"): READY,
    ("apps.workers.apps", "WorkersConfig.ready"): READY,
    ("conductor_web.apps", "ConductorWebConfig.ready"): READY,
    # Heavy optional loads: a process that never builds an SDK worker never imports them.
    ("apps.engine.providers._http", "shared_http_client"): EGRESS_CLIENT,
    ("apps.engine.providers._http", "connection_error"): EGRESS_CLIENT,
    ("apps.engine.providers.factory", "build_worker"): PROVIDER_SDK,
}


def _project_modules() -> dict[str, ast.Module]:
    modules: dict[str, ast.Module] = {}
    for top in SCANNED:
        modules.update(report.parse_tree(ROOT / top, ROOT))
    return modules


def _nested(modules: dict[str, ast.Module]) -> list[Any]:
    return [found for mod, tree in sorted(modules.items()) for found in report.nested_imports(tree, mod)]


def _path_of(module: str) -> str:
    base = ROOT / Path(*module.split("."))
    return str((base / "__init__.py" if base.is_dir() else base.with_suffix(".py")).relative_to(ROOT))


def test_no_module_import_cycle() -> None:
    modules = {mod: tree for mod, tree in _project_modules().items() if mod.startswith("apps.")}
    cycles = report.module_cycles(report.import_graph(modules), modules)
    assert not cycles, "import cycles between modules (function-level imports count):\n" + "\n".join(
        "  " + " <-> ".join(cycle) for cycle in cycles
    )


def test_function_level_imports_are_listed() -> None:
    unlisted = [
        found for found in _nested(_project_modules()) if (found.module, found.function) not in ALLOWED
    ]
    assert not unlisted, (
        "function-level imports of project code (issue #16):\n"
        + "\n".join(
            f"  {_path_of(f.module)}:{f.line} in {f.function}(): {', '.join(f.names)}" for f in unlisted
        )
        + "\nHoist each to the top of its module. If that makes an import circle, the lower module is"
        " calling up: give it a port (a protocol or a registry filled in AppConfig.ready(); see"
        " docs/architecture.md, 'Ports'). Keep it inside only for a reason listed in ALLOWED in"
        " tests/core/test_structure.py."
    )


def test_allowed_table_has_no_stale_entries() -> None:
    present = {(found.module, found.function) for found in _nested(_project_modules())}
    stale = sorted(set(ALLOWED) - present)
    assert not stale, f"ALLOWED lists function-level imports that are gone; remove them: {stale}"


def _parse(source: str) -> ast.Module:
    return ast.parse(source)


def test_checker_reports_a_nested_import() -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from apps.audit.models import AuditEvent\n"
        "if TYPE_CHECKING:\n"
        "    from apps.runs.models import Run\n"
        "def record() -> None:\n"
        "    import json\n"
        "    from apps.audit.services import audit_record\n"
        "class Sink:\n"
        "    def publish(self) -> None:\n"
        "        if True:\n"
        "            import apps.runs.fanout\n"
    )
    found = report.nested_imports(_parse(source), "apps.fake.sink")
    assert [(f.function, f.line, f.names) for f in found] == [
        ("record", 8, ("apps.audit.services.audit_record",)),
        ("Sink.publish", 12, ("apps.runs.fanout",)),
    ]
    # and the listing test would name it: the key is not in ALLOWED
    assert all((f.module, f.function) not in ALLOWED for f in found)


def test_checker_finds_a_synthetic_cycle() -> None:
    modules = {
        "apps.fake.a": _parse("from apps.fake.b import f\n"),
        "apps.fake.b": _parse("def f() -> None:\n    from apps.fake.c import g\n"),
        "apps.fake.c": _parse("from apps.fake import a\n"),
        "apps.fake.d": _parse("from apps.fake.a import x\n"),
    }
    graph = report.import_graph(modules)
    assert report.module_cycles(graph, modules) == [["apps.fake.a", "apps.fake.b", "apps.fake.c"]]


def test_no_app_module_imports_the_project_package() -> None:
    """Issue 41: `conductor_web` is wiring (settings, urls, ASGI, Celery); apps read settings
    through django.conf and share infrastructure through `apps.core`."""
    modules = _project_modules()
    assert report.project_package_importers(modules) == []


def test_checker_reports_an_import_of_the_project_package() -> None:
    modules = {
        "apps.x.a": ast.parse("from conductor_web.compiled import execute\n"),
        "apps.x.b": ast.parse("from django.conf import settings\n"),
        "conductor_web.urls": ast.parse("from conductor_web import health\n"),
    }
    assert report.project_package_importers(modules) == ["apps.x.a"]


def test_checker_counts_parameters_typed_any() -> None:
    tree = ast.parse("def f(actor: Any, *, run: 'Any', pool: Pool, n: typing.Any, **kw: Any) -> Any: ...\n")
    assert report.any_params(tree) == ["actor", "run", "n", "kw"]


DOMAIN_ANY_LIMIT = 10  # issue 41, "Done means": at most 10 (92 when the count was first kept)


def test_few_domain_parameters_are_typed_any() -> None:
    """Issue 41: actors, runs, users, pools and policies carry their types (``apps.core.types``:
    ``Actor``, ``Viewer``; the models; a Protocol where a lower layer may not import the model)."""
    found = sorted(
        f"{_path_of(mod)}: {name}"
        for mod, tree in _project_modules().items()
        for name in report.any_params(tree)
        if name in report.DOMAIN_PARAMS
    )
    assert len(found) <= DOMAIN_ANY_LIMIT, (
        f"{len(found)} parameters named {'/'.join(report.DOMAIN_PARAMS)} are typed Any (at most "
        f"{DOMAIN_ANY_LIMIT}):\n" + "\n".join(f"  {f}" for f in found)
    )
