"""Team pages: members and roles managed by team admins, audited; others read or see nothing."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush
from apps.governance.models import Membership
from tests.factories.governance import UserFactory

pytestmark = pytest.mark.django_db


def test_team_list_shows_only_own_teams(client: Any, owner: Any, outsider: Any) -> None:
    client.force_login(owner)
    html = client.get(reverse("governance:team_list")).content.decode()
    assert 'data-team="alpha"' in html and 'data-team="beta"' not in html
    assert client.get(reverse("governance:team_detail", args=["beta"])).status_code == 404


def test_team_admin_manages_members(client: Any, alpha: Any, team_admin: Any, owner: Any) -> None:
    newbie = UserFactory(username="newbie")
    client.force_login(team_admin)
    resp = client.post(
        reverse("governance:member_add", args=["alpha"]), {"username": "nobody", "role": "member"}
    )
    assert resp.status_code == 400 and "No active user" in resp.content.decode()
    resp = client.post(
        reverse("governance:member_add", args=["alpha"]), {"username": "newbie", "role": "reviewer"}
    )
    assert resp.status_code == 302
    assert Membership.objects.get(team=alpha, user=newbie).role == "reviewer"
    client.post(reverse("governance:member_role", args=["alpha", owner.pk]), {"role": "policy_admin"})
    assert Membership.objects.get(team=alpha, user=owner).role == "policy_admin"
    client.post(reverse("governance:member_remove", args=["alpha", newbie.pk]))
    assert not Membership.objects.filter(team=alpha, user=newbie).exists()
    audit_flush()
    types = list(
        AuditEvent.objects.filter(actor=team_admin).order_by("seq").values_list("event_type", flat=True)
    )
    assert types == ["membership.added", "membership.changed", "membership.removed"]


def test_member_cannot_manage(client: Any, alpha: Any, owner: Any, teammate: Any) -> None:
    client.force_login(owner)
    html = client.get(reverse("governance:team_detail", args=["alpha"])).content.decode()
    assert "member-add-form" not in html
    resp = client.post(reverse("governance:member_role", args=["alpha", teammate.pk]), {"role": "admin"})
    assert resp.status_code == 403
    assert Membership.objects.get(team=alpha, user=teammate).role == "member"


def test_superuser_creates_team(client: Any, superuser: Any, owner: Any) -> None:
    client.force_login(owner)
    assert client.get(reverse("governance:team_create")).status_code == 403
    client.force_login(superuser)
    resp = client.post(reverse("governance:team_create"), {"slug": "Bad", "name": ""})
    assert resp.status_code == 400
    resp = client.post(
        reverse("governance:team_create"), {"slug": "gamma", "name": "Gamma", "retention_days": 30}
    )
    assert resp.status_code == 302


def test_default_pool_form(client: Any, alpha: Any, team_admin: Any, fake_pool: Any) -> None:
    client.force_login(team_admin)
    resp = client.post(reverse("governance:default_pool", args=["alpha"]), {"pool": ""})
    assert resp.status_code == 302
    alpha.refresh_from_db()
    assert alpha.default_pool is None
    resp = client.post(reverse("governance:default_pool", args=["alpha"]), {"pool": 99999})
    assert resp.status_code == 400
