"""The seams between runs and the apps it depends on (policies, the engine pool adapter).

Each function here is the one place the runs app calls another app's contract, so when one
changes only this module moves. There is no ungoverned fallback: a broken policy refuses the
run rather than letting it run without its guardrails.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from apps.engine.providers.gate import OutboundGate
from apps.engine.types import Limits
from apps.policies.budgets import BudgetExceeded, budget_check
from apps.policies.hooks import PolicyHooks
from apps.policies.selectors import effective_policy_cached
from apps.workers.engine_adapter import PoolUnavailable, build_engine_pool, pool_unavailable_reason
from apps.workers.selectors import pool_rows, worker_labels

if TYPE_CHECKING:
    from apps.engine.hooks import GovernanceHooks
    from apps.engine.pool import WorkerPool
    from apps.governance.models import Team
    from apps.policies.spec import EffectivePolicy
    from apps.workers.models import Pool


class PoolUnavailableError(Exception):
    """The pool cannot run now (disabled, a worker without a key...). ``str()`` is user-safe."""

    user_safe = True  # execution shows str() to the user


class BudgetRefusal(Exception):
    def __init__(self, budget_name: str, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.budget_name = budget_name
        self.message = message
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class PolicyInForce:
    effective: EffectivePolicy
    version_id: int | None


def build_pool(pool: Pool, stamp: int | None = None, *, gate: OutboundGate) -> WorkerPool:
    """The engine pool for ``pool`` (raises PoolUnavailableError with a plain reason), every
    worker sending through ``gate`` (``run_gate``). ``stamp``: the access version read with
    ``pool`` (apps.governance.access_version)."""
    if not pool.enabled:
        raise PoolUnavailableError(f"The pool “{pool.name}” is disabled.")
    try:
        return build_engine_pool(pool, pool_rows(pool, stamp), gate=gate)
    except PoolUnavailable as exc:
        raise PoolUnavailableError(str(exc)) from None


def pool_worker_labels(pool: Pool, stamp: int | None = None) -> dict[str, tuple[int, str, str]]:
    """slug -> (pk, model, provider kind) of the pool's workers and conductors (cached rows)."""
    return worker_labels(pool_rows(pool, stamp))


def check_pool_available(pool: Pool, stamp: int | None = None) -> None:
    """Refuse a pool that cannot run (disabled, a worker without a key...) without building SDK
    clients: that costs tens of milliseconds per client and execution builds them anyway."""
    # The rows are read once per process while unchanged (pool_rows); availability (enabled,
    # keys) is judged from them on every call.
    reason = (
        pool_unavailable_reason(pool, pool_rows(pool, stamp))
        if pool.enabled
        else pool_unavailable_reason(pool)
    )
    if reason:
        raise PoolUnavailableError(reason)


def policy_in_force(team: Team, stamp: int | None = None) -> PolicyInForce:
    # Merged once per process per version pair (a run asks up to three times: create, execute,
    # the sink's hold decision); the current version ids are read fresh on every call, unless the
    # caller read the access version ``stamp`` (then no query while it is current).
    effective = effective_policy_cached(team, stamp)
    version = getattr(effective, "version", None)
    return PolicyInForce(effective, getattr(version, "pk", None))


def check_budget(team: Team, policy: PolicyInForce) -> None:
    """Raise BudgetRefusal when a hard budget of the team is spent (before any model call)."""
    try:
        budget_check(team=team, effective=policy.effective)
    except BudgetExceeded as exc:
        message = str(exc) or f"The team's {exc.budget_name} budget is exhausted."
        raise BudgetRefusal(exc.budget_name, message, exc.retry_after_s) from None


def governance_hooks(
    team: Team, policy: PolicyInForce, run_id: str, classification: str | None = None
) -> GovernanceHooks:
    """``classification``: the run's own, when the caller holds the row (None: read it)."""
    return PolicyHooks(effective=policy.effective, team=team, run_id=run_id, classification=classification)


def run_gate(hooks: GovernanceHooks) -> OutboundGate:
    """The outbound gate of one run: its own policy hooks check every provider request."""
    return OutboundGate(hooks)  # type: ignore[arg-type]  # PolicyHooks is an OutboundPolicy


def engine_limits(policy: PolicyInForce, *, run_timeout_s: float) -> Limits:
    """Engine limits narrowed by the policy, and never past the run's own deadline."""
    base = policy.effective.engine_limits()
    return replace(base, run_timeout_s=min(float(base.run_timeout_s), run_timeout_s))
