"""The websocket Origin rule (apps.core.ws_origin), without a server: scheme, host and port of
the Origin against the handshake's own origin and WEBSOCKET_ALLOWED_ORIGINS. The live refusals
are in tests/security/test_ws_session.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.core.ws_origin import Origin, allowed_origins, origin_refusal, own_origin, parse_origin


def _scope(origin: str | None, host: str = "127.0.0.1:8000", **extra: str) -> dict[str, Any]:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    headers += [(k.encode(), v.encode()) for k, v in extra.items()]
    return {"type": "websocket", "headers": headers}


@pytest.fixture(autouse=True)
def _origins(settings: Any) -> None:
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]", "conductor.example.com"]
    settings.WEBSOCKET_ALLOWED_ORIGINS = []
    settings.SECURE_PROXY_SSL_HEADER = None


def test_origins_parse_to_scheme_host_and_port() -> None:
    assert parse_origin("http://127.0.0.1:8000") == Origin("http", "127.0.0.1", 8000)
    assert parse_origin("HTTPS://Conductor.Example.com") == Origin("https", "conductor.example.com", 443)
    assert parse_origin("http://[::1]:8000") == Origin("http", "::1", 8000)
    for bad in (
        "null",
        "",
        "ws://127.0.0.1:8000",
        "http://",
        "http://u:p@host",
        "http://h/x",
        "http://h:99999",
    ):
        assert parse_origin(bad) is None, bad
    assert parse_origin("https://*.example.com") is None  # a wildcard only in the setting
    assert parse_origin("https://*.example.com", pattern=True) == Origin("https", "*.example.com", 443)


@pytest.mark.parametrize(
    "origin",
    ["http://127.0.0.1:8000", "http://127.0.0.1:8000/"],
)
def test_the_handshakes_own_origin_is_allowed(origin: str) -> None:
    assert origin_refusal(_scope(origin)) is None


@pytest.mark.parametrize(
    "origin",
    [
        "https://127.0.0.1",  # the reproductions
        "http://localhost:9",
        "https://127.0.0.1:8000",  # scheme
        "http://127.0.0.1:8001",  # port
        "http://127.0.0.1",  # the default port
        "http://localhost:8000",  # host, though in ALLOWED_HOSTS
        "null",
        None,
    ],
)
def test_any_other_origin_is_refused(origin: str | None) -> None:
    assert origin_refusal(_scope(origin)) is not None


def test_a_host_outside_allowed_hosts_is_no_own_origin() -> None:
    # DNS rebinding: the page's own origin, but a Host this server does not serve.
    assert own_origin(_scope(None, host="rebind.example:8000")) is None
    assert origin_refusal(_scope("http://rebind.example:8000", host="rebind.example:8000")) is not None


def test_behind_a_tls_proxy_the_scheme_comes_from_the_proxy_header(settings: Any) -> None:
    scope = _scope(
        "https://conductor.example.com", host="conductor.example.com", **{"x-forwarded-proto": "https"}
    )
    assert origin_refusal(scope) is not None  # the header counts only when the setting trusts it
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert own_origin(scope) == Origin("https", "conductor.example.com", 443)
    assert origin_refusal(scope) is None
    plain = _scope("https://conductor.example.com", host="conductor.example.com")
    assert origin_refusal(plain) is not None


def test_configured_origins_match_exactly_or_by_subdomain(settings: Any) -> None:
    settings.WEBSOCKET_ALLOWED_ORIGINS = ["https://app.example.com", "https://*.corp.example"]
    assert origin_refusal(_scope("https://app.example.com")) is None
    assert origin_refusal(_scope("https://a.b.corp.example")) is None
    for refused in ("http://app.example.com", "https://app.example.com:8443", "https://corp.example"):
        assert origin_refusal(_scope(refused)) is not None, refused


def test_a_malformed_setting_stops_the_server(settings: Any) -> None:
    settings.WEBSOCKET_ALLOWED_ORIGINS = ["app.example.com"]
    with pytest.raises(ImproperlyConfigured, match=r"app\.example\.com"):
        allowed_origins()
