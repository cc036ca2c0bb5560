"""Which tests depend on the runtime, and so which tests each phase of ``make test`` runs.

``make test`` (scripts/test.sh) runs two phases: *distributed* (PostgreSQL, channels-redis, Celery
over RabbitMQ) and *embedded* (SQLite, in-memory channel layer, in-process threads). A test whose
outcome cannot depend on which runtime serves it — a plan parser, a guardrail, a view whose queries
Django writes the same way on both databases — needs to pass once; running it twice only costs
time. So the embedded phase runs every test and the distributed phase runs the *runtime* tests.

A test is runtime when any of these holds (the first that does is its reason); when unsure the rule
says runtime, since running a test twice costs seconds and dropping the one run that would have
failed on PostgreSQL costs a release:

- it carries an explicit mark: ``runtime``, ``browser`` or ``distributed``;
- it uses a fixture that starts or needs a runtime part (a live server, a Celery worker, a
  browser, transactional database access, the SQL statement counter — its counts are per vendor);
- it is in a directory that tests the runtime as a whole (``RUNTIME_DIRS``);
- it is a coroutine (channels, ``database_sync_to_async`` and the event loop differ per runtime);
- its module names the runtime (channel layer, Celery, Redis, the mode, the services' URLs);
- it uses the database and its module names vendor-specific SQL (``connection``, raw SQL, row
  locks, advisory locks, LISTEN/NOTIFY, full-text search, ...) or imports a project module that
  does — those modules are found by reading the source (``vendor_modules``), not listed by hand.

Everything else runs once, in the embedded phase. ``scripts/phase_coverage.py`` proves that every
collected test runs in at least one phase and prints the counts and the reasons.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUNTIME_MARKS = ("runtime", "browser", "distributed")

RUNTIME_FIXTURES = frozenset(
    {
        "daphne_server",
        "live_server",
        "celery_worker",
        "runtime_workers",
        "browser",
        "browser_page",
        "login",
        "transactional_db",
        "django_db_serialized_rollback",
        "django_db_reset_sequences",
        "queries",
        "django_assert_num_queries",
        "django_assert_max_num_queries",
        "django_capture_on_commit_callbacks",
    }
)

# Whole directories whose subject is the runtime itself: faults injected into the services, the
# compatibility runs through the SDKs against a live server.
RUNTIME_DIRS = ("tests/compat/", "tests/faults/")

# A module that names any of these is about the runtime, database or not.
RUNTIME_SOURCE = re.compile(
    r"channel_layer|channels\.|WebsocketCommunicator|ApplicationCommunicator|celery|Celery|redis|Redis"
    r"|tests\.runtime|\bMODE\b|DATABASE_URL|REDIS_URL|CELERY_BROKER_URL|describe_mode|subprocess_env"
    r"|start_daphne|start_celery_worker|daphne"
)

# In a module that uses the database, any of these means its SQL (or its behaviour under
# concurrency) differs by vendor.
VENDOR_SOURCE = re.compile(
    r"\bconnection\b|connections\[|\bvendor\b|db_vendor|postgres|sqlite|psycopg|select_for_update"
    r"|skip_locked|nowait|advisory|LISTEN|NOTIFY|pg_notify|contrib\.postgres|Search(Vector|Query|Rank)"
    r"|RawSQL|\.raw\(|\.extra\(|cursor\(|execute\(|on_commit|atomic|isolation|Thread\(|ThreadPool"
    r"|concurrent\.futures|threading"
)

# Project code with a vendor branch or vendor-specific SQL.
VENDOR_CODE = re.compile(
    r"\.vendor\b|select_for_update|skip_locked|pg_advisory|\bLISTEN\b|\bNOTIFY\b|pg_notify"
    r"|contrib\.postgres|Search(Vector|Query|Rank)|RawSQL|\.raw\(|\.extra\(|cursor\(\)|psycopg"
)
CODE_PACKAGES = ("apps", "conductor_web")


@dataclass(frozen=True)
class Phase:
    name: str
    runtime_only: bool  # run only the runtime tests
    slow: bool  # run the local-model (``slow``) tests


# The order make test runs them in. The local-model tests exercise llama-cpp, not the runtime:
# they run once, in the embedded phase (where the local model is the worker).
PHASES = {
    "distributed": Phase("distributed", runtime_only=True, slow=False),
    "embedded": Phase("embedded", runtime_only=False, slow=True),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


@functools.cache
def vendor_modules() -> frozenset[str]:
    """Dotted names of the project modules (migrations aside) whose SQL differs by vendor."""
    found = set()
    for package in CODE_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            if VENDOR_CODE.search(path.read_text(encoding="utf-8")):
                found.add(_module_name(path))
    return frozenset(found)


def _imported(tree: ast.AST) -> set[str]:
    """Every module a test module imports, ``from a.b import c`` counting as ``a.b`` and ``a.b.c``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@dataclass(frozen=True)
class ModuleFacts:
    runtime_words: str | None  # the first runtime word the module names
    vendor_words: str | None  # the first vendor-SQL word
    vendor_import: str | None  # the first vendor-specific project module it imports


@functools.cache
def module_facts(path: Path) -> ModuleFacts:
    source = path.read_text(encoding="utf-8")
    runtime = RUNTIME_SOURCE.search(source)
    vendor = VENDOR_SOURCE.search(source)
    imports = sorted(_imported(ast.parse(source)) & vendor_modules())
    return ModuleFacts(
        runtime.group(0) if runtime else None,
        vendor.group(0) if vendor else None,
        imports[0] if imports else None,
    )


def _uses_db(item: pytest.Item, fixtures: Iterable[str]) -> bool:
    return item.get_closest_marker("django_db") is not None or bool(
        {"db", "transactional_db"} & set(fixtures)
    )


def runtime_reason(item: pytest.Item) -> str | None:
    """Why ``item`` depends on the runtime (and so runs in both phases), or None."""
    for mark in RUNTIME_MARKS:
        if item.get_closest_marker(mark):
            return f"mark:{mark}"
    fixtures = list(getattr(item, "fixturenames", ()))
    used = sorted(RUNTIME_FIXTURES.intersection(fixtures))
    if used:
        return f"fixture:{used[0]}"
    db_mark = item.get_closest_marker("django_db")
    if db_mark is not None and (
        db_mark.kwargs.get("transaction") or db_mark.kwargs.get("serialized_rollback")
    ):
        return "fixture:transactional_db"
    path = Path(str(item.path))
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.as_posix()
    for directory in RUNTIME_DIRS:
        if rel.startswith(directory):
            return f"dir:{directory}"
    function = getattr(item, "function", None)
    if function is not None and inspect.iscoroutinefunction(function):
        return "async"
    if path.suffix != ".py":
        return "not a python module"  # nothing to read: err on the side of both phases
    facts = module_facts(path)
    if facts.runtime_words:
        return f"names:{facts.runtime_words}"
    if _uses_db(item, fixtures):
        if facts.vendor_words:
            return f"db+names:{facts.vendor_words}"
        if facts.vendor_import:
            return f"db+imports:{facts.vendor_import}"
    return None


def current_phase(name: str | None) -> Phase | None:
    if not name:
        return None
    if name not in PHASES:
        raise pytest.UsageError(f"CONDUCTOR_PHASE={name!r}: expected one of {', '.join(PHASES)}")
    return PHASES[name]


def selected(item: pytest.Item, phase: Phase) -> bool:
    """Whether ``phase`` runs ``item``."""
    if not phase.slow and item.get_closest_marker("slow"):
        return False
    return not phase.runtime_only or runtime_reason(item) is not None
