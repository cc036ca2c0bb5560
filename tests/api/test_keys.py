"""API keys: created once in plaintext, stored hashed, listed by prefix, revocable, audited."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management import call_command
from django.utils import timezone

from apps.api.models import ApiKey
from apps.api.services import ApiKeyInvalid, apikey_authenticate, apikey_create, apikey_revoke, parse_prefix
from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.core.logging import redact
from tests.factories.api import make_api_key

pytestmark = pytest.mark.django_db


def test_create_returns_plaintext_once_and_stores_only_the_hash(alpha: Any, team_admin: Any) -> None:
    created = apikey_create(actor=team_admin, team=alpha, name="ci")
    key = ApiKey.objects.get(pk=created.api_key.pk)
    assert created.plaintext.startswith(f"cw_{key.prefix}_")
    assert key.key_hash == hashlib.sha256(created.plaintext.encode()).hexdigest()
    secret = created.plaintext.split("_", 2)[2]
    for field in ApiKey._meta.concrete_fields:
        assert secret not in str(getattr(key, field.attname))
    # The log filter recognises the format.
    assert created.plaintext not in redact(f"using {created.plaintext} now")
    assert parse_prefix(created.plaintext) == key.prefix


def test_creation_and_revocation_are_audited_without_the_key(alpha: Any, team_admin: Any) -> None:
    created = apikey_create(actor=team_admin, team=alpha, name="ci", scopes=["runs:read"])
    apikey_revoke(actor=team_admin, api_key=created.api_key)
    audit_flush()
    events = list(AuditEvent.objects.filter(object_type="api.apikey").order_by("seq"))
    assert [e.event_type for e in events] == ["apikey.created", "apikey.revoked"]
    assert events[0].payload["prefix"] == created.api_key.prefix
    assert events[0].actor_id == team_admin.pk
    secret = created.plaintext.split("_", 2)[2]
    for event in events:
        assert secret not in str(event.payload)
        assert created.api_key.key_hash not in str(event.payload)


def test_only_team_admins_create_keys(alpha: Any, owner: Any, outsider: Any) -> None:
    for user in (owner, outsider):
        with pytest.raises(PermissionDenied):
            apikey_create(actor=user, team=alpha, name="nope")
    assert not ApiKey.objects.exists()


def test_validation_names_the_field(alpha: Any, team_admin: Any, beta: Any) -> None:
    from tests.factories.workers import PoolFactory

    foreign = PoolFactory(team=beta, slug="beta-only")
    with pytest.raises(ValidationError) as exc:
        apikey_create(
            actor=team_admin,
            team=alpha,
            name=" ",
            scopes=["root"],
            expires_at=timezone.now() - timedelta(days=1),
            allowed_pools=[foreign],
            requests_per_minute=0,
        )
    assert set(exc.value.message_dict) == {
        "name",
        "scopes",
        "expires_at",
        "allowed_pools",
        "requests_per_minute",
    }


def test_authenticate_refuses_revoked_expired_and_forged_keys(alpha: Any, team_admin: Any) -> None:
    good = make_api_key(alpha, principal=team_admin)
    assert apikey_authenticate(good.plaintext).pk == good.api_key.pk
    assert ApiKey.objects.get(pk=good.api_key.pk).last_used_at is not None

    forged = good.plaintext[:-4] + "AAAA"
    with pytest.raises(ApiKeyInvalid):
        apikey_authenticate(forged)
    with pytest.raises(ApiKeyInvalid):
        apikey_authenticate("cw_nothere_" + "x" * 40)
    with pytest.raises(ApiKeyInvalid):
        apikey_authenticate("not-a-key")

    expiring = make_api_key(alpha, principal=team_admin, expires_at=timezone.now() + timedelta(seconds=1))
    ApiKey.objects.filter(pk=expiring.api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(ApiKeyInvalid, match="expired"):
        apikey_authenticate(expiring.plaintext)

    apikey_revoke(actor=None, api_key=good.api_key)
    with pytest.raises(ApiKeyInvalid, match="revoked"):
        apikey_authenticate(good.plaintext)
    denied = AuditEvent.objects.filter(event_type="apikey.denied").values_list("payload", flat=True)
    assert {p["reason"] for p in denied} >= {"wrong_secret", "expired", "revoked"}


def test_denials_are_audited_at_most_once_a_minute_per_reason(alpha: Any, team_admin: Any) -> None:
    created = make_api_key(alpha, principal=team_admin)
    apikey_revoke(actor=None, api_key=created.api_key)
    for _ in range(5):
        with pytest.raises(ApiKeyInvalid):
            apikey_authenticate(created.plaintext)
    assert (
        AuditEvent.objects.filter(event_type="apikey.denied", object_id=str(created.api_key.pk)).count() == 1
    )


def test_key_stops_working_when_its_user_leaves_the_team(alpha: Any, team_admin: Any, owner: Any) -> None:
    from apps.governance.services import membership_remove

    created = make_api_key(alpha, principal=owner)
    membership_remove(actor=None, team=alpha, user=owner)
    with pytest.raises(ApiKeyInvalid, match="no longer in the key's team"):
        apikey_authenticate(created.plaintext)


def test_management_command_prints_the_key_once(alpha: Any, team_admin: Any) -> None:
    out, err = StringIO(), StringIO()
    call_command(
        "apikey_create", "--team", "alpha", "--name", "cron", "--scope", "runs:read", stdout=out, stderr=err
    )
    plaintext = out.getvalue().strip()
    key = ApiKey.objects.get(name="cron")
    assert plaintext.startswith(f"cw_{key.prefix}_")
    assert key.scopes == ["runs:read"]
    assert key.created_by == team_admin
    assert plaintext not in err.getvalue()
    assert apikey_authenticate(plaintext).pk == key.pk


def test_management_command_rejects_unknown_team(db: Any) -> None:
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No team"):
        call_command("apikey_create", "--team", "nope", "--name", "x", stdout=StringIO(), stderr=StringIO())
