"""The local pool tells the truth while llama-cpp-python is still compiling (a fresh `make demo`)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from apps.engine.providers import local
from apps.workers.engine_adapter import pool_unavailable_reason

pytestmark = pytest.mark.django_db


@pytest.fixture
def runtime_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine as it is before the background build installs llama-cpp-python."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name == "llama_cpp" else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(local, "_RUNTIME_PRESENT", False)


def test_local_pool_says_building_while_the_build_runs(
    local_pool: Any, runtime_absent: None, settings: Any, tmp_path: Path
) -> None:
    settings.LOCAL_MODEL_BUILD_MARKER = tmp_path / "local-model.building"
    settings.LOCAL_MODEL_BUILD_MARKER.write_text("12345")
    reason = pool_unavailable_reason(local_pool)
    assert reason is not None and "still building" in reason and "local-model-build.log" in reason


def test_local_pool_names_the_missing_runtime_without_a_build(
    local_pool: Any, runtime_absent: None, settings: Any, tmp_path: Path
) -> None:
    settings.LOCAL_MODEL_BUILD_MARKER = tmp_path / "absent.building"
    reason = pool_unavailable_reason(local_pool)
    assert reason is not None and "llama-cpp-python is not installed" in reason
    assert "make install-local" in reason


def test_local_pool_is_ready_once_installed(local_pool: Any) -> None:
    assert local.runtime_missing() is None
    assert pool_unavailable_reason(local_pool) is None
