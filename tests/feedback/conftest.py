"""Fixtures for the feedback tests: succeeded runs of alpha and beta on the fake pool."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factories.runs import RunFactory


@pytest.fixture
def alpha_run(fake_pool: Any, owner: Any, alpha: Any) -> Any:
    return RunFactory(
        team=alpha, pool=fake_pool.pool, created_by=owner, status="succeeded", answer="The answer is 42."
    )


@pytest.fixture
def beta_run(fake_pool: Any, outsider: Any, beta: Any) -> Any:
    return RunFactory(team=beta, pool=fake_pool.pool, created_by=outsider, status="succeeded", answer="x")


@pytest.fixture
def learned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Calls of the learning interface (``apps.learning.services.learn_from_feedback``)."""
    import importlib

    calls: list[tuple[Any, ...]] = []
    module = importlib.import_module("apps.learning.services")
    monkeypatch.setattr(module, "learn_from_feedback", lambda *a: calls.append(a), raising=False)
    return calls
