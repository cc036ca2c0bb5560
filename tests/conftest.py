"""Root conftest: the runtime mode, service requirements, and fixture registration."""

from __future__ import annotations

import os

import pytest

from tests.phases import Phase, current_phase, selected
from tests.runtime import MODE, describe_mode, require_services

pytest_plugins = [
    "tests.fixtures.core",
    "tests.fakes.fixtures",
    "tests.fixtures.governance",
    "tests.fixtures.workers",
    "tests.fixtures.policies",
    "tests.fixtures.runs",
    "tests.fixtures.api",
    "tests.fixtures.audit",
    "tests.fixtures.queries",
]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return [f"conductor mode: {describe_mode()}"]


def pytest_sessionstart(session: pytest.Session) -> None:
    # Distributed mode was asked for by the environment: a missing service is an error, not a skip.
    if MODE == "distributed":
        require_services()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # make test's phase (tests/phases.py): the distributed phase runs only the runtime tests, the
    # embedded phase everything. CONDUCTOR_ONLY_RUNTIME=1 narrows any run to the runtime tests.
    phase = current_phase(os.environ.get("CONDUCTOR_PHASE"))
    if phase is None and os.environ.get("CONDUCTOR_ONLY_RUNTIME") == "1":
        phase = Phase("only-runtime", runtime_only=True, slow=True)
    # The local-model tests exercise llama-cpp, not the runtime: skipped wherever this is set.
    skip_slow = os.environ.get("CONDUCTOR_SLOW") == "skip"
    skip_distributed = pytest.mark.skip(
        reason="needs the distributed mode (PostgreSQL, Redis, Celery); runs in make test's distributed phase"
    )
    deselected = []
    kept = []
    for item in items:
        if MODE != "distributed" and item.get_closest_marker("distributed"):
            item.add_marker(skip_distributed)
        slow = skip_slow and item.get_closest_marker("slow")
        if slow or (phase is not None and not selected(item, phase)):
            deselected.append(item)
        else:
            kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    # Browser tests last: Playwright's sync API keeps an event loop on the main thread for the
    # rest of the session, which would break pytest-asyncio tests collected after them.
    kept.sort(key=lambda item: item.get_closest_marker("browser") is not None)
    items[:] = kept
