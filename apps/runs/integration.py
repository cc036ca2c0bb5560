"""The seams to apps that may land after this one (policies, the engine pool adapter).

Each function here is the one place the runs app calls another app's contract, so when a
dependency lands or changes only this module moves. Policy functions fall back to "no
governance" only while ``apps.policies`` does not provide them yet (ImportError), never on a
runtime error: a broken policy must refuse the run, not silently run it ungoverned.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from apps.engine.hooks import GovernanceHooks
    from apps.engine.pool import WorkerPool
    from apps.governance.models import Team
    from apps.workers.models import Pool

logger = logging.getLogger(__name__)


class PoolUnavailableError(Exception):
    """The pool cannot run now (disabled, a worker without a key...). ``str()`` is user-safe."""


class BudgetRefusal(Exception):
    def __init__(self, budget_name: str, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.budget_name = budget_name
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class PolicyInForce:
    effective: Any  # apps.policies EffectivePolicy, or None before the policies app exists
    version_id: int | None


def build_pool(pool: Pool) -> WorkerPool:
    """The engine pool for ``pool`` (raises PoolUnavailableError with a plain reason)."""
    from apps.workers.engine_adapter import PoolUnavailable, build_engine_pool

    if not pool.enabled:
        raise PoolUnavailableError(f"The pool “{pool.name}” is disabled.")
    try:
        return build_engine_pool(pool)
    except PoolUnavailable as exc:
        raise PoolUnavailableError(str(exc)) from None


def check_pool_available(pool: Pool) -> None:
    """Refuse a pool that cannot run (disabled, a worker without a key...) without building SDK
    clients: that costs tens of milliseconds per client and execution builds them anyway."""
    from apps.workers.engine_adapter import pool_unavailable_reason

    reason = pool_unavailable_reason(pool)
    if reason:
        raise PoolUnavailableError(reason)


def policy_in_force(team: Team) -> PolicyInForce:
    try:
        from apps.policies.services import effective_policy
    except ImportError:
        return PolicyInForce(None, None)
    effective = effective_policy(team)
    version = getattr(effective, "version", None)
    return PolicyInForce(effective, getattr(version, "pk", None))


def check_budget(team: Team, policy: PolicyInForce) -> None:
    """Raise BudgetRefusal when a hard budget of the team is spent (before any model call)."""
    if policy.effective is None:
        return
    try:
        from apps.policies.budgets import BudgetExceeded, budget_check
    except ImportError:
        return
    try:
        budget_check(team=team, effective=policy.effective)
    except BudgetExceeded as exc:
        name = getattr(exc, "budget_name", "budget")
        retry = getattr(exc, "retry_after_s", None)
        message = str(exc) or f"The team's {name} budget is exhausted."
        raise BudgetRefusal(name, message, retry) from None


def governance_hooks(team: Team, policy: PolicyInForce, run_id: str) -> GovernanceHooks:
    if policy.effective is not None:
        try:
            from apps.policies.hooks import PolicyHooks
        except ImportError:
            pass
        else:
            return PolicyHooks(effective=policy.effective, team=team, run_id=run_id)
    from apps.engine.hooks import NoGovernance

    return NoGovernance()


def engine_limits(policy: PolicyInForce, *, run_timeout_s: float) -> Any:
    """Engine limits narrowed by the policy where it says so (``effective.limits()`` if offered)."""
    from apps.engine.runner import Limits

    base = None
    if policy.effective is not None:
        to_limits = getattr(policy.effective, "engine_limits", None)
        if callable(to_limits):
            base = to_limits()
    if base is None:
        return Limits(run_timeout_s=run_timeout_s)
    from dataclasses import replace

    return replace(base, run_timeout_s=min(float(base.run_timeout_s), run_timeout_s))
