"""The learned router's writes: route a run, learn from feedback or experiments, and the router's
lifecycle (snapshot, freeze, rollback, reset). Each is one transaction with its audit event.

Runs sit above this app: `apps.runs.execution.build_run_strategy` calls `learned_strategy` with
the run's facts; feedback (apps.feedback, above runs) calls `learn_from_feedback`. Nothing here
imports runs: the run's cost and latency are read through `django.apps.apps.get_model`.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, cast
from uuid import UUID

from django.apps import apps as django_apps
from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, User
from apps.engine.pool import WorkerPool
from apps.engine.strategies import build_strategy
from apps.governance.models import Team
from apps.learning.arms import candidate_arms
from apps.learning.bandit import Arm, Bandit, choose, exploration_rate, reward_of
from apps.learning.features import Context, context_of
from apps.learning.models import Decision, Router
from apps.policies.services import effective_policy
from apps.policies.spec import EffectivePolicy, Learning

logger = logging.getLogger(__name__)

DEFAULT_METRIC = "helpful"
SNAPSHOT_EVERY = 50  # learning steps between two automatic snapshots of the live router
LINEAGE_BREAKS = ("rollback", "reset")  # feedback older than these does not teach the new router


class NoArmAvailable(Exception):
    """The policy leaves no arm for this request. ``str()`` names the rules (user-safe)."""

    user_safe = True  # execution shows str() to the user


class RouterError(ValueError):
    """A lifecycle request that cannot be done (unknown version...). ``str()`` is user-safe."""


def metric_of(learning: Learning) -> str:
    return learning.metric or DEFAULT_METRIC


# --- the live router ---------------------------------------------------------------------------


def live_router(team_id: int, *, lock: bool = False) -> Router:
    """The team's live router (the newest version), created empty on first use."""
    qs = Router.objects.filter(team_id=team_id).order_by("-version")
    if lock:
        qs = qs.select_for_update()
    router = qs.first()
    if router is None:
        router, _ = Router.objects.get_or_create(team_id=team_id, version=1, defaults={"reason": "created"})
        if lock:
            router = Router.objects.select_for_update().get(pk=router.pk)
    return router


def _state(router: Router) -> bytes | None:
    return bytes(router.state) if router.state else None


def _new_version(
    router: Router, *, reason: str, actor: Actor = None, state: bytes | None, parent: Router
) -> Router:
    top = Router.objects.filter(team_id=router.team_id).aggregate(m=Max("version"))["m"] or 0
    return Router.objects.create(
        team_id=router.team_id,
        version=top + 1,
        parent=parent,
        frozen=router.frozen,
        state=state,
        reason=reason,
        created_by=cast(User, actor) if getattr(actor, "pk", None) else None,
    )


# --- routing -----------------------------------------------------------------------------------


def _arm_dict(arm: Arm, score: float, prob: float) -> dict[str, Any]:
    return {
        "arm": arm.id,
        "kind": arm.kind,
        "worker": arm.worker,
        "preset": arm.preset,
        "score": round(score, 4),
        "prob": round(prob, 4),
        "forecast_cost_usd": str(arm.forecast_cost_usd) if arm.forecast_cost_usd is not None else None,
    }


def _arm_of(data: dict[str, Any]) -> Arm:
    cost = data.get("forecast_cost_usd")
    return Arm(
        str(data["arm"]),
        str(data.get("kind") or "single"),
        worker=data.get("worker"),
        preset=data.get("preset"),
        forecast_cost_usd=Decimal(cost) if cost is not None else None,
    )


def route(
    *,
    run_id: UUID,
    team_id: int,
    question: str,
    pool: WorkerPool,
    effective: EffectivePolicy,
    classification: str = "",
) -> Decision:
    """Choose the arm for a run and record the decision (idempotent: a run is routed once)."""
    existing = Decision.objects.filter(run_id=run_id).first()
    if existing is not None:
        return existing
    spec = effective.spec
    learning = spec.learning
    limits = effective.engine_limits()
    arms, excluded = candidate_arms(
        question=question,
        pool=pool,
        constraints=spec.constraints,
        classification=classification,
        max_steps=limits.max_steps,
    )
    if not arms:
        reasons = "; ".join(f"{e.arm}: {e.reason}" for e in excluded) or "the pool has no workers"
        raise NoArmAvailable(f"The learned router has no arm the policy allows: {reasons}.")
    context = context_of(question, team=team_id)
    with transaction.atomic():
        router = live_router(team_id, lock=True)
        with Bandit(_state(router)) as bandit:
            scores = bandit.scores(context, arms)
        # Exploration: the policy's share, only while learning is on and the router not frozen,
        # and only while this exploration keeps the team's explored share within that share.
        epsilon, tried = 0.0, None
        if learning.enabled and not router.frozen and learning.max_exploration > 0:
            decisions = Decision.objects.filter(team_id=team_id)
            epsilon, tried = exploration_rate(
                learning.max_exploration,
                decisions=decisions.count(),
                explored=decisions.filter(explored=True).count(),
                arms=arms,
                tried=lambda: _tried(team_id, context.tags),
            )
        choice = choose(
            scores,
            arms,
            epsilon=epsilon,
            # Seeded by the request alone (run ids are unique): a replay of the same request
            # explores the same way whatever database ids the team got.
            rng=random.Random(str(run_id)),
            tried=(lambda: tried) if tried is not None else None,
        )
        chosen = arms[choice.index]
        priced = [float(a.forecast_cost_usd) for a in arms if a.forecast_cost_usd]
        cap = spec.constraints.caps.max_cost_usd
        wall = spec.constraints.caps.max_wall_clock_s or float(getattr(settings, "RUN_TIMEOUT_S", 120))
        decision = Decision.objects.create(
            run_id=run_id,
            team_id=team_id,
            router=router,
            router_version=router.version,
            arms=[_arm_dict(a, s, p) for a, s, p in zip(arms, scores, choice.probs, strict=True)],
            chosen_arm=chosen.id,
            explored=choice.explored,
            context=context.to_dict(),
            context_hash=context.fingerprint(),
            cost_scale_usd=float(cap) if cap else (max(priced) if priced else None),
            latency_scale_ms=wall * 1000.0,
            metric=metric_of(learning),
        )
        audit_record(
            event_type=AuditEventType.RUN_ROUTED,
            team=Team.objects.get(pk=team_id),
            run_id=run_id,
            object_type="learning.decision",
            object_id=decision.pk,
            object_repr=f"{chosen.id} (router v{router.version})",
            policy_version_id=effective.version_id,
            payload={
                "arm": chosen.id,
                "router_version": router.version,
                "explored": choice.explored,
                "prob": round(choice.probs[choice.index], 4),
                "scores": {a.id: round(s, 4) for a, s in zip(arms, scores, strict=True)},
                "excluded": {e.arm: e.reason for e in excluded},
                "tags": list(context.tags),
            },
        )
    return decision


def strategy_for(decision: Decision) -> Any:
    """The engine strategy of the decision's chosen arm."""

    arm = decision.chosen or {"arm": decision.chosen_arm, "kind": "conductor", "preset": "mini"}
    kind = arm.get("kind")
    if kind == "single":
        return build_strategy("single", worker=arm.get("worker"))
    if kind == "conductor":
        return build_strategy("conductor", preset=str(arm.get("preset") or "mini"))
    return build_strategy(str(kind))


def learned_strategy(
    *,
    run_id: UUID,
    team_id: int,
    question: str,
    pool: WorkerPool,
    effective: EffectivePolicy,
    classification: str = "",
) -> Any:
    """For `apps.runs.execution`: route the run (once; a retried attempt reuses the decision) and
    return the engine strategy of the chosen arm."""
    decision = route(
        run_id=run_id,
        team_id=team_id,
        question=question,
        pool=pool,
        effective=effective,
        classification=classification,
    )
    return strategy_for(decision)


# --- learning ----------------------------------------------------------------------------------


def _run_measures(run_id: UUID) -> tuple[float | None, float | None]:
    """(cost USD, latency ms) of the run, read by name: runs sit above this app."""
    run_model = django_apps.get_model("runs", "Run")
    row = run_model.objects.filter(pk=run_id).values("cost_usd", "latency_ms").first()
    if row is None:
        return None, None
    cost = row["cost_usd"]
    return (float(cost) if cost is not None else None), row["latency_ms"]


def _learns_into(router: Router, decision: Decision) -> bool:
    """Feedback teaches the live router unless a rollback or reset came after the decision."""
    return not Router.objects.filter(
        team_id=router.team_id, reason__in=LINEAGE_BREAKS, created_at__gt=decision.created_at
    ).exists()


def _learn_step(router: Router, steps: Sequence[tuple[Context, list[Arm], int, float, float]]) -> None:
    with Bandit(_state(router)) as bandit:
        for context, arms, chosen, reward, prob in steps:
            bandit.learn(context, arms, chosen, reward, prob)
        router.state = bandit.to_bytes()
    router.updates += len(steps)
    router.save(update_fields=["state", "updates"])


def _maybe_snapshot(router: Router) -> Router:
    if router.updates < SNAPSHOT_EVERY:
        return router
    new = _new_version(router, reason="snapshot", state=_state(router), parent=router)
    audit_record(
        event_type=AuditEventType.ROUTER_SNAPSHOT,
        team=router.team,
        obj=new,
        object_repr=str(new),
        payload={"version": new.version, "parent_version": router.version, "updates": router.updates},
    )
    return new


def learn_from_feedback(
    run_id: UUID,
    team_id: int,
    metric: str,
    value: float,
    *,
    cost_usd: float | None = None,
    latency_ms: float | None = None,
) -> None:
    """Teach the team's router from one feedback value on a routed run.

    Does nothing for a run the router did not route, another team's run, or a metric other than
    the policy's learning metric. The first value for the decision is its reward (later ones are
    not learned again: a bandit cannot unlearn). A frozen router, or learning switched off by the
    policy, stores the reward without learning from it."""

    decision = Decision.objects.filter(run_id=run_id, team_id=team_id).first()
    if decision is None:
        return
    team = Team.objects.get(pk=team_id)
    learning = effective_policy(team).spec.learning
    if metric != metric_of(learning):
        return
    if cost_usd is None or latency_ms is None:
        run_cost, run_latency = _run_measures(run_id)
        cost_usd = run_cost if cost_usd is None else cost_usd
        latency_ms = run_latency if latency_ms is None else latency_ms
    reward = reward_of(
        float(value),
        cost_usd=cost_usd,
        latency_ms=latency_ms,
        cost_weight=learning.cost_weight or 0.0,
        latency_weight=learning.latency_weight or 0.0,
        cost_scale_usd=decision.cost_scale_usd,
        latency_scale_ms=decision.latency_scale_ms,
    )
    with transaction.atomic():
        decision = Decision.objects.select_for_update().get(pk=decision.pk)
        if decision.rewarded_at is not None:
            return
        router = live_router(team_id, lock=True)
        learned = learning.enabled and not router.frozen and _learns_into(router, decision)
        arms = [_arm_of(a) for a in decision.arms]
        chosen = next((i for i, a in enumerate(arms) if a.id == decision.chosen_arm), None)
        if learned and chosen is not None:
            prob = float(decision.arms[chosen].get("prob") or 1.0)
            _learn_step(router, [(Context.from_dict(decision.context), arms, chosen, reward, prob)])
            router = _maybe_snapshot(router)
        decision.reward = reward
        decision.rewarded_at = timezone.now()
        decision.save(update_fields=["reward", "rewarded_at"])
        audit_record(
            event_type=AuditEventType.ROUTER_REWARDED,
            team=team,
            run_id=run_id,
            object_type="learning.decision",
            object_id=decision.pk,
            object_repr=decision.chosen_arm,
            payload={
                "metric": metric,
                "value": float(value),
                "reward": round(reward, 6),
                "arm": decision.chosen_arm,
                "learned": bool(learned and chosen is not None),
                "router_version": router.version,
            },
        )


@dataclass(frozen=True)
class OfflineExample:
    """One labelled outcome from an experiment: a question, the arm that answered, its metric
    value and measurements. ``arms`` lists the arms that were available (default: just ``arm``)."""

    question: str
    arm: Arm
    value: float
    cost_usd: float | None = None
    latency_ms: float | None = None
    arms: tuple[Arm, ...] = ()


def learn_offline(
    examples: Iterable[OfflineExample],
    *,
    team_id: int,
    actor: Actor = None,
    cost_scale_usd: float | None = None,
    latency_scale_ms: float | None = None,
) -> int:
    """Teach the team's live router from experiment results (every arm was run on purpose, so
    each example is logged with probability 1). Returns the number of examples learned."""

    team = Team.objects.get(pk=team_id)
    learning = effective_policy(team).spec.learning
    steps: list[tuple[Context, list[Arm], int, float, float]] = []
    for ex in examples:
        arms = list(ex.arms) or [ex.arm]
        chosen = next((i for i, a in enumerate(arms) if a.id == ex.arm.id), None)
        if chosen is None:
            arms.append(ex.arm)
            chosen = len(arms) - 1
        reward = reward_of(
            ex.value,
            cost_usd=ex.cost_usd,
            latency_ms=ex.latency_ms,
            cost_weight=learning.cost_weight or 0.0,
            latency_weight=learning.latency_weight or 0.0,
            cost_scale_usd=cost_scale_usd,
            latency_scale_ms=latency_scale_ms,
        )
        steps.append((context_of(ex.question, team=team_id), arms, chosen, reward, 1.0))
    if not steps:
        return 0
    with transaction.atomic():
        router = live_router(team_id, lock=True)
        if router.frozen:
            raise RouterError("The router is frozen: unfreeze it before teaching it offline.")
        _learn_step(router, steps)
        _seal(router, actor=actor, team=team, reason="offline", offline_examples=len(steps))
    return len(steps)


TRIED_WINDOW = 500  # recent decisions the exploration counts arms over


def _tried(team_id: int, tags: Sequence[str]) -> dict[str, int]:
    """How often each arm was chosen for requests with these task tags (recent decisions)."""
    want = list(tags)
    counts: dict[str, int] = {}
    recent = Decision.objects.filter(team_id=team_id).order_by("-id").values_list("chosen_arm", "context")
    for arm, context in recent[:TRIED_WINDOW]:
        if isinstance(context, dict) and list(context.get("tags") or []) == want:
            counts[arm] = counts.get(arm, 0) + 1
    return counts


# --- lifecycle ---------------------------------------------------------------------------------


def router_snapshot(*, actor: Actor, team: Team) -> Router:
    """Seal the live router as a version and continue learning in a new one."""
    with transaction.atomic():
        router = live_router(team.pk, lock=True)
        return _seal(router, actor=actor, team=team, reason="snapshot", updates=router.updates)


def _seal(router: Router, *, actor: Actor, team: Team, reason: str, **payload: Any) -> Router:
    """Inside the caller's transaction: the live router becomes a version, audited."""
    new = _new_version(router, reason=reason, actor=actor, state=_state(router), parent=router)
    audit_record(
        event_type=AuditEventType.ROUTER_SNAPSHOT,
        actor=actor,
        team=team,
        obj=new,
        object_repr=str(new),
        payload={"version": new.version, "parent_version": router.version, **payload},
    )
    return new


def router_freeze(*, actor: Actor, team: Team, frozen: bool = True) -> Router:
    """Freeze (no learning, no exploration: decisions are greedy) or unfreeze the live router."""
    with transaction.atomic():
        router = live_router(team.pk, lock=True)
        if router.frozen != frozen:
            router.frozen = frozen
            router.save(update_fields=["frozen"])
            audit_record(
                event_type=AuditEventType.ROUTER_FROZEN if frozen else AuditEventType.ROUTER_UNFROZEN,
                actor=actor,
                team=team,
                obj=router,
                object_repr=str(router),
                payload={"version": router.version},
                before={"frozen": not frozen},
                after={"frozen": frozen},
            )
    return router


def router_rollback(*, actor: Actor, team: Team, version: int) -> Router:
    """Make a copy of ``version`` the live router (history is kept: a new version row)."""
    with transaction.atomic():
        router = live_router(team.pk, lock=True)
        target = Router.objects.filter(team=team, version=version).first()
        if target is None:
            raise RouterError(f"The router has no version {version}.")
        new = _new_version(router, reason="rollback", actor=actor, state=_state(target), parent=target)
        audit_record(
            event_type=AuditEventType.ROUTER_ROLLED_BACK,
            actor=actor,
            team=team,
            obj=new,
            object_repr=str(new),
            payload={"version": new.version, "restored_version": version, "previous_version": router.version},
        )
    return new


def router_reset(*, actor: Actor, team: Team) -> Router:
    """Start over: a new live version that knows nothing (earlier versions stay restorable)."""
    with transaction.atomic():
        router = live_router(team.pk, lock=True)
        new = _new_version(router, reason="reset", actor=actor, state=None, parent=router)
        audit_record(
            event_type=AuditEventType.ROUTER_RESET,
            actor=actor,
            team=team,
            obj=new,
            object_repr=str(new),
            payload={"version": new.version, "previous_version": router.version},
        )
    return new
