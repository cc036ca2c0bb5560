"""Who else hears a run's events once the sink has stored them.

Higher layers (insights rollups, telemetry, metrics, learning) register here at app ready instead
of editing the sink. Two moments:

- ``in_transaction``: called inside the event's transaction, after the RunEvent/Step/Run rows are
  written. Use it for derived rows that must never disagree with the run (rollups). An exception
  rolls the event back, so keep these small and correct. ``register_batch`` hears the whole
  batch of a step boundary at once, so what its events add to the same row is one write.
- ``after_commit``: called once the transaction committed. Use it for side effects that must
  never slow or break a run (span export, metric counters): exceptions are logged and swallowed.

``RunEventView`` carries what the sink already knows, so observers need no extra query for the
common fields.

One event is a decision, not a notice: ``run.awaiting_approval`` pauses the run for an approver.
Its handler (``apps.runs.approvals.approval_requested``, above the sink) is set at app ready with
``register_plan_hold`` and runs in the sink's transaction, before the observers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunEventView:
    run_id: UUID
    team_id: int
    policy_version_id: int | None
    event: dict[str, Any]  # the engine event as stored: type, seq, ts, data
    pool_id: int | None = None
    strategy: str = ""
    team_slug: str = ""  # when the sink knows it (the run's team was loaded): no read per event
    # What the sink knows from the run's execution, so observers need no read per event (#15):
    team: Any = None  # the run's Team row, read-only
    access_stamp: int | None = None  # the access version read with the run
    metadata: Mapping[str, Any] | None = None  # the request's metadata ({}: none; None: not known)
    # slug -> (pk, model name, provider kind) of the pool's workers and conductors
    workers: Mapping[str, tuple[int, str, str]] = field(default_factory=dict)

    @property
    def type(self) -> str:
        return str(self.event["type"])

    @property
    def data(self) -> dict[str, Any]:
        return self.event.get("data") or {}


RunObserver = Callable[[RunEventView], None]
RunBatchObserver = Callable[[Sequence[RunEventView]], None]

_in_transaction: dict[str, RunObserver] = {}
_in_transaction_batch: dict[str, RunBatchObserver] = {}
_after_commit: dict[str, RunObserver] = {}


def register(name: str, observer: RunObserver, *, in_transaction: bool = False) -> None:
    """Register once by name (app ready may run twice in tests; the name keeps it single)."""
    (_in_transaction if in_transaction else _after_commit)[name] = observer


def register_batch(name: str, observer: RunBatchObserver) -> None:
    """An ``in_transaction`` observer that hears a stored batch's events at once, in seq order:
    it can merge what several events add to the same rows into one write per batch."""
    _in_transaction_batch[name] = observer


def unregister(name: str) -> None:
    _in_transaction.pop(name, None)
    _in_transaction_batch.pop(name, None)
    _after_commit.pop(name, None)


def notify_in_transaction(views: Sequence[RunEventView]) -> None:
    """A batch's events, after the sink wrote all of its rows, inside its transaction."""
    for observer in list(_in_transaction.values()):
        for view in views:
            observer(view)
    for batch_observer in list(_in_transaction_batch.values()):
        batch_observer(views)


def notify_after_commit(view: RunEventView) -> None:
    for name, observer in list(_after_commit.items()):
        try:
            observer(view)
        except Exception:  # an observer must never cost a run anything
            logger.exception("run observer %s failed on %s", name, view.type)


# How many run pages watch live (insights' Prometheus gauge): the consumer reports each accepted
# and ended websocket here, and insights registers the counter at app ready.
ViewerGauge = Callable[[int], None]
_viewer_gauges: dict[str, ViewerGauge] = {}


def register_viewer_gauge(name: str, gauge: ViewerGauge) -> None:
    _viewer_gauges[name] = gauge


def viewers_changed(delta: int) -> None:
    """A run page's websocket was accepted (+1) or ended (-1)."""
    for name, gauge in list(_viewer_gauges.items()):
        try:
            gauge(delta)
        except Exception:  # a gauge must never cost a viewer its socket
            logger.exception("viewer gauge %s failed", name)


class PlanHold(Protocol):
    """Pauses a run whose plan waits for an approver (inside the sink's transaction)."""

    def __call__(
        self,
        *,
        run_id: UUID,
        team_id: int,
        policy_version_id: int | None,
        owner: str | None,
        at: datetime,
        data: dict[str, Any],
    ) -> object: ...


_plan_hold: PlanHold | None = None


def register_plan_hold(handler: PlanHold) -> None:
    global _plan_hold
    _plan_hold = handler


def plan_hold() -> PlanHold:
    """The registered plan-hold handler. None registered means apps.runs never became ready:
    fail the batch (its transaction rolls back) rather than store a held plan nothing pauses."""
    if _plan_hold is None:
        raise RuntimeError("no plan-hold handler registered (apps.runs is not ready)")
    return _plan_hold
