"""The key read every /v1 request makes (``apps.api.selectors.key_for_prefix``), compiled once per
process (issue #15): the same key, team, principal and annotations the ORM query gave, in one
statement, whatever the principal's state."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models import Exists, OuterRef, Subquery

from apps.api.models import ApiKey
from apps.api.selectors import key_for_prefix
from apps.governance.access_version import stamp_expression
from apps.governance.models import Membership

pytestmark = pytest.mark.django_db


def _orm_read(prefix: str) -> ApiKey | None:
    """The read as a queryset (what key_for_prefix sent before it was compiled)."""
    member = Membership.objects.filter(team_id=OuterRef("team_id"), user_id=OuterRef("created_by_id"))
    return (
        ApiKey.objects.select_related("team", "created_by")
        .annotate(
            in_team=Exists(member),
            member_role=Subquery(member.values("role")[:1]),
            access_stamp=stamp_expression(),
        )
        .filter(prefix=prefix)
        .first()
    )


def _columns(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def _same_as_the_orm(prefix: str, django_assert_num_queries: Any) -> ApiKey:
    expected = _orm_read(prefix)
    assert expected is not None
    with django_assert_num_queries(1):
        key = key_for_prefix(prefix)
        assert key is not None
        # The team and principal came with the key: reading them sends nothing.
        team, creator = key.team, key.created_by
    assert _columns(key) == _columns(expected)
    assert _columns(team) == _columns(expected.team)
    if expected.created_by is None:
        assert creator is None
    else:
        assert creator is not None and _columns(creator) == _columns(expected.created_by)
    for name in ("in_team", "member_role", "access_stamp"):
        assert getattr(key, name) == getattr(expected, name), name
    assert key._state.adding is False and key._state.db == "default"
    return key


def test_the_key_its_team_principal_and_role_come_back_as_the_orm_read_them(
    api_key: tuple[Any, str], django_assert_num_queries: Any
) -> None:
    key = _same_as_the_orm(api_key[0].prefix, django_assert_num_queries)
    assert key.in_team is True and key.member_role
    assert key.created_by._key_team_role == (key.team_id, key.member_role)  # type: ignore[union-attr]
    # A saved change goes through the model as usual: the instance is a real, saved row.
    key.name = "renamed"
    key.save(update_fields=["name"])
    assert ApiKey.objects.get(pk=key.pk).name == "renamed"


def test_a_principal_who_left_the_team_or_is_gone_reads_as_the_orm_read_it(
    api_key: tuple[Any, str], django_assert_num_queries: Any
) -> None:
    stored, _ = api_key
    Membership.objects.filter(team_id=stored.team_id, user_id=stored.created_by_id).delete()
    key = _same_as_the_orm(stored.prefix, django_assert_num_queries)
    assert (key.in_team, key.member_role) == (False, None)
    stored.created_by.delete()
    key = _same_as_the_orm(stored.prefix, django_assert_num_queries)
    assert key.created_by is None and key.in_team is False


def test_an_unknown_prefix_has_no_key(api_key: tuple[Any, str]) -> None:
    assert key_for_prefix("no-such-prefix") is None
    assert key_for_prefix(api_key[0].prefix + "x") is None
    assert key_for_prefix(api_key[0].prefix) is not None
