"""The engine's side of the circuit breaker (issue 44), with a port kept in memory: what it
records, what it skips and how a step names the reason. The database port is tested in
tests/workers/test_circuit_breaker.py over real sockets in both runtimes."""

from __future__ import annotations

from collections.abc import Iterable

from apps.engine.events import ListSink, RunStatus, StepStatus
from apps.engine.health import says_down
from apps.engine.pool import WorkerPool
from apps.engine.providers.base import (
    ProviderBadRequest,
    ProviderRateLimited,
    ProviderTimeout,
    ProviderUnavailable,
)
from apps.engine.providers.gate import ProviderRequestRefused
from apps.engine.runner import run_request

from .test_executor import PlanStrategy, finished, steps
from .workers import FnWorker


class MemoryHealth:
    def __init__(self, down: Iterable[str] = ()) -> None:
        self.down = set(down)
        self.records: list[tuple[str, bool]] = []

    def unavailable(self, keys: Iterable[str]) -> set[str]:
        return self.down & set(keys)

    def admit(self, key: str) -> bool:
        return key not in self.down

    def record(self, key: str, *, ok: bool, latency_ms: float | None) -> None:
        self.records.append((key, ok))


def _run(workers: list[FnWorker], health: MemoryHealth, plan=None):  # type: ignore[no-untyped-def]
    sink = ListSink()
    result = run_request(
        run_id="r1",
        question="q?",
        pool=WorkerPool(workers, health=health),  # type: ignore[arg-type]
        strategy=PlanStrategy(plan or steps((0, "do it", []))),
        sink=sink,
    )
    return result, sink


def test_an_open_worker_is_skipped_without_a_call_and_its_fallback_answers() -> None:
    primary = FnWorker("primary", "never", fallback_key="backup")
    backup = FnWorker("backup", "from backup")
    health = MemoryHealth(down={"primary"})
    result, sink = _run([primary, backup], health)
    assert result.status == RunStatus.SUCCEEDED and result.answer == "from backup"
    assert primary.calls == []
    fin = finished(sink)[0]
    assert fin["worker_key"] == "backup" and fin["fallback_from"] == "primary"
    assert health.records == [("backup", True)]  # the skipped worker's non-call is not a failure


def test_without_a_fallback_the_step_is_skipped_naming_circuit_open() -> None:
    primary = FnWorker("primary", "never")
    result, sink = _run([primary], MemoryHealth(down={"primary"}))
    assert primary.calls == []
    fin = finished(sink)[0]
    assert fin["status"] == StepStatus.SKIPPED.value and fin["error"].startswith("circuit_open:")
    assert result.status == RunStatus.FAILED and result.reason == "circuit_open"


def test_no_fallback_to_an_open_worker() -> None:
    primary = FnWorker("primary", fail=ProviderUnavailable("down"), fallback_key="backup")
    backup = FnWorker("backup", "from backup")
    health = MemoryHealth(down={"backup"})
    result, _sink = _run([primary, backup], health)
    assert result.status == RunStatus.FAILED
    assert backup.calls == []
    assert health.records == [("primary", False)]


def test_only_failures_that_say_down_are_recorded() -> None:
    health = MemoryHealth()
    bad = FnWorker("bad", fail=ProviderBadRequest("your request", status=400))
    _run([bad], health)
    assert health.records == []
    assert says_down(ProviderTimeout("t")) and says_down(ProviderRateLimited("r", status=429))
    assert says_down(ProviderUnavailable("u", status=503))
    assert not says_down(ProviderBadRequest("b", status=400))
    assert not says_down(ProviderRequestRefused("refused", rule="r"))
