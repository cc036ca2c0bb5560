"""The Django side of ``apps.engine.egress``: the operator's policy from ``settings.EGRESS_ALLOW``
and the save-time check of a provider's base URL."""

from __future__ import annotations

from functools import lru_cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.engine.egress import (
    EgressConfigError,
    EgressDenied,
    EgressPolicy,
    check_url,
    parse_url,
    set_default_policy,
)


def _raw_setting() -> tuple[str, ...]:
    raw = getattr(settings, "EGRESS_ALLOW", ()) or ()
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    return tuple(str(i).strip() for i in items if str(i).strip())


@lru_cache(maxsize=8)
def _parse(raw: tuple[str, ...]) -> EgressPolicy:
    try:
        return EgressPolicy.parse(raw)
    except EgressConfigError as err:
        raise ImproperlyConfigured(str(err)) from None


def egress_policy() -> EgressPolicy:
    """The current policy (re-read from settings each time; parsing is cached)."""
    return _parse(_raw_setting())


def install_default_policy() -> None:
    """Called at app ready: clients built without an explicit policy follow the settings too,
    and a malformed EGRESS_ALLOW stops the process at start instead of at the first run."""
    set_default_policy(egress_policy())


def base_url_refusal(url: str) -> str | None:
    """Why a provider may not be saved with ``url`` as its base URL, or None (save-time check)."""
    try:
        check_url(url, egress_policy(), resolve=True)
    except EgressDenied as err:
        return str(err)
    return None


def url_shape_refusal(url: str) -> str | None:
    """The shape rules only (scheme, userinfo, host syntax): for the trusted system actor."""
    try:
        parse_url(url)
    except EgressDenied as err:
        return str(err)
    return None


def static_url_refusal(url: str) -> str | None:
    """Use-time check without DNS: the shape rules and any literal address (every spelling)."""
    try:
        check_url(url, egress_policy(), resolve=False)
    except EgressDenied as err:
        return str(err)
    return None
