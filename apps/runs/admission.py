"""Admission of a run: every check a request passes before anything is stored (issue 41 item 4).

``admit_run`` checks (input, team, pool, worker, availability, budget) and returns a frozen
``Admission``; ``apps.runs.services.create_run`` stores exactly that (Zulip's ``check_message`` →
``do_send_messages``). A refusal raises ``RunRefused`` (audited where there is an actor and team to
name) before any row is written or any model is called.

A caller that already reached a verdict (``/v1``: the key-scoped pool resolution) hands it over
as an ``AccessProof`` instead of a bare flag. Admission skips only the check the proof vouches for
and only after asserting it is about this request: the same actor, team and pool, under the same
access version. A proof that does not match raises ``AccessProofMismatch``: a bug in the caller,
never a refusal a client could see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.db import transaction

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor
from apps.governance import selectors as gov
from apps.runs import integration
from apps.runs.models import Preset, RunSource, Strategy
from apps.workers.models import Pool

if TYPE_CHECKING:
    from apps.governance.models import Team
    from apps.workers.models import Worker

MAX_QUESTION_CHARS = 32_000


class IssuedKey(Protocol):
    """What runs reads of an API key (``apps.api.models.ApiKey``: the api app sits above runs, so
    it is named by shape). ``access_stamp`` comes with a key read per request, when it does."""

    @property
    def pk(self) -> Any: ...

    @property
    def prefix(self) -> str: ...

    @property
    def created_by_id(self) -> int | None: ...

    @property
    def team_id(self) -> int: ...


class RunRefused(Exception):
    """A request that was not accepted; nothing was stored or called. ``message`` is user-safe."""

    CODES = ("budget_exhausted", "pool_not_allowed", "pool_unavailable", "invalid")

    def __init__(self, code: str, message: str, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.retry_after_s = retry_after_s


class AccessProofMismatch(AssertionError):
    """A trust claim that is not about this request (another actor, team, pool or access version),
    or an admission not made by ``admit_run``. Raised, never returned: a caller bug."""


@dataclass(frozen=True)
class AccessProof:
    """A verdict the caller reached with a check at least as narrow as admission's own: the
    principal ``actor_id`` may start runs on ``team_id`` (``team``) and use ``pool_id``
    (``pool``), decided under the access version ``access_stamp``
    (apps.governance.access_version). ``by`` names the check, for the assertion's message."""

    actor_id: int | None
    team_id: int
    pool_id: int | None
    access_stamp: int | None
    team: bool
    pool: bool
    by: str

    @classmethod
    def from_api_key(
        cls, *, key: IssuedKey, pool: Pool | None, team_allowed: bool, pool_allowed: bool
    ) -> AccessProof:
        """The ``/v1`` verdict: ``pool`` as ``apps.api.v1.targets.resolve_model`` read it, with
        ``key_may_use`` (the key's pools within its principal's, in the same query) annotated on
        the row; ``team_allowed`` asked ``can_run_on_team(key.created_by, key.team)``. A pool claim
        the row does not carry raises: the flag is asserted against what it claims."""
        if pool_allowed and (pool is None or getattr(pool, "key_may_use", None) is not True):
            raise AccessProofMismatch(
                "pool_allowed: the pool carries no key-scoped verdict (apps.api.v1.targets.resolve_model)"
            )
        return cls(
            actor_id=key.created_by_id,
            team_id=key.team_id,
            pool_id=pool.pk if pool is not None else None,
            access_stamp=getattr(key, "access_stamp", None),
            team=team_allowed,
            pool=pool_allowed,
            by=f"api key {key.prefix}",
        )

    def check(self, *, actor: Actor, team: Team, pool: Pool | None, access_stamp: int | None) -> None:
        """Raise AccessProofMismatch unless this proof is about this request: ``pool`` is the one
        asked for (None: the team's default, which a pool verdict cannot be about)."""
        wrong = []
        actor_id = getattr(actor, "pk", None)
        if self.actor_id != actor_id:
            wrong.append(f"actor {actor_id} is not {self.actor_id}")
        if self.team_id != team.pk:
            wrong.append(f"team {team.pk} is not {self.team_id}")
        if self.pool and (pool is None or self.pool_id != pool.pk):
            wrong.append(f"pool {getattr(pool, 'pk', None)} is not {self.pool_id}")
        if self.access_stamp != access_stamp:
            # The verdict holds while the access version it was reached under is the one the
            # caches admission reads are keyed by (the request's, read with its key).
            wrong.append(f"access version {access_stamp} is not {self.access_stamp}")
        if wrong:
            raise AccessProofMismatch(f"access proof by {self.by}: " + "; ".join(wrong))


# Only admit_run seals an Admission: create_run refuses one made any other way.
_SEAL = object()


@dataclass(frozen=True)
class Admission:
    """A request that passed every check, as ``create_run`` stores it (frozen: what was checked
    is what is stored)."""

    actor: Actor
    team: Team
    pool: Pool
    worker: Worker | None
    question: str
    strategy: str
    preset: str
    source: str
    api_key: IssuedKey | None
    classification: str
    replay_messages: list[dict[str, Any]] | None
    request_id: str
    api_request: dict[str, Any] | None
    policy: integration.PolicyInForce
    access_stamp: int | None
    # Stored already claimed by this process, which executes it on the caller's thread.
    execute_here: bool
    # Not an argument: an Admission built by hand, or copied with a field replaced
    # (dataclasses.replace), is unsealed and create_run refuses it.
    seal: object = field(default=None, init=False, repr=False, compare=False)

    @property
    def sealed(self) -> bool:
        return self.seal is _SEAL


def refuse(
    *,
    actor: Actor,
    team: Team | None,
    code: str,
    message: str,
    retry_after_s: int | None = None,
    **extra: Any,
) -> RunRefused:
    """Record the refusal in the audit trail (its own transaction: there is no run to attach)."""
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.RUN_REFUSED,
            actor=actor,
            team=team,
            object_type="runs.run",
            payload={"code": code, "message": message, **extra},
        )
    return RunRefused(code, message, retry_after_s)


def _resolve_team(actor: Actor, team: Team | None, pool: Pool | None) -> Team | None:
    if team is not None:
        return team
    runnable = gov.teams_runnable_by(actor)
    if pool is not None and pool.team_id and runnable.filter(pk=pool.team_id).exists():
        return pool.team
    return runnable.order_by("slug").first()


def _valid_messages(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    )


def _checked_input(
    question: str, strategy: str, preset: str, source: str, replay_messages: list[dict[str, Any]] | None
) -> tuple[str, str]:
    """The question stripped and the preset the strategy runs with; raises RunRefused("invalid")."""
    question = (question or "").strip()
    if not question and not replay_messages:
        raise RunRefused("invalid", "The prompt is empty.")
    if len(question) > MAX_QUESTION_CHARS:
        raise RunRefused("invalid", f"The prompt is longer than {MAX_QUESTION_CHARS:,} characters.")
    if strategy not in Strategy.values:
        raise RunRefused(
            "invalid", f"Unknown strategy “{strategy}”; choose one of {', '.join(Strategy.values)}."
        )
    if strategy == Strategy.CONDUCTOR:
        if preset not in (Preset.MINI, Preset.ULTRA):
            raise RunRefused("invalid", "The conductor strategy needs the preset “mini” or “ultra”.")
    else:
        preset = Preset.NONE
    if source not in RunSource.values:
        raise RunRefused("invalid", f"Unknown source “{source}”.")
    if replay_messages is not None and not _valid_messages(replay_messages):
        raise RunRefused("invalid", "Replay messages must be a non-empty list of {role, content} objects.")
    return question, preset


def admit_run(
    *,
    actor: Actor,
    team: Team | None = None,
    pool: Pool | None = None,
    question: str,
    strategy: str = Strategy.CONDUCTOR,
    preset: str = Preset.MINI,
    worker: Worker | None = None,
    source: str = RunSource.PLAYGROUND,
    api_key: IssuedKey | None = None,
    classification: str = "",
    replay_messages: list[dict[str, Any]] | None = None,
    request_id: str = "",
    api_request: dict[str, Any] | None = None,
    proof: AccessProof | None = None,
    access_stamp: int | None = None,
    execute_here: bool = False,
) -> Admission:
    """Check a request to start a run; the Admission ``create_run`` stores. Reads, never writes
    (but the audit row of a refusal). Raises RunRefused, or AccessProofMismatch for a ``proof``
    that is not about this request.

    ``access_stamp``: the access version the caller read (apps.governance.access_version); pool
    rows and the policy in force are answered from this process's cache while it is current.
    ``execute_here``: the caller executes the run on its own thread once stored (a plain ``/v1``
    request under ``V1_INLINE_RUNS``): asserted against that setting."""
    question, preset = _checked_input(question, strategy, preset, source, replay_messages)
    if execute_here and settings.V1_INLINE_RUNS == "off":
        raise AccessProofMismatch("execute_here: this process executes no run inline (V1_INLINE_RUNS=off)")

    resolved = _resolve_team(actor, team, pool)
    if proof is not None and resolved is not None:
        # Before the verdict is used: about this actor, team, pool and access version.
        proof.check(actor=actor, team=resolved, pool=pool, access_stamp=access_stamp)
    team_vouched = proof is not None and proof.team
    if resolved is None or not (team_vouched or gov.can_run_on_team(actor, resolved)):
        raise refuse(
            actor=actor,
            team=resolved,
            code="pool_not_allowed",
            message="You may not start runs for this team.",
        )
    team = resolved
    if pool is None:
        pool = team.default_pool
    if pool is None:
        raise refuse(
            actor=actor,
            team=team,
            code="pool_not_allowed",
            message="Choose a pool: the team has no default pool.",
        )
    pool_vouched = proof is not None and proof.pool
    if not pool_vouched and not Pool.objects.visible_to(actor, "use").filter(pk=pool.pk).exists():
        raise refuse(
            actor=actor,
            team=team,
            code="pool_not_allowed",
            message=f"You may not run on the pool “{pool.slug}”.",
        )
    if worker is not None and not pool.pool_workers.filter(worker=worker).exists():
        raise RunRefused("invalid", f"The worker “{worker.slug}” is not in the pool “{pool.slug}”.")
    if strategy == Strategy.SINGLE and worker is None:
        worker = pool.default_worker
    try:
        integration.check_pool_available(pool, access_stamp)
    except integration.PoolUnavailableError as exc:
        raise refuse(
            actor=actor, team=team, code="pool_unavailable", message=str(exc), pool=pool.slug
        ) from None

    policy = integration.policy_in_force(team, access_stamp)
    try:
        integration.check_budget(team, policy)
    except integration.BudgetRefusal as exc:
        raise refuse(
            actor=actor,
            team=team,
            code="budget_exhausted",
            message=exc.message,
            retry_after_s=exc.retry_after_s,
            budget=exc.budget_name,
        ) from None
    admission = Admission(
        actor=actor,
        team=team,
        pool=pool,
        worker=worker,
        question=question,
        strategy=strategy,
        preset=preset,
        source=source,
        api_key=api_key,
        classification=classification,
        replay_messages=replay_messages,
        request_id=request_id,
        api_request=api_request,
        policy=policy,
        access_stamp=access_stamp,
        execute_here=execute_here,
    )
    object.__setattr__(admission, "seal", _SEAL)  # frozen: set once, here
    return admission
