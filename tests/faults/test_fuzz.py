"""Hostile bodies never produce a 5xx (issue 14).

Hypothesis drives ``/v1/chat/completions``, a few REST POST endpoints and the policy editor form
on the live daphne server with deep nesting, huge strings, NULs, unpaired surrogates, raw bytes
and wrong types. 130 examples in all (derandomized, so a failure reproduces), well under a minute.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from django.conf import settings as django_settings
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.factories.api import make_api_key
from tests.factories.policies import publish_policy

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

hostile_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["\x00", "a\x00b", "\ud800", "x\udfffy", "\ud83d", "\u202e", "\ufeff", "", " "]),
    st.integers(min_value=1_000, max_value=300_000).map(lambda n: "A" * n),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    hostile_text,
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=8,
)


class Deep:
    """`value` wrapped in `depth` lists; spliced in as text (json.dumps itself would recurse)."""

    def __init__(self, value: Any, depth: int) -> None:
        self.value, self.depth = value, depth


nested = st.builds(Deep, values, st.sampled_from([1, 30, 65, 500, 5_000]))


def _encode(body: Any) -> bytes:
    # ensure_ascii: unpaired surrogates travel as \udXXX escapes, as a hostile client would send them.
    deep: list[Deep] = []

    def mark(obj: Any) -> str:
        deep.append(obj)
        return f"@@DEEP{len(deep) - 1}@@"

    text = json.dumps(body, default=mark)
    for i, d in enumerate(deep):
        text = text.replace(f'"@@DEEP{i}@@"', "[" * d.depth + json.dumps(d.value) + "]" * d.depth, 1)
    return text.encode()


def bodies(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """A JSON object with the endpoint's own fields (sometimes plausible, often hostile), a deep or
    wrong-typed body, or raw bytes."""
    plausible = st.fixed_dictionaries(
        {}, optional={name: st.one_of(good, values, nested) for name, good in fields.items()}
    )
    return st.one_of(
        plausible.map(_encode),
        st.one_of(values, nested).map(_encode),
        st.binary(max_size=200),
        st.sampled_from([b"", b"{", b'{"a": NaN}', b"\xff\xfe", b'"\\ud800"', b"[" * 20_000]),
    )


def assert_no_5xx(resp: httpx.Response, body: Any) -> None:
    assert resp.status_code < 500, f"{resp.status_code} for {str(body)[:300]!r}: {resp.text[:300]}"


@pytest.fixture
def http(transactional_db: Any, daphne_server: Any, runtime_workers: Any) -> Any:
    with httpx.Client(base_url=daphne_server.url, timeout=120) as client:
        yield client


@pytest.fixture
def admin_key(alpha: Any, team_admin: Any) -> str:
    return make_api_key(
        alpha,
        name="fuzz",
        role="admin",
        principal=team_admin,
        requests_per_minute=100_000,
        tokens_per_minute=100_000_000,
    ).plaintext


def test_v1_chat_completions_never_answers_5xx(http: Any, admin_key: str, conductor_fake: Any) -> None:
    messages = st.lists(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "tool", 7]), "content": values}),
        max_size=3,
    )
    fields = {
        "model": st.sampled_from(["conductor-mini", "conductor-ultra", "fake", "nope"]),
        "messages": messages,
        "stream": st.booleans(),
        "max_tokens": st.integers(min_value=-5, max_value=10**12),
        "temperature": st.floats(allow_nan=False),
        "n": st.integers(),
    }

    @settings(FUZZ, max_examples=60)
    @given(body=bodies(fields))
    def check(body: bytes) -> None:
        resp = http.post(
            "/v1/chat/completions",
            content=body,
            headers={"Authorization": f"Bearer {admin_key}", "Content-Type": "application/json"},
        )
        assert_no_5xx(resp, body)

    check()


def test_rest_posts_never_answer_5xx(http: Any, admin_key: str, alpha: Any, fake_pool: Any) -> None:
    policy = publish_policy(alpha, {}).policy
    endpoints = {
        "/api/runs/": {"question": hostile_text, "pool": st.just(fake_pool.pool.slug), "strategy": values},
        f"/api/policies/{policy.pk}/versions/": {"spec": values, "note": hostile_text},
        "/api/teams/": {"name": hostile_text, "slug": hostile_text},
        "/api/teams/alpha/keys/": {"name": hostile_text, "scopes": values},
    }

    @settings(FUZZ, max_examples=40)
    @given(path=st.sampled_from(sorted(endpoints)), data=st.data())
    def check(path: str, data: Any) -> None:
        body = data.draw(bodies(endpoints[path]))
        resp = http.post(
            path,
            content=body,
            headers={"Authorization": f"Bearer {admin_key}", "Content-Type": "application/json"},
        )
        assert_no_5xx(resp, body)

    check()


def test_policy_editor_form_never_answers_5xx(
    transactional_db: Any, daphne_server: Any, alpha: Any, policy_admin: Any
) -> None:
    django_client = Client()
    django_client.force_login(policy_admin)
    path = "/policies/team/alpha/"
    with httpx.Client(base_url=daphne_server.url, timeout=120) as client:
        client.cookies.set(
            django_settings.SESSION_COOKIE_NAME,
            django_client.cookies[django_settings.SESSION_COOKIE_NAME].value,
        )
        page = client.get(path)
        found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert page.status_code == 200 and found is not None
        token = found[1]

        spec_text = st.one_of(
            st.one_of(values, nested).map(lambda v: _encode(v).decode()),
            st.dictionaries(
                st.sampled_from(["constraints", "budgets", "guardrails", "x"]), values, max_size=3
            ).map(json.dumps),
            hostile_text,
        )

        @settings(FUZZ, max_examples=30)
        @given(
            spec=spec_text,
            action=st.sampled_from(["validate", "test", "save"]),
            prompt=hostile_text,
            plan=hostile_text,
        )
        def check(spec: str, action: str, prompt: str, plan: str) -> None:
            form = {
                "csrfmiddlewaretoken": token,
                "spec": spec,
                "action": action,
                "sample_prompt": prompt,
                "sample_plan": plan,
            }
            # Form fields travel as UTF-8: an unpaired surrogate cannot be encoded, send its bytes.
            encoded = urlencode({k: v.encode("utf-8", "surrogatepass") for k, v in form.items()})
            resp = client.post(
                path,
                content=encoded,
                headers={
                    "Referer": f"{daphne_server.url}{path}",
                    "Content-Type": "application/x-www-form-urlencoded",
                },
            )
            assert_no_5xx(resp, form)

        check()
