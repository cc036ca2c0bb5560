"""Egress: where the server may connect (issue 13, item 2).

Against the live daphne server over real sockets, in both modes. Listeners on 127.0.0.1 and ::1
stand for Redis, PostgreSQL, RabbitMQ or a metadata service: every spelling of them is refused
when a provider is saved (form and REST), and rows planted past the form are refused when
connecting (health check and a real run) — the listeners never see a connection. The fakes live
on their own loopback address, the only one the test settings' EGRESS_ALLOW opens.
"""

from __future__ import annotations

import contextlib
import html
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.test import Client

from apps.api.models import ApiScope
from apps.engine.egress import (
    EgressConfigError,
    EgressDenied,
    EgressPolicy,
    check_url,
    literal_address,
    resolve_checked,
)
from apps.engine.providers import ProviderEgressDenied, ProviderRedirect, build_worker
from apps.engine.providers.gate import gate_without_policy
from apps.engine.types import WorkerInfo
from apps.runs.models import Run
from apps.workers.models import Pool, Provider, Worker
from apps.workers.services import pool_create, worker_create
from tests.factories.api import make_api_key
from tests.fakes.base import FAKE_HOST, FakeError
from tests.fakes.openai_server import FakeOpenAIServer

# ----------------------------------------------------------------------------- live helpers


class Listener:
    """A TCP listener recording every connection it accepts and the bytes it received."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port: int = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(1.0)
            data = b""
            with contextlib.suppress(OSError):
                data = conn.recv(65536)
            self.received.append(data or b"<connected>")
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener("127.0.0.1")
    yield lst
    lst.close()


@pytest.fixture
def listener6() -> Iterator[Listener]:
    try:
        lst = Listener("::1")
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    yield lst
    lst.close()


@pytest.fixture
def server(transactional_db: Any, daphne_server: Any, runtime_workers: Any) -> Any:
    return daphne_server


def browser_session(server: Any, user: Any) -> httpx.Client:
    """An httpx client carrying a logged-in session (stored in the shared test database)."""
    django_client = Client()
    django_client.force_login(user)
    client = httpx.Client(base_url=server.url, timeout=120, follow_redirects=False)
    client.cookies.set(
        settings.SESSION_COOKIE_NAME, django_client.cookies[settings.SESSION_COOKIE_NAME].value
    )
    return client


def csrf_token(client: httpx.Client, page: str = "/pools/providers/new/") -> str:
    resp = client.get(page)
    assert resp.status_code == 200, resp.text[:300]
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', resp.text)
    assert found is not None, "the page has no CSRF token"
    return found[1]


def form_post(client: httpx.Client, path: str, data: dict[str, Any], token: str) -> httpx.Response:
    return client.post(
        path,
        data={**data, "csrfmiddlewaretoken": token},
        headers={"Referer": str(client.base_url.join(path))},
    )


def health_check(client: httpx.Client, worker_slug: str, token: str) -> dict[str, Any]:
    resp = client.post(
        f"/pools/workers/{worker_slug}/test/",
        data={"csrfmiddlewaretoken": token},
        headers={"Accept": "application/json", "Referer": str(client.base_url)},
    )
    assert resp.status_code == 200, resp.text[:300]
    return dict(resp.json())


def plant_provider(team: Any, slug: str, base_url: str, **extra: Any) -> tuple[Provider, Worker]:
    """A provider row written straight to the database, past every save-time check."""
    provider = Provider.objects.create(
        team=team,
        slug=slug,
        name=slug,
        kind=extra.pop("kind", "openai_compatible"),
        base_url=base_url,
        **extra,
    )
    worker = worker_create(actor=None, provider=provider, slug=f"{slug}-w", display_name=slug, model_name="m")
    return provider, worker


# ----------------------------------------------------------------------------- spellings

ADDR = "EGRESS_ALLOW"


def spellings(p: int, p6: int) -> list[tuple[str, str]]:
    """(base URL, a fragment the refusal must contain). p/p6: the listeners on 127.0.0.1 / ::1."""
    return [
        (f"http://127.0.0.1:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://[::1]:{p6}/v1", "::1 is loopback"),
        (f"http://2130706433:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://0177.0.0.1:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://0x7f.1:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://127.1:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://0x7f000001:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://017700000001:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://127.0.0.1.:{p}/v1", "127.0.0.1 is loopback"),
        (f"http://127.0.0.2:{p}/v1", "127.0.0.2 is loopback"),
        (f"http://[::ffff:127.0.0.1]:{p}/v1", "IPv4-mapped"),
        (f"http://[::ffff:7f00:1]:{p}/v1", "IPv4-mapped"),
        (f"http://[0:0:0:0:0:ffff:127.0.0.1]:{p}/v1", "IPv4-mapped"),
        (f"http://[::127.0.0.1]:{p}/v1", "IPv4-compatible"),
        (f"http://[64:ff9b::7f00:1]:{p}/v1", "NAT64"),
        (f"http://[2002:7f00:1::]:{p}/v1", "6to4"),
        (f"http://localhost:{p}/v1", "localhost resolves to 127.0.0.1"),
        (f"http://0.0.0.0:{p}/v1", "unspecified"),
        (f"http://0:{p}/v1", "unspecified"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.1:8000/v1", "10.0.0.1 is private"),
        ("http://192.168.1.10/v1", "private"),
        ("http://172.16.5.4/v1", "private"),
        ("http://100.64.0.1/v1", "CGNAT"),
        ("http://224.0.0.1/v1", "multicast"),
        ("http://240.0.0.1/v1", "reserved"),
        ("http://[fe80::1]/v1", "link-local"),
        ("http://[fd00::1]/v1", "private"),
        (f"http://attacker@127.0.0.1:{p}/v1", "user name"),
        (f"http://user:pw@{FAKE_HOST}:{p}/v1", "user name"),
        (f"gopher://127.0.0.1:{p}/", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        (f"http://127.0.0.1:{p}\\@example.com/v1", "backslashes"),
    ]


SHAPE_RULES = ("user name", "http:// or https://", "backslashes")

# Spellings that denote the listeners: planted rows with them must never reach one.
CONNECTABLE = 19


# ----------------------------------------------------------------------------- save time


@pytest.mark.runtime
def test_every_spelling_refused_at_save_by_form_and_rest(
    server: Any, alpha: Any, policy_admin: Any, listener: Listener, listener6: Listener
) -> None:
    cases = spellings(listener.port, listener6.port)
    assert len(cases) >= 20
    session = browser_session(server, policy_admin)
    token = csrf_token(session)
    key = make_api_key(alpha, principal=policy_admin, scopes=[ApiScope.POOLS_WRITE]).plaintext
    rest = httpx.Client(base_url=server.url, timeout=60, headers={"Authorization": f"Bearer {key}"})
    for i, (url, fragment) in enumerate(cases):
        resp = form_post(
            session,
            "/pools/providers/new/",
            {
                "team": alpha.pk,
                "slug": f"ssrf-form-{i}",
                "name": "x",
                "kind": "openai_compatible",
                "base_url": url,
            },
            token,
        )
        assert resp.status_code == 400, (url, resp.status_code)
        assert fragment in html.unescape(resp.text), (url, fragment)

        resp = rest.post(
            "/api/providers/",
            json={
                "slug": f"ssrf-rest-{i}",
                "name": "x",
                "kind": "openai_compatible",
                "team": "alpha",
                "base_url": url,
            },
        )
        assert resp.status_code == 400, (url, resp.status_code, resp.text[:300])
        message = " ".join(resp.json()["base_url"])
        assert fragment in message, (url, message)
        if fragment not in SHAPE_RULES:
            assert ADDR in message  # says how an operator opens it
    assert not Provider.objects.filter(slug__startswith="ssrf-").exists()
    # Editing an existing provider is held to the same rule.
    provider, _ = plant_provider(alpha, "ssrf-edit", f"http://{FAKE_HOST}:9/v1")
    resp = rest.patch(
        f"/api/providers/{provider.slug}/", json={"base_url": f"http://2130706433:{listener.port}/v1"}
    )
    assert resp.status_code == 400 and "127.0.0.1 is loopback" in resp.text
    provider.refresh_from_db()
    assert provider.base_url == f"http://{FAKE_HOST}:9/v1"
    assert listener.received == [] and listener6.received == []


# ----------------------------------------------------------------------------- connect time


@pytest.mark.runtime
def test_planted_rows_never_reach_the_listener_on_health_check(
    server: Any, alpha: Any, policy_admin: Any, listener: Listener, listener6: Listener
) -> None:
    session = browser_session(server, policy_admin)
    token = csrf_token(session)
    cases = [
        *spellings(listener.port, listener6.port)[:CONNECTABLE],
        (f"http://attacker@127.0.0.1:{listener.port}/v1", "127.0.0.1 is loopback"),
        (f"http://attacker@localhost:{listener.port}/v1", "127.0.0.1"),
    ]
    for i, (url, _fragment) in enumerate(cases):
        _, worker = plant_provider(alpha, f"planted-{i}", url)
        result = health_check(session, worker.slug, token)
        assert result["status"] != "ok", (url, result)
    assert listener.received == [], listener.received
    assert listener6.received == [], listener6.received
    # The plain spellings say which address and which rule (nothing was sent anywhere).
    for slug, expected in (
        ("planted-0", "127.0.0.1 is loopback"),
        ("planted-1", "::1 is loopback"),
        ("planted-2", "127.0.0.1 is loopback"),
        ("planted-16", "localhost resolves to 127.0.0.1"),
    ):
        detail = Worker.objects.get(slug=f"{slug}-w").health_detail
        assert expected in detail and ADDR in detail, detail


@pytest.mark.runtime
def test_planted_row_never_reaches_the_listener_in_a_run(
    server: Any, alpha: Any, team_admin: Any, listener: Listener
) -> None:
    provider, worker = plant_provider(alpha, "planted-run", f"http://2130706433:{listener.port}/v1")
    conductor = worker_create(
        actor=None, provider=provider, slug="planted-run-c", display_name="c", model_name="m"
    )
    pool_create(
        actor=None, team=alpha, slug="planted", name="Planted", workers=[worker], conductor_worker=conductor
    )
    key = make_api_key(alpha, principal=team_admin, role="run").plaintext
    resp = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": "planted", "messages": [{"role": "user", "content": "hello"}]},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert resp.status_code >= 400 or resp.json()["choices"][0]["message"]["content"] == ""
    run = Run.objects.filter(pool=Pool.objects.get(slug="planted")).get()
    assert run.status in ("failed", "blocked")
    trail = run.error + " " + " ".join(run.steps.values_list("error", flat=True))
    assert "127.0.0.1 is loopback" in trail or "127.0.0.1 is loopback" in resp.text, (trail, resp.text[:500])
    assert listener.received == []


@pytest.mark.runtime
def test_planted_row_never_reaches_the_listener_from_embeddings(
    server: Any, alpha: Any, team_admin: Any, listener: Listener
) -> None:
    """/v1/embeddings (issue 45) connects through the same egress-checked client as every worker."""
    # A name: refused at connect time, on the address it resolves to (not by the saved URL's shape).
    _, worker = plant_provider(alpha, "planted-emb", f"http://localhost:{listener.port}/v1")
    pool_create(
        actor=None, team=alpha, slug="planted-emb", name="Planted", workers=[worker], default_worker=worker
    )
    key = make_api_key(alpha, principal=team_admin, role="run").plaintext
    resp = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": "planted-emb", "input": "hello"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=120,
    )
    assert resp.status_code == 503, resp.text[:500]
    assert resp.json()["error"]["code"] == "egress_denied"
    assert "localhost resolves to 127.0.0.1" in resp.json()["error"]["message"]
    assert listener.received == []


@pytest.mark.runtime
def test_redirect_from_an_allowed_fake_is_not_followed(
    server: Any, fake_pool: Any, policy_admin: Any, listener: Listener
) -> None:
    session = browser_session(server, policy_admin)
    token = csrf_token(session)
    for status in (302, 307, 308):
        fake_pool.server.script(
            FakeError(
                status,
                {"error": {"message": "moved"}},
                headers={"Location": f"http://127.0.0.1:{listener.port}/v1/chat/completions"},
            )
        )
        result = health_check(session, fake_pool.workers[0].slug, token)
        assert result["status"] == "error" and "redirect" in result["detail"], result
    # The allowed fake did get the requests (with the key); the redirect target got nothing.
    assert len(fake_pool.server.chat_requests()) == 3
    assert fake_pool.server.chat_requests()[-1].headers["authorization"].startswith("Bearer ")
    assert listener.received == []


# ----------------------------------------------------------------------------- the engine module


def test_policy_parsing_and_port_rules() -> None:
    policy = EgressPolicy.parse(
        "10.0.0.0/8:8000-8100, 127.0.0.1:11434, [::1]:8000, [fd00::/8], vllm.lan:8000"
    )
    check_url("http://10.1.2.3:8050/v1", policy)
    check_url("http://127.0.0.1:11434/v1", policy)
    check_url("http://[::1]:8000/v1", policy)
    check_url("http://[fd12::1]:9/v1", policy)
    check_url("http://vllm.lan:8000/v1", policy)
    check_url("http://11.0.0.1:1/", policy)  # public: allowed by default
    for url in ("http://10.1.2.3:8101/", "http://127.0.0.1:11435/", "http://[::1]:8001/"):
        with pytest.raises(EgressDenied, match=ADDR):
            check_url(url, policy)
    for bad in ("10.0.0.0/33", "127.0.0.1:0", "127.0.0.1:9-8", "[::1", "http://x", "999"):
        with pytest.raises(EgressConfigError):
            EgressPolicy.parse(bad)
    assert literal_address("0x7f.1") == literal_address("2130706433") == literal_address("127.1")
    assert literal_address("api.openai.com") is None
    # A name that does not resolve is saved (this machine has no public DNS)...
    check_url("https://no-such-host.invalid/v1", EgressPolicy())
    # ...and checked again at connect time, where it fails to resolve rather than slipping through.
    with pytest.raises(OSError):
        resolve_checked("no-such-host.invalid", 443, EgressPolicy())


def test_egress_allow_opens_a_self_hosted_server_by_port(listener: Listener) -> None:
    """What an operator does for vLLM/Ollama on this host (EGRESS_ALLOW=127.0.0.1:<port>): that
    port opens, no other does, and the check at connect time is on the resolved address."""
    info = WorkerInfo("w", "W", "m", "openai_compatible")
    with FakeOpenAIServer(host="127.0.0.1") as local:
        opened = EgressPolicy.parse(f"127.0.0.1:{local.port}")
        worker = build_worker(
            info,
            base_url=f"http://127.0.0.1:{local.port}/v1",
            egress=opened,
            max_retries=0,
            gate=gate_without_policy(),
        )
        assert worker.complete([{"role": "user", "content": "hi"}]).text == "ok"
        # The same rule does not open another port on the same address.
        other = build_worker(
            info,
            base_url=f"http://localhost:{listener.port}/v1",
            egress=opened,
            max_retries=0,
            gate=gate_without_policy(),
        )
        with pytest.raises(ProviderEgressDenied, match=rf"127\.0\.0\.1:{listener.port}"):
            other.complete([{"role": "user", "content": "hi"}])
        # A redirect is an error, never followed.
        local.script(FakeError(302, {}, headers={"Location": f"http://127.0.0.1:{listener.port}/"}))
        with pytest.raises(ProviderRedirect):
            worker.complete([{"role": "user", "content": "hi"}])
    assert listener.received == []


def test_socket_level_check_refuses_every_spelling_the_http_stack_accepts(
    listener: Listener, listener6: Listener
) -> None:
    """Below the build-time check: the engine's HTTP client itself, under the default policy
    (public only), refuses at the socket whatever spelling reaches it, naming the rule."""
    info = WorkerInfo("w", "W", "m", "openai_compatible")
    strict = EgressPolicy()
    cases = spellings(listener.port, listener6.port)[:CONNECTABLE]
    cases += [(f"http://attacker@localhost:{listener.port}/v1", "127.0.0.1")]
    refused_at_socket = 0
    for url, _fragment in cases:
        try:
            worker = build_worker(
                info,
                base_url=url,
                api_key="sk-must-not-travel",
                egress=strict,
                max_retries=0,
                gate=gate_without_policy(),
            )
        except Exception:  # the SDK's URL parser refused the spelling outright: nothing connects
            continue
        with pytest.raises(ProviderEgressDenied, match=ADDR):
            worker.complete([{"role": "user", "content": "hi"}])
        refused_at_socket += 1
    assert refused_at_socket >= 15
    assert listener.received == [] and listener6.received == []
