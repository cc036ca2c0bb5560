"""Fixtures for the insights tests: a real OTLP/HTTP receiver and the runtime exporting to it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.insights import telemetry
from tests.fixtures.core import _stop, start_celery_worker, subprocess_env
from tests.insights.otlp import OtlpReceiver, otlp_receiver
from tests.runtime import MODE


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    yield from otlp_receiver()


def otel_env(endpoint: str, *, capture: bool) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "conductor-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after run.finished
        telemetry.CAPTURE_ENV: "true" if capture else "false",
    }


@pytest.fixture
def traced_runtime(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, settings: Any, tmp_path: Path
) -> Iterator[Any]:
    """``traced_runtime(endpoint, capture=...)``: runs executed from now on export to ``endpoint``:
    this process's thread executor (embedded) or a Celery worker started with that environment on
    a queue of its own (distributed), so the trace crosses the process boundary."""
    procs: list[Any] = []

    def start(endpoint: str, *, capture: bool = False) -> None:
        env = otel_env(endpoint, capture=capture)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        telemetry.reset()
        if MODE == "distributed":
            queue = f"otel-{uuid.uuid4().hex[:8]}"
            settings.CELERY_RUN_QUEUE = queue
            procs.append(
                start_celery_worker(
                    tmp_path / f"celery-{queue}.log",
                    subprocess_env(**env),
                    queue=queue,
                    name=queue,
                    concurrency=2,
                )
            )

    try:
        yield start
    finally:
        for proc in procs:
            _stop(proc)
        telemetry.reset()
