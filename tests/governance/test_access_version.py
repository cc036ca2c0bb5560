"""The access version (issue 15): cached access answers never outlive the change that made them
stale, however the change is made.

``/v1`` answers "may this key use this pool, run on this team, which workers, which policy" from a
per-process cache keyed by one stamp that database triggers change on every write to a table that
decides access. These tests change access the ways an administrator (or a script) can — the
services, a bulk ``UPDATE`` that sends no signal, raw SQL — and check the very next request obeys.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from guardian.shortcuts import assign_perm, remove_perm

from apps.api.models import ApiKey
from apps.feedback.models import Evaluator, Metric
from apps.governance import services as gov_services
from apps.governance.access_version import TRACKED_TABLES, AccessCache, read_stamp
from apps.governance.models import Membership
from apps.policies.models import Policy, PolicyVersion
from apps.workers.models import Pool, PoolWorker, Provider, Worker
from tests.fakes.base import FakeReply
from tests.fixtures.workers import solo_pool_of

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def solo(fake_pool: Any, alpha: Any, runtime_workers: Any) -> Any:
    fake_pool.server.responder = lambda req: FakeReply("42")
    return solo_pool_of(fake_pool, alpha)


def _ask(key: str, model: str = "solo") -> Any:
    return Client().post(
        "/v1/chat/completions",
        data=json.dumps({"model": model, "messages": [{"role": "user", "content": "What is 6*7?"}]}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )


def _ok(key: str, model: str = "solo") -> None:
    resp = _ask(key, model)
    assert resp.status_code == 200, resp.content
    assert resp.json()["choices"][0]["message"]["content"] == "42"


# --- the stamp itself ---------------------------------------------------------------------------


def _touch_each_table(alpha: Any, solo: Any, key: ApiKey, user: Any) -> dict[str, Any]:
    """One write per tracked table, each as a callable (a bulk UPDATE where possible: no signal)."""
    from django.contrib.auth.models import Group, Permission
    from guardian.models import GroupObjectPermission

    return {
        "auth_user": lambda: type(user).objects.filter(pk=user.pk).update(is_active=True),
        "auth_group": lambda: Group.objects.filter(pk=alpha.group_id).update(name=alpha.group.name),
        "auth_user_groups": lambda: user.groups.remove(alpha.group),
        "auth_permission": lambda: Permission.objects.filter(codename="run_on_team").update(name="Run"),
        "guardian_userobjectpermission": lambda: assign_perm("governance.view_team_runs", user, alpha),
        "guardian_groupobjectpermission": lambda: GroupObjectPermission.objects.filter(
            pk=GroupObjectPermission.objects.filter(group_id=alpha.group_id).values("pk")[:1]
        ).update(object_pk="0"),
        "governance_team": lambda: type(alpha).objects.filter(pk=alpha.pk).update(name="Alpha"),
        "governance_membership": lambda: Membership.objects.filter(user=user).update(role="member"),
        "workers_provider": lambda: Provider.objects.update(name="p"),
        "workers_worker": lambda: Worker.objects.update(timeout_s=19),
        "workers_pool": lambda: Pool.objects.filter(pk=solo.pk).update(name="Solo 2"),
        "workers_poolworker": lambda: PoolWorker.objects.filter(pool=solo).update(position=0),
        "api_apikey_allowed_pools": lambda: key.allowed_pools.add(solo),
        "policies_policy": lambda: Policy.objects.update_or_create(team=alpha, defaults={"name": "p"}),
        "policies_policyversion": lambda: PolicyVersion.objects.create(
            policy=Policy.objects.get(team=alpha), number=99, spec={}
        ),
        "feedback_evaluator": lambda: Evaluator.objects.create(
            team=alpha, name="e", metric=Metric.objects.filter(team=alpha).first(), kind="regex"
        ),
        "feedback_metric": lambda: Metric.objects.filter(team=alpha).update(description="d"),
    }


def test_every_tracked_table_changes_the_stamp(
    solo: Any, alpha: Any, api_key: tuple[Any, str], team_admin: Any
) -> None:
    writes = _touch_each_table(alpha, solo, api_key[0], team_admin)
    assert set(writes) == set(TRACKED_TABLES)
    unchanged = []
    for table, write in writes.items():
        before = read_stamp()
        assert before is not None
        write()
        if read_stamp() == before:
            unchanged.append(table)
    assert unchanged == []


def test_a_login_or_a_profile_edit_leaves_the_stamp_alone(solo: Any, team_admin: Any) -> None:
    """A login writes ``auth_user.last_login``: that decides no access, so it must not empty every
    process's caches nor make every open run websocket re-check (it did before migration 0004)."""
    team_admin.set_password("pw-for-login")
    team_admin.save()
    before = read_stamp()
    assert Client().login(username=team_admin.username, password="pw-for-login")
    type(team_admin).objects.filter(pk=team_admin.pk).update(first_name="Tom")
    assert read_stamp() == before
    for change in ({"is_active": False}, {"is_superuser": True}, {"password": "x"}):
        stamp = read_stamp()
        type(team_admin).objects.filter(pk=team_admin.pk).update(**change)
        assert read_stamp() != stamp, change


def test_a_rolled_back_change_leaves_a_stamp_that_is_never_seen_again(solo: Any) -> None:
    before = read_stamp()
    inside = None
    with pytest.raises(RuntimeError), transaction.atomic():
        Pool.objects.filter(pk=solo.pk).update(enabled=False)
        inside = read_stamp()
        raise RuntimeError("roll back")
    assert inside is not None and inside != before
    assert read_stamp() == before
    # The same change again gets a fresh stamp, not the rolled-back one (a counter would repeat it
    # and wake the answers cached inside the rolled-back transaction).
    Pool.objects.filter(pk=solo.pk).update(enabled=False)
    assert read_stamp() not in (before, inside)


def test_a_reset_table_still_gets_a_stamp_row(solo: Any) -> None:
    """A flushed database (tests, a restore) loses the row; the next tracked write makes it again."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM governance_accessversion")
    assert read_stamp() is None
    Worker.objects.update(timeout_s=18)
    assert read_stamp() is not None


def test_the_cache_keeps_one_generation_and_never_caches_without_a_stamp() -> None:
    cache: AccessCache[str] = AccessCache(size=2)
    cache.put(None, "q", "answer")
    assert cache.get(None, "q") is None
    cache.put(1, "q", "old")
    assert cache.get(1, "q") == "old"
    cache.put(2, "q", "new")
    assert cache.get(1, "q") is None  # the older generation went with the new stamp
    assert cache.get(2, "q") == "new"
    cache.put(2, "a", "1")
    cache.put(2, "b", "2")
    assert cache.get(2, "q") is None  # bounded


# --- the very next request obeys ----------------------------------------------------------------


def test_a_revoked_pool_grant_stops_the_next_request(solo: Any, alpha: Any, api_key: tuple[Any, str]) -> None:
    _ok(api_key[1])
    _ok(api_key[1])  # answered from the cache
    gov_services.pool_revoke(actor=None, pool=solo, team=alpha)
    resp = _ask(api_key[1])
    assert resp.status_code in (403, 404), resp.content
    assert resp.json()["error"]["param"] == "model"


def test_a_bulk_update_that_disables_the_pool_stops_the_next_request(
    solo: Any, api_key: tuple[Any, str]
) -> None:
    _ok(api_key[1])
    Pool.objects.filter(pk=solo.pk).update(enabled=False)  # no save(), no signal
    resp = _ask(api_key[1])
    assert resp.status_code == 503, resp.content
    assert resp.json()["error"]["code"] == "pool_unavailable"


def test_a_worker_disabled_by_raw_sql_stops_the_next_request(solo: Any, api_key: tuple[Any, str]) -> None:
    _ok(api_key[1])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE workers_worker SET enabled = %s WHERE slug = %s", [False, "fake-solver"])
    resp = _ask(api_key[1])
    assert resp.status_code == 503, resp.content
    assert "fake-solver" in resp.json()["error"]["message"] or "disabled" in resp.json()["error"]["message"]


def test_a_principal_removed_from_the_team_group_stops_the_next_request(
    solo: Any, alpha: Any, api_key: tuple[Any, str], team_admin: Any
) -> None:
    """Membership rows aside: the group membership that carries the team's permissions, removed
    directly (as a script or the Django admin would), is obeyed at once."""
    _ok(api_key[1])
    team_admin.groups.remove(alpha.group)
    remove_perm("governance.run_on_team", team_admin, alpha)
    resp = _ask(api_key[1])
    assert resp.status_code in (403, 404), resp.content


def test_a_key_narrowed_to_another_pool_stops_the_next_request(
    solo: Any, fake_pool: Any, api_key: tuple[Any, str]
) -> None:
    _ok(api_key[1])
    api_key[0].allowed_pools.set([fake_pool.pool])  # solo is no longer in the key's allow-list
    resp = _ask(api_key[1])
    assert resp.status_code == 403, resp.content
    assert resp.json()["error"]["code"] == "pool_not_allowed"
