"""Who acts and who reads, as types every app may name (issue 41: no ``actor: Any``).

``User`` is Django's (``AUTH_USER_MODEL`` is not swapped). A change's actor may be ``None``: the
system (seeding, sweeps, retention, tests); a reader is whoever the request or the websocket
scope carries, signed in or not (the visibility rule gives an anonymous viewer nothing)."""

from __future__ import annotations

from typing import TypeAlias

from django.contrib.auth.models import AnonymousUser, User

Viewer: TypeAlias = User | AnonymousUser
Actor: TypeAlias = User | AnonymousUser | None

__all__ = ["Actor", "User", "Viewer"]
