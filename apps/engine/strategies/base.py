"""What every strategy shares: the interface, and choosing among the workers the limits allow."""

from __future__ import annotations

from typing import ClassVar, Protocol, runtime_checkable

from apps.engine.executor import execute_round
from apps.engine.plan import Plan
from apps.engine.providers.base import ProviderError
from apps.engine.session import RunSession
from apps.engine.types import Limits


@runtime_checkable
class Strategy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def preset(self) -> str | None: ...

    def narrow_limits(self, limits: Limits) -> Limits:
        """The limits in force for this strategy (never looser than `limits`)."""
        ...

    def run(self, session: RunSession) -> str:
        """Plan and execute; return the answer or raise RunAborted."""
        ...


class StrategyBase:
    name: ClassVar[str] = "base"
    preset: str | None = None

    def narrow_limits(self, limits: Limits) -> Limits:
        return limits


def allowed_workers(session: RunSession) -> list[int]:
    allowed = session.pool.allowed_indices(session.limits.allowed_workers)
    if not allowed:
        raise ProviderError("No worker in the pool is allowed by the limits in force.")
    # A worker whose breaker is open is left out of the planner's list (issue 44), unless every
    # allowed one is: then the steps themselves are skipped with `circuit_open`.
    down = session.pool.down_indices(allowed)
    return [i for i in allowed if i not in down] or allowed


def default_worker(session: RunSession) -> int:
    allowed = allowed_workers(session)
    return session.pool.default_index if session.pool.default_index in allowed else allowed[0]


def strongest_worker(session: RunSession) -> int:
    # cost_rank is the only strength signal we have; ties go to the pool order (admin's choice).
    allowed = allowed_workers(session)
    return max(allowed, key=lambda i: (session.pool.workers[i].info.cost_rank, -i))


def run_fixed(session: RunSession, plan: Plan, *, tolerant: bool = False) -> str:
    session.propose(round=1, attempt=1, source="fixed", plan=plan)
    execute_round(session, plan, round=1, allow_self=False, tolerant=tolerant)
    return session.answer()
