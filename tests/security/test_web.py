"""Web hardening (issue 13): redirects stay on the site, pages and parameters are bounded, error
pages are friendly and say why, the API docs need a login, responses carry a CSP with a nonce,
and ``make demo``'s settings never show a debug page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import RequestFactory
from django.urls import reverse

from apps.runs.models import Run, RunStatus
from conductor_web.views import server_error
from tests.factories.audit import make_run
from tests.fixtures.core import (
    ROOT,
    LiveServer,
    _stop,
    start_daphne,
    subprocess_env,
)

PASSWORD = "pw-for-tests-123"
HUGE = "9" * 30


# --- open redirects ---------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "target", ["//evil.example", "/\\evil.example", "https://evil.example/x", "\\\\evil.example"]
)
def test_cancel_next_cannot_leave_the_site(client: Any, owner: Any, alpha: Any, target: str) -> None:
    run = make_run(alpha, created_by=owner, status=RunStatus.QUEUED)
    client.force_login(owner)
    response = client.post(reverse("runs:cancel", args=[run.id]), {"next": target})
    assert response.status_code == 302
    assert response["Location"] == reverse("runs:detail", args=[run.id])
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


@pytest.mark.django_db
def test_cancel_next_on_the_site_is_honoured(client: Any, owner: Any, alpha: Any) -> None:
    run = make_run(alpha, created_by=owner, status=RunStatus.QUEUED)
    client.force_login(owner)
    response = client.post(reverse("runs:cancel", args=[run.id]), {"next": "/runs/?status=cancelled"})
    assert response["Location"] == "/runs/?status=cancelled"


@pytest.mark.django_db
def test_login_next_cannot_leave_the_site(client: Any, owner: Any) -> None:
    response = client.post(
        reverse("login") + "?next=//evil.example", {"username": owner.username, "password": PASSWORD}
    )
    assert response.status_code == 302
    assert "evil.example" not in response["Location"]


# --- pagination and parameter bounds ----------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("page", [HUGE, "2", "0", "-1", "abc"])
def test_run_list_out_of_range_page_is_a_friendly_404(client: Any, owner: Any, alpha: Any, page: str) -> None:
    make_run(alpha, created_by=owner)
    client.force_login(owner)
    assert client.get("/runs/").status_code == 200
    response = client.get(f"/runs/?page={page}")
    assert response.status_code == 404
    body = response.content.decode()
    assert 'data-testid="error-404"' in body
    assert "page" in body.lower() and "Traceback" not in body


@pytest.mark.django_db
@pytest.mark.parametrize("param", ["before", "after"])
def test_audit_list_keyset_params_are_bounded(client: Any, superuser: Any, param: str) -> None:
    client.force_login(superuser)
    response = client.get(f"/audit/?{param}={HUGE}")
    assert response.status_code == 400
    assert param in response.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("actor=" + "a" * 5000, "actor"),
        ("object=workers.pool:" + "1" * 500, "object"),
        ("type=" + "run." * 100, "type"),
        ("since=2026-01-01" + " " * 10 + "x" * 100, "since"),
        ("team=" + HUGE, "team"),
        ("actor=" + HUGE, "actor"),
        ("run=1&run=2&run=3", "run"),
        ("padding=" + "x" * 1000, "padding"),
    ],
)
def test_audit_export_bounds_every_parameter(client: Any, superuser: Any, query: str, param: str) -> None:
    from apps.audit.models import AuditEvent

    client.force_login(superuser)
    before = AuditEvent.objects.filter(event_type="audit.exported").count()
    response = client.get(f"/audit/export.jsonl?{query}")
    assert response.status_code == 400
    body = response.content.decode()
    assert f"{param}:" in body
    assert len(body) < 2000  # the padding is not echoed back
    # Nothing was exported, so nothing padded was written into the audit chain.
    assert AuditEvent.objects.filter(event_type="audit.exported").count() == before


@pytest.mark.django_db
def test_audit_export_within_bounds_still_works(client: Any, superuser: Any) -> None:
    client.force_login(superuser)
    response = client.get("/audit/export.jsonl?type=audit.&since=2020-01-01")
    assert response.status_code == 200
    b"".join(response.streaming_content)  # type: ignore[arg-type]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        f"/audit/events/{HUGE}/",
        f"/policies/{HUGE}/history/",
        f"/api/audit/events/{HUGE}/",
        f"/api/policies/{HUGE}/",
        f"/api/runs/?offset={HUGE}",
        f"/api/runs/?limit={HUGE}",
    ],
)
def test_absurd_ids_and_offsets_are_not_server_errors(client: Any, superuser: Any, path: str) -> None:
    client.force_login(superuser)
    assert client.get(path).status_code in (200, 400, 404)


# --- error pages ---------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_403_page_names_the_missing_permission(client: Any, owner: Any) -> None:
    client.force_login(owner)
    response = client.post(reverse("audit:verify"))
    assert response.status_code == 403
    body = response.content.decode()
    assert 'data-testid="error-403"' in body
    assert "needs the reviewer or admin role on a team (permission review_team_runs)" in body


@pytest.mark.django_db
def test_404_page_says_why(client: Any, owner: Any) -> None:
    client.force_login(owner)
    response = client.get("/runs/00000000-0000-0000-0000-000000000000/")
    assert response.status_code == 404
    body = response.content.decode()
    assert 'data-testid="error-404"' in body and "No such run." in body


def test_500_page_is_friendly_without_a_request_context() -> None:
    response = server_error(RequestFactory().get("/boom"))
    assert response.status_code == 500
    body = response.content.decode()
    assert 'data-testid="error-500"' in body and "Something went wrong on our side" in body


# --- API docs and schema --------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/api/schema/", "/api/docs/", "/api/redoc/"])
def test_api_docs_need_a_login_or_a_key(client: Any, owner: Any, api_key: Any, path: str) -> None:
    assert client.get(path).status_code in (401, 403)
    _, plaintext = api_key
    assert client.get(path, HTTP_AUTHORIZATION=f"Bearer {plaintext}").status_code == 200
    client.force_login(owner)
    response = client.get(path)
    assert response.status_code == 200
    if path == "/api/docs/":
        # The docs page's inline script carries the CSP nonce, so the policy lets it run.
        nonce = re.search(r"'nonce-([^']+)'", response["Content-Security-Policy"])
        assert nonce and f'<script nonce="{nonce.group(1)}">' in response.content.decode()


# --- Content-Security-Policy ------------------------------------------------------------------------


@pytest.mark.django_db
def test_pages_carry_a_nonce_csp_without_unsafe_inline_scripts(client: Any, owner: Any) -> None:
    client.force_login(owner)
    response = client.get("/playground/")
    csp = response["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";") if d.strip())
    assert directives["script-src"].startswith("'self'")
    assert "unsafe-inline" not in directives["script-src"] and "unsafe-eval" not in directives["script-src"]
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"
    # Every inline script in the page carries this response's nonce (django-csp adds the nonce to
    # the header as soon as a template reads request.csp_nonce).
    nonce = re.search(r"'nonce-([^']+)'", directives["script-src"])
    for tag in re.findall(r"<script\b[^>]*>", response.content.decode()):
        if 'type="application/json"' in tag:
            continue  # a data block (json_script) is never executed: CSP does not govern it
        assert "src=" in tag or (nonce and f'nonce="{nonce.group(1)}"' in tag), tag


# --- make demo's settings: DEBUG off, friendly pages, static files still served --------------------------


def test_demo_settings_have_debug_off() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "DJANGO_SETTINGS_MODULE")}
    env["DJANGO_SETTINGS_MODULE"] = "conductor_web.settings.local"
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import django; django.setup(); from django.conf import settings; print(settings.DEBUG)",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"


@pytest.fixture
def demo_server(transactional_db: Any, tmp_path: Any) -> Iterator[LiveServer]:
    """daphne on ``conductor_web.settings.local`` (what ``make demo`` serves), on the test database."""
    yield from start_demo_server(tmp_path)


def start_demo_server(tmp_path: Any, **extra: str) -> Iterator[LiveServer]:
    env = subprocess_env(
        # The test database's audit chain and secrets, so rows written by this server verify.
        AUDIT_HMAC_KEY=settings.AUDIT_HMAC_KEY,
        SECRETS_ENCRYPTION_KEY=settings.SECRETS_ENCRYPTION_KEY,
        **extra,
    )
    env["DJANGO_SETTINGS_MODULE"] = "conductor_web.settings.local"
    env.pop("DEBUG", None)
    server = start_daphne(tmp_path / "demo-daphne.log", env)
    try:
        yield server
    finally:
        _stop(server.proc)


def demo_password_for(*users: Any) -> None:
    """The demo settings keep Django's default hashers, not the tests' fast MD5 one."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    for user in users:
        user.password = hasher.encode(PASSWORD, hasher.salt())
        user.save(update_fields=["password"])


def web_login(http: httpx.Client, username: str, password: str = PASSWORD) -> httpx.Response:
    http.get("/accounts/login/")
    return http.post(
        "/accounts/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": http.cookies["csrftoken"]},
        headers={"Referer": str(http.base_url) + "/accounts/login/"},
    )


@pytest.mark.runtime
def test_demo_server_serves_friendly_pages_never_a_debug_page(demo_server: LiveServer, owner: Any) -> None:
    demo_password_for(owner)
    with httpx.Client(base_url=demo_server.url, timeout=30) as http:
        # Static files (plotly too) are served with DEBUG off.
        assert http.get("/static/css/app.css").status_code == 200
        assert http.get("/static/vendor/plotly.min.js").status_code == 200
        assert web_login(http, owner.username).status_code == 302
        for path in (f"/runs/?page={HUGE}", "/no/such/page/", "/runs/00000000-0000-0000-0000-000000000000/"):
            response = http.get(path)
            assert response.status_code == 404, path
            assert 'data-testid="error-404"' in response.text
            assert "Traceback" not in response.text and "DEBUG = True" not in response.text
        denied = http.post("/audit/verify/", headers={"X-CSRFToken": http.cookies["csrftoken"]})
        assert denied.status_code == 403
        assert "needs the reviewer or admin role on a team (permission review_team_runs)" in denied.text
        assert "Content-Security-Policy" in http.get("/playground/").headers
