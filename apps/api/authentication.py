"""API key authentication (``Authorization: Bearer cw_…`` or ``X-Api-Key: cw_…``).

A key authenticates as its creator (``request.user``) with ``request.auth`` set to the ``ApiKey``;
``apps.api.selectors`` and ``apps.api.permissions`` then narrow everything to the key's team,
allowed pools and role. The key id goes into the request context so every audit row written
during the request carries it.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef
from django.http import HttpRequest
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed, Throttled
from rest_framework.request import Request

from apps.api import ratelimit
from apps.api.models import ApiKey
from apps.api.services import ApiKeyInvalid, apikey_authenticate
from conductor_web.request_context import set_api_key_id


def presented_key(request: HttpRequest) -> str | None:
    """The raw key the client presented, or None when it presented none."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if header:
        scheme, _, value = header.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    value = request.META.get("HTTP_X_API_KEY", "").strip()
    return value or None


def key_for_prefix(prefix: str) -> ApiKey | None:
    """The key of ``prefix`` with its team and principal, and ``in_team``: whether the principal
    is still a member of the key's team, all in one query.

    Deliberately read on every request and never cached in the process: revocation, expiry, a
    deactivated principal or a left team must stop the key at once in every daphne process and
    Celery worker, and with no shared cache only the database knows that. One indexed query is
    what that costs (it was two)."""
    from apps.governance.models import Membership

    member = Membership.objects.filter(team_id=OuterRef("team_id"), user_id=OuterRef("created_by_id"))
    return (
        ApiKey.objects.select_related("team", "created_by")
        .annotate(in_team=Exists(member))
        .filter(prefix=prefix)
        .first()
    )


def authenticate_key(raw: str) -> ApiKey:
    """Authenticate and put the key id into the audit request context."""
    key = apikey_authenticate(raw)
    set_api_key_id(key.pk)
    return key


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        raw = presented_key(request._request)
        if raw is None:
            if header and header.partition(" ")[0].lower() == "bearer":
                raise AuthenticationFailed("Empty bearer token.")
            return None  # not a key request: let session authentication try
        from apps.api import keyguard  # imports this module

        try:
            key = keyguard.authenticate(request._request, raw)
        except keyguard.KeyThrottled as exc:
            raise Throttled(wait=exc.retry_after_s, detail=exc.message) from None
        except ApiKeyInvalid as exc:
            raise AuthenticationFailed(exc.reason) from exc
        decision = ratelimit.hit_requests(key_prefix=key.prefix, limit=key.requests_per_minute)
        if not decision.allowed:
            raise Throttled(
                wait=decision.retry_after_s,
                detail=f"Rate limit of {decision.limit} requests per minute reached for this key.",
            )
        return (key.created_by, key)

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when no credentials were given.
        return 'Bearer realm="api"'
