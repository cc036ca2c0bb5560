"""Login throttling (django-axes) and its audit trail.

Axes counts failed logins in the database (not Redis, so it keeps working when Redis is down) per
username + client IP; at ``AXES_FAILURE_LIMIT`` failures that pair is locked for
``AXES_COOLOFF_TIME``. Every failure is audited (``auth.login_failed``, with the username tried,
never the password) and every lockout once (``auth.locked_out``).
"""

from __future__ import annotations

import math
from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.exceptions import AxesBackendPermissionDenied
from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth.signals import user_login_failed
from django.db import transaction
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record

USERNAME_MAX = 150


class LockoutBackend(AxesStandaloneBackend):
    """Axes' check for web logins. Logins without a request (management commands, the test
    client's ``login()``) reach no network and are not throttled."""

    def authenticate(self, request: HttpRequest | None, *args: Any, **kwargs: Any) -> Any:
        if request is None:
            return None
        try:
            return super().authenticate(request, *args, **kwargs)
        except AxesBackendPermissionDenied:
            # Refused before the password was checked (axes' own flag also marks the failure that
            # starts a lockout, so it cannot tell the two apart for the audit).
            request.refused_while_locked = True  # type: ignore[attr-defined]
            raise


def cooloff_minutes() -> int:
    cool_off = get_cool_off()
    return math.ceil(cool_off.total_seconds() / 60) if cool_off else 0


def lockout_message() -> str:
    return (
        f"Too many failed logins for this username from your address: the limit is "
        f"{settings.AXES_FAILURE_LIMIT} failures (AXES_FAILURE_LIMIT). Logins for it from here are "
        f"paused for {cooloff_minutes()} minutes (AXES_COOLOFF_MINUTES); an administrator can lift "
        f"the lock sooner with `manage.py axes_reset_username`."
    )


def lockout_response(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """AXES_LOCKOUT_CALLABLE: a 429 page that names the limit and the settings."""
    response = render(
        request,
        "registration/locked_out.html",
        {"message": lockout_message(), "limit": settings.AXES_FAILURE_LIMIT},
        status=429,
    )
    cool_off = get_cool_off(request)
    if cool_off:
        response["Retry-After"] = str(int(cool_off.total_seconds()))
    return response


def _username(credentials: dict[str, Any] | None, request: HttpRequest | None) -> str:
    name = (credentials or {}).get("username")
    if not name and request is not None:
        name = request.POST.get("username", "")
    return str(name or "")[:USERNAME_MAX]


@receiver(user_login_failed, dispatch_uid="conductor_audit_login_failed")
def audit_login_failed(
    sender: Any, credentials: dict[str, Any] | None = None, request: HttpRequest | None = None, **kw: Any
) -> None:
    if request is None:
        return  # not a web login (see LockoutBackend)
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.AUTH_LOGIN_FAILED,
            actor_label="anonymous",
            object_type="auth.user",
            payload={
                "username": _username(credentials, request),
                "path": request.path[:200],
                "refused_while_locked": bool(getattr(request, "refused_while_locked", False)),
            },
        )


def audit_locked_out(sender: Any, request: HttpRequest | None = None, username: str = "", **kw: Any) -> None:
    # Axes also signals for each attempt refused during a lockout; audit the lockout itself once.
    if request is not None and getattr(request, "axes_failures_since_start", None) is None:
        return
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.AUTH_LOCKED_OUT,
            actor_label="anonymous",
            object_type="auth.user",
            payload={
                "username": str(username or "")[:USERNAME_MAX],
                "limit": settings.AXES_FAILURE_LIMIT,
                "cooloff_minutes": cooloff_minutes(),
                "setting": "AXES_FAILURE_LIMIT",
            },
        )


def connect_signals() -> None:
    from axes.signals import user_locked_out

    user_locked_out.connect(audit_locked_out, dispatch_uid="conductor_audit_locked_out")
