"""factory_boy factories for governance. Teams and memberships go through the services, so the
guardian grants and audit events are the real ones."""

from __future__ import annotations

from typing import Any

import factory
from django.contrib.auth import get_user_model

from apps.governance.models import Membership, Role, Team
from apps.governance.services import membership_set, team_create

TEST_PASSWORD = "pw-for-tests-123"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    is_active = True

    @factory.post_generation
    def password(self, create: bool, extracted: str | None, **kwargs: Any) -> None:
        self.set_password(extracted or TEST_PASSWORD)
        if create:
            self.save(update_fields=["password"])


class SuperuserFactory(UserFactory):
    is_staff = True
    is_superuser = True


class TeamFactory(factory.Factory):
    """``TeamFactory(slug="alpha")`` → ``team_create(actor=None, ...)``."""

    class Meta:
        model = Team

    slug = factory.Sequence(lambda n: f"team-{n}")
    name = factory.LazyAttribute(lambda t: t.slug.replace("-", " ").title())
    retention_days = None

    @classmethod
    def _create(cls, model_class: type[Team], *args: Any, **kwargs: Any) -> Team:
        return team_create(actor=None, **kwargs)

    _build = _create


def add_member(team: Team, user: Any, role: str = Role.MEMBER) -> Membership:
    return membership_set(actor=None, team=team, user=user, role=role)


def member_of(team: Team, role: str = Role.MEMBER, **user_kwargs: Any) -> Any:
    """A new user with ``role`` in ``team``."""
    user = UserFactory(**user_kwargs)
    add_member(team, user, role)
    return user
