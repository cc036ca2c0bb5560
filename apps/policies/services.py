"""Policy writes (draft, publish, rollback) and the effective policy of a team.

Every write: one transaction → permission check → validation → save → `audit_record` with the
diff. Published versions are immutable; a draft is the only mutable version and there is at most
one per policy (saving again updates it). `actor=None` means the system (demo seeding,
migrations) and skips the permission check; views always pass the request user.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.types import Actor, stored_user
from apps.governance.selectors import can_change_team_policy
from apps.governance.services import grant_object_perms
from apps.governance.visibility import is_platform_admin
from apps.policies.models import Policy, PolicyVersion, PolicyVersionStatus
from apps.policies.spec import (
    EffectivePolicy,
    PolicySpec,
    diff_dicts,
    merge_specs,
    parse_spec,
    spec_to_dict,
    validate_spec,
)

PLATFORM_POLICY_NAME = "Platform default"


# ------------------------------------------------------------------------------ reads used by runs


def _spec_of(version: PolicyVersion | None) -> PolicySpec | None:
    if version is None:
        return None
    spec, errors = validate_spec(version.spec)
    if errors:
        # A published version was validated on publish; failing here means the schema moved on.
        # Refuse rather than run ungoverned (run_create turns this into a refused run).
        raise ValueError(f"policy version {version.pk} no longer validates: {errors[0]}")
    return spec


def effective_policy(team: Any) -> EffectivePolicy:
    """The platform default overlaid by the team's current version (tighten, never loosen)."""
    platform = Policy.objects.filter(team__isnull=True).select_related("current_version").first()
    platform_version = platform.current_version if platform else None
    base = _spec_of(platform_version) or PolicySpec()
    team_version = None
    if team is not None:
        team_policy = Policy.objects.filter(team=team).select_related("current_version").first()
        team_version = team_policy.current_version if team_policy else None
    spec = merge_specs(base, _spec_of(team_version))
    return EffectivePolicy(
        spec=spec,
        version=team_version or platform_version,
        platform_version=platform_version,
        team_id=getattr(team, "pk", None),
    )


def policy_diff(
    v1: PolicyVersion | dict[str, Any] | None, v2: PolicyVersion | dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Leaf differences [{path, old, new}] between two versions (or raw specs), normalised
    through the schema so that an omitted field and its default compare equal."""

    def norm(v: PolicyVersion | dict[str, Any] | None) -> dict[str, Any]:
        raw = v.spec if isinstance(v, PolicyVersion) else (v or {})
        spec, _errors = validate_spec(raw)
        return spec_to_dict(spec) if spec is not None else dict(raw)

    return diff_dicts(norm(v1), norm(v2))


# ------------------------------------------------------------------------------ writes


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise PermissionDenied(message)


def _can_change(actor: Actor, policy: Policy) -> bool:
    if actor is None:
        return True
    return Policy.objects.allows(actor, "change", policy)


def _can_publish(actor: Actor, policy: Policy) -> bool:
    if actor is None:
        return True
    return Policy.objects.allows(actor, "publish", policy)


def policy_get_or_create(*, actor: Actor, team: Any | None, name: str = "") -> Policy:
    """The team's policy row (or the platform default for team=None), created on first use."""
    existing = (
        Policy.objects.filter(team=team).first()
        if team is not None
        else Policy.objects.filter(team__isnull=True).first()
    )
    if existing is not None:
        return existing
    if actor is not None:
        _require(
            is_platform_admin(actor) if team is None else can_change_team_policy(actor, team),
            "You may not create this policy.",
        )
    with transaction.atomic():
        policy = Policy.objects.create(
            team=team, name=name or (f"{team.name} policy" if team is not None else PLATFORM_POLICY_NAME)
        )
        audit_record(
            event_type=AuditEventType.POLICY_CREATED,
            actor=actor,
            team=team,
            obj=policy,
            payload={"name": policy.name},
        )
        if team is not None:
            # Members read it, configuring roles change/publish it: granted and audited here.
            grant_object_perms(team=team, obj=policy, actor=actor)
    return policy


def _latest_draft(policy: Policy) -> PolicyVersion | None:
    return policy.versions.filter(status=PolicyVersionStatus.DRAFT).order_by("-number").first()


def _next_number(policy: Policy) -> int:
    last = policy.versions.order_by("-number").values_list("number", flat=True).first()
    return (last or 0) + 1


def policy_save_draft(*, actor: Actor, policy: Policy, spec: dict[str, Any], note: str = "") -> PolicyVersion:
    """Validate `spec` and store it as the policy's draft (raises `SpecError` listing field errors)."""
    _require(_can_change(actor, policy), "You may not change this policy.")
    parsed = parse_spec(spec)
    clean = spec_to_dict(parsed)
    with transaction.atomic():
        policy = Policy.objects.select_for_update().get(pk=policy.pk)
        draft = _latest_draft(policy)
        user = stored_user(actor)
        if draft is None:
            draft = PolicyVersion.objects.create(
                policy=policy, number=_next_number(policy), spec=clean, note=note[:300], created_by=user
            )
        else:
            draft.spec, draft.note = clean, note[:300]
            draft.save(update_fields=["spec", "note"])
        audit_record(
            event_type=AuditEventType.POLICY_DRAFT_SAVED,
            actor=actor,
            team=policy.team,
            obj=draft,
            policy_version_id=draft.pk,
            payload={
                "policy_id": policy.pk,
                "version": draft.number,
                "diff": policy_diff(policy.current_version, clean),
            },
        )
    return draft


def policy_publish(*, actor: Actor, version: PolicyVersion, note: str = "") -> PolicyVersion:
    """Make a draft the policy's current version. Audited with the diff from the previous one."""
    policy = version.policy
    _require(_can_publish(actor, policy), "You may not publish this policy.")
    with transaction.atomic():
        policy = Policy.objects.select_for_update().get(pk=policy.pk)
        version = PolicyVersion.objects.select_for_update().get(pk=version.pk)
        if version.status != PolicyVersionStatus.DRAFT:
            raise ValueError(f"version {version.number} is {version.status}; only a draft can be published")
        parse_spec(version.spec)  # re-validate: drafts could predate a schema change
        previous = policy.current_version
        if previous is not None:
            PolicyVersion.objects.filter(pk=previous.pk).update(status=PolicyVersionStatus.SUPERSEDED)
        version.status = PolicyVersionStatus.PUBLISHED
        version.published_at = timezone.now()
        version.published_by = stored_user(actor)
        if note:
            version.note = note[:300]
        version.save(update_fields=["status", "published_at", "published_by", "note"])
        policy.current_version = version
        policy.save(update_fields=["current_version"])
        audit_record(
            event_type=AuditEventType.POLICY_PUBLISHED,
            actor=actor,
            team=policy.team,
            obj=version,
            policy_version_id=version.pk,
            payload={
                "policy_id": policy.pk,
                "version": version.number,
                "previous_version": previous.number if previous else None,
                "diff": policy_diff(previous, version),
            },
        )
    return version


def policy_save(
    *, actor: Actor, team: Any | None, spec: dict[str, Any], note: str = "", publish: bool = False
) -> PolicyVersion:
    """The editor's save: the policy (created on first use), its draft and — with ``publish`` —
    the draft put in force, all in ONE transaction (issue #16): a failure anywhere (an invalid
    spec, a refused publish) leaves no policy, draft or audit row half-done."""
    with transaction.atomic():
        policy = policy_get_or_create(actor=actor, team=team)
        version = policy_save_draft(actor=actor, policy=policy, spec=spec, note=note)
        if publish:
            version = policy_publish(actor=actor, version=version)
    return version


def policy_rollback(
    *, actor: Actor, policy: Policy, to_version: PolicyVersion, note: str = ""
) -> PolicyVersion:
    """Publish an old version's spec again, as a new version (history stays append-only)."""
    _require(_can_publish(actor, policy), "You may not publish this policy.")
    if to_version.policy_id != policy.pk:
        raise ValueError("that version belongs to another policy")
    if to_version.status == PolicyVersionStatus.DRAFT:
        raise ValueError("a draft was never in force; publish it instead of rolling back to it")
    with transaction.atomic():
        policy = Policy.objects.select_for_update().get(pk=policy.pk)
        previous = policy.current_version
        # An open draft would shadow the rollback; discard it (it was never in force) and say so.
        discarded = list(
            policy.versions.filter(status=PolicyVersionStatus.DRAFT).values_list("number", flat=True)
        )
        number = _next_number(policy)  # before the delete: numbers are never reused
        policy.versions.filter(status=PolicyVersionStatus.DRAFT).delete()
        user = stored_user(actor)
        new = PolicyVersion.objects.create(
            policy=policy,
            number=number,
            spec=to_version.spec,
            note=(note or f"Rollback to version {to_version.number}")[:300],
            created_by=user,
        )
        audit_record(
            event_type=AuditEventType.POLICY_ROLLED_BACK,
            actor=actor,
            team=policy.team,
            obj=new,
            policy_version_id=new.pk,
            payload={
                "policy_id": policy.pk,
                "version": new.number,
                "rolled_back_to": to_version.number,
                "previous_version": previous.number if previous else None,
                "discarded_drafts": discarded,
            },
        )
        return policy_publish(actor=actor, version=new)
