"""Policies read run history and workers through ports that apps.runs fills at ready (issue 16:
no import from policies up to runs or across to workers)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from apps.engine.types import WorkerInfo
from apps.policies import budgets, hooks, ports, selectors
from apps.runs import policy_ports


@pytest.fixture
def fake_ports() -> Iterator[list[Any]]:
    calls: list[Any] = []
    saved = (ports.run_history(), ports.workers())

    def spend(team: Any, start: datetime, end: datetime) -> Decimal:
        calls.append(("spend", team))
        return Decimal("7.5")

    def classification(run_id: str) -> str:
        calls.append(("class", run_id))
        return "confidential"

    def tokens(key: str, limit: int) -> list[int]:
        calls.append(("tokens", key, limit))
        return [10, 20]

    ports.register_run_history(
        ports.RunHistoryPort(team_spend=spend, run_classification=classification, recent_output_tokens=tokens)
    )
    ports.register_workers(
        ports.WorkersPort(worker_info=lambda w: WorkerInfo(key=w, name=w, model="m", provider="test"))
    )
    yield calls
    ports.register_run_history(saved[0])
    ports.register_workers(saved[1])


def test_runs_registers_the_ports_at_ready() -> None:
    assert ports.run_history().team_spend is policy_ports.team_spend
    assert ports.workers().worker_info is policy_ports.worker_info


def test_policies_read_run_history_and_workers_through_the_ports(fake_ports: list[Any]) -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert budgets.team_spend("team", now, now) == Decimal("7.5")
    run_id = "00000000-0000-0000-0000-000000000001"
    assert hooks.PolicyHooks._run_classification(run_id) == "confidential"
    assert hooks.worker_output_history(["a", "a"]) == {"a": 15.0}
    assert fake_ports == [
        ("spend", "team"),
        ("class", run_id),
        ("tokens", "a", hooks.FORECAST_HISTORY_STEPS),
    ]

    class Entries:
        def select_related(self, *_: str) -> Entries:
            return self

        def order_by(self, *_: str) -> list[Any]:
            return [type("E", (), {"worker": "w1"})(), type("E", (), {"worker": "w2"})()]

    pool = type("Pool", (), {"pool_workers": Entries()})()
    assert [i.key for i in selectors.pool_infos(pool)] == ["w1", "w2"]


def test_an_unregistered_port_is_a_clear_setup_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "_run_history", None)
    with pytest.raises(RuntimeError, match="run history port is not registered"):
        ports.run_history()
