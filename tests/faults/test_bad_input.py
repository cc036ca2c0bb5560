"""Bad input gets a clear 4xx, never a 5xx, and nothing is stored half-way (issue 14).

Every row of the issue's table, against the live daphne server over real sockets, in both
modes: deep JSON, NUL / unpaired surrogates, a 10 MB body, a 1 MB guardrail term, and a
catastrophic-backtracking regex published by a policy admin followed by the prompt that used
to freeze the server.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client

from apps.policies.models import PolicyVersion
from apps.runs.models import Run
from tests.factories.policies import publish_policy
from tests.fixtures.api import CONDUCTOR_ANSWER

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

DEEP = 10_000
CHAT = "/v1/chat/completions"


def deep_json(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def chat_body(content: str = "What is six times seven?", **extra: Any) -> dict[str, Any]:
    return {"model": "conductor-mini", "messages": [{"role": "user", "content": content}], **extra}


@pytest.fixture
def server(transactional_db: Any, daphne_server: Any, runtime_workers: Any) -> Any:
    return daphne_server


@pytest.fixture
def http(server: Any) -> Any:
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture
def key_headers(api_key: tuple[Any, str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key[1]}"}


def browser_session(server: Any, user: Any) -> httpx.Client:
    """An httpx client carrying a logged-in session (stored in the shared test database)."""
    django_client = Client()
    django_client.force_login(user)
    cookie = django_client.cookies[settings.SESSION_COOKIE_NAME].value
    client = httpx.Client(base_url=server.url, timeout=120, follow_redirects=False)
    client.cookies.set(settings.SESSION_COOKIE_NAME, cookie)
    return client


def csrf_post(client: httpx.Client, path: str, data: dict[str, str]) -> httpx.Response:
    page = client.get(path)
    assert page.status_code == 200, page.text[:300]
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found is not None, "the page has no CSRF token"
    return client.post(
        path,
        data={**data, "csrfmiddlewaretoken": found[1]},
        headers={"Referer": str(client.base_url.join(path))},
    )


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text[:500]
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] == code
    return error


def assert_drf_error(resp: httpx.Response, status: int) -> str:
    assert resp.status_code == status, resp.text[:500]
    assert resp.headers["content-type"].startswith("application/json")
    detail = resp.json()["detail"]
    assert isinstance(detail, str)
    return detail


# ------------------------------------------------------------------------- deep JSON


def test_deep_json_on_v1_is_a_400_naming_the_limit(http: Any, key_headers: Any, fake_pool: Any) -> None:
    runs = Run.objects.count()
    body = json.dumps(chat_body(metadata="X")).replace('"X"', deep_json())
    resp = http.post(CHAT, content=body, headers={**key_headers, "Content-Type": "application/json"})
    error = assert_openai_error(resp, 400, "json_too_deep")
    assert "JSON_MAX_DEPTH" in error["message"] and str(settings.JSON_MAX_DEPTH) in error["message"]
    assert Run.objects.count() == runs


def test_deep_json_on_rest_is_a_400_in_drf_shape(http: Any, key_headers: Any, fake_pool: Any) -> None:
    runs = Run.objects.count()
    body = '{"question": "hi", "extra": ' + deep_json() + "}"
    resp = http.post("/api/runs/", content=body, headers={**key_headers, "Content-Type": "application/json"})
    assert "JSON_MAX_DEPTH" in assert_drf_error(resp, 400)
    assert Run.objects.count() == runs


def test_deep_json_in_the_policy_editor_is_a_form_error(server: Any, alpha: Any, policy_admin: Any) -> None:
    versions = PolicyVersion.objects.count()
    with browser_session(server, policy_admin) as client:
        spec = '{"guardrails": {"output": {"json_schema": {"schema": ' + deep_json() + "}}}}"
        resp = csrf_post(client, "/policies/team/alpha/", {"spec": spec, "action": "publish"})
    assert resp.status_code == 200, resp.text[:500]
    assert "JSON_MAX_DEPTH" in resp.text
    assert PolicyVersion.objects.count() == versions


# ------------------------------------------------------------------------- NUL and lone surrogates


@pytest.mark.parametrize("escape", ["\\u0000", "\\ud800"])
def test_nul_or_lone_surrogate_in_a_v1_prompt_is_a_400_naming_the_field(
    http: Any, key_headers: Any, fake_pool: Any, escape: str
) -> None:
    runs = Run.objects.count()
    body = json.dumps(chat_body("hello MARK world")).replace("MARK", escape)
    resp = http.post(CHAT, content=body, headers={**key_headers, "Content-Type": "application/json"})
    error = assert_openai_error(resp, 400, "invalid_characters")
    assert error["param"] == "messages[0].content"
    assert Run.objects.count() == runs


@pytest.mark.parametrize("escape", ["\\u0000", "\\udfff"])
def test_nul_or_lone_surrogate_in_a_rest_field_is_a_400(
    http: Any, key_headers: Any, fake_pool: Any, escape: str
) -> None:
    runs = Run.objects.count()
    body = '{"question": "hello ' + escape + ' world"}'
    resp = http.post("/api/runs/", content=body, headers={**key_headers, "Content-Type": "application/json"})
    assert "question" in assert_drf_error(resp, 400)
    assert Run.objects.count() == runs


def test_nul_in_a_rest_policy_spec_is_refused_before_the_database(
    http: Any, alpha: Any, team_admin: Any
) -> None:
    from tests.factories.api import make_api_key

    policy = publish_policy(alpha, {}).policy
    key = make_api_key(alpha, name="admin", role="admin", principal=team_admin).plaintext
    versions = PolicyVersion.objects.count()
    body = '{"spec": {"guardrails": {"output": {"json_schema": {"schema": {"title": "a\\u0000b"}}}}}}'
    resp = http.post(
        f"/api/policies/{policy.pk}/versions/",
        content=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    assert "spec.guardrails.output.json_schema.schema.title" in assert_drf_error(resp, 400)
    assert PolicyVersion.objects.count() == versions


def test_nul_in_a_form_field_or_query_is_a_400_naming_it(server: Any, owner: Any, fake_pool: Any) -> None:
    runs = Run.objects.count()
    with browser_session(server, owner) as client:
        resp = csrf_post(
            client,
            "/playground/",
            {"prompt": "hello\x00world", "strategy": "conductor", "pool": str(fake_pool.pool.pk)},
        )
        assert resp.status_code == 400 and "'prompt'" in resp.text and "NUL" in resp.text
        query = client.get("/audit/", params={"q": "a\x00b"})
        assert query.status_code == 400 and "'q'" in query.text
    assert Run.objects.count() == runs


# ------------------------------------------------------------------------- size


def test_a_10_mb_body_is_a_json_413_on_v1_and_rest(http: Any, key_headers: Any, fake_pool: Any) -> None:
    runs = Run.objects.count()
    big = json.dumps(chat_body("x" * (10 * 1024 * 1024)))
    resp = http.post(CHAT, content=big, headers={**key_headers, "Content-Type": "application/json"})
    error = assert_openai_error(resp, 413, "request_too_large")
    assert "JSON_MAX_BYTES" in error["message"] or "DATA_UPLOAD_MAX_MEMORY_SIZE" in error["message"]
    rest = http.post(
        "/api/runs/",
        content=json.dumps({"question": "y" * (10 * 1024 * 1024)}),
        headers={**key_headers, "Content-Type": "application/json"},
    )
    assert "bytes" in assert_drf_error(rest, 413)
    # Not JSON at all (a form post to the API): Django's own limit, answered in JSON too.
    form = http.post("/api/runs/", data={"question": "z" * (10 * 1024 * 1024)}, headers=key_headers)
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in assert_drf_error(form, 413)
    assert Run.objects.count() == runs


# ------------------------------------------------------------------------- guardrail terms


def test_a_1_mb_keyword_term_is_refused_with_the_field_path(
    server: Any, alpha: Any, policy_admin: Any
) -> None:
    versions = PolicyVersion.objects.count()
    spec = {
        "guardrails": {"input": {"blocked_terms": {"enabled": True, "terms": [{"pattern": "w" * 1_000_000}]}}}
    }
    with browser_session(server, policy_admin) as client:
        resp = csrf_post(client, "/policies/team/alpha/", {"spec": json.dumps(spec), "action": "publish"})
    assert resp.status_code == 200
    assert "guardrails.input.blocked_terms.terms[0].pattern" in resp.text
    assert "at most 500" in resp.text
    assert PolicyVersion.objects.count() == versions


@pytest.mark.parametrize(("pattern", "reason"), [(r"(a)\1", "backreferences"), (r"foo(?=bar)", "look-ahead")])
def test_a_regex_re2_cannot_run_is_refused_at_publish(
    server: Any, alpha: Any, policy_admin: Any, pattern: str, reason: str
) -> None:
    versions = PolicyVersion.objects.count()
    spec = {"guardrails": {"input": {"injection": {"enabled": True, "extra_patterns": [pattern]}}}}
    with browser_session(server, policy_admin) as client:
        resp = csrf_post(client, "/policies/team/alpha/", {"spec": json.dumps(spec), "action": "publish"})
    assert resp.status_code == 200
    assert "guardrails.input.injection.extra_patterns[0]" in resp.text and "RE2" in resp.text
    assert reason in resp.text
    assert PolicyVersion.objects.count() == versions


def test_a_backtracking_regex_no_longer_freezes_the_server(
    server: Any, http: Any, alpha: Any, policy_admin: Any, key_headers: Any, conductor_fake: Any
) -> None:
    """`(a+)+$` on "a"*40 + "!" takes ~2**40 steps in a backtracking engine (holding the GIL):
    the old code never answered the run nor /healthz. On RE2 the check is linear."""
    spec = {
        "guardrails": {
            "input": {
                "blocked_terms": {
                    "enabled": True,
                    "action": "block",
                    "terms": [{"pattern": "(a+)+$", "kind": "regex", "message": "nested"}],
                }
            }
        }
    }
    with browser_session(server, policy_admin) as client:
        resp = csrf_post(client, "/policies/team/alpha/", {"spec": json.dumps(spec), "action": "publish"})
    assert resp.status_code == 302, resp.text[:500]  # published: back to the editor
    terms = PolicyVersion.objects.filter(policy__team=alpha, status="published").get().spec
    assert terms["guardrails"]["input"]["blocked_terms"]["terms"][0]["pattern"] == "(a+)+$"

    answer = http.post(CHAT, json=chat_body("a" * 40 + "!"), headers=key_headers)
    assert answer.status_code == 200, answer.text[:500]
    assert answer.json()["choices"][0]["message"]["content"] == CONDUCTOR_ANSWER
    health = http.get("/healthz")
    assert health.status_code == 200
    # The same pattern still blocks what it matches.
    blocked = http.post(CHAT, json=chat_body("a" * 40), headers=key_headers)
    assert_openai_error(blocked, 400, "content_policy_violation")


def test_an_over_long_text_makes_a_regex_check_fail_closed_not_skip() -> None:
    """User regexes scan at most MAX_INPUT_CHARS; past that the check 'could not run' and
    on_check_error decides (a silent skip of the tail would be a bypass by padding)."""
    from apps.engine.events import CheckStatus
    from apps.policies.guardrails import run_stage
    from apps.policies.guardrails.regex import MAX_INPUT_CHARS
    from apps.policies.spec import parse_spec

    spec = parse_spec(
        {
            "guardrails": {
                "input": {
                    "blocked_terms": {
                        "enabled": True,
                        "terms": [{"pattern": r"forbidden\s+word", "kind": "regex"}],
                    }
                }
            }
        }
    )
    text = "x" * MAX_INPUT_CHARS + " forbidden word"
    closed = run_stage("input", spec.guardrails.input, text, on_check_error="fail_closed")
    assert closed.blocked and closed.checks[0].status == CheckStatus.FAILED
    assert str(MAX_INPUT_CHARS) in closed.checks[0].detail
    opened = run_stage("input", spec.guardrails.input, text, on_check_error="fail_open")
    assert not opened.blocked and opened.checks[0].status == CheckStatus.BYPASSED


# ------------------------------------------------------------------------- form bodies

MULTIPART = b'--b\r\nContent-Disposition: form-data; name="question"\r\n\r\nhi\r\n--b--\r\n'


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data; boundary=b", MULTIPART),
        ("multipart/form-data; boundary=b", b"--b\r\nnot a part"),
        ("multipart/form-data; boundary=b", b"no boundary anywhere"),
        ("application/x-www-form-urlencoded", b"question=hi"),
    ],
    ids=["multipart", "broken-multipart", "no-parts", "urlencoded"],
)
def test_form_bodies_on_v1_are_a_400_in_openais_shape(
    http: Any, key_headers: Any, fake_pool: Any, content_type: str, body: bytes
) -> None:
    # The input checks parsed a multipart /v1 body as a form, which used up the stream: the view's
    # read of the body then failed, and the client got a 503 "server failed (RawPostDataException)".
    runs = Run.objects.count()
    resp = http.post(CHAT, content=body, headers={**key_headers, "Content-Type": content_type})
    error = assert_openai_error(resp, 400, "invalid_json")
    assert "JSON" in error["message"]
    assert Run.objects.count() == runs


def test_a_multipart_body_on_the_rest_api_is_still_read_as_a_form(
    http: Any, key_headers: Any, fake_pool: Any
) -> None:
    resp = http.post(
        "/api/runs/",
        content=MULTIPART,
        headers={**key_headers, "Content-Type": "multipart/form-data; boundary=b"},
    )
    assert resp.status_code == 201, resp.text[:500]
    assert resp.json()["question"] == "hi"
