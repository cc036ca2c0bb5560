"""Who acts and who reads, as types every app may name (issue 41: no ``actor: Any``).

``User`` is Django's (``AUTH_USER_MODEL`` is not swapped). A change's actor may be ``None``: the
system (seeding, sweeps, retention, tests). A reader is whoever the request or the websocket
scope carries, signed in or not, or nobody (``None``): the visibility rule gives anyone but an
active signed-in user nothing."""

from __future__ import annotations

from typing import TypeAlias, cast

from django.contrib.auth.models import AnonymousUser, User

Viewer: TypeAlias = User | AnonymousUser | None
Actor: TypeAlias = User | AnonymousUser | None


def stored_user(actor: Actor) -> User | None:
    """The actor as the user a row records (``created_by``, ``reviewer``): ``None`` for the
    system or an anonymous actor."""
    return cast(User, actor) if getattr(actor, "is_authenticated", False) else None


__all__ = ["Actor", "User", "Viewer", "stored_user"]
