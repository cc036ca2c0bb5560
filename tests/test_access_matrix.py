"""The access matrix: every URL pattern and websocket route of the project, for every named user.

The test enumerates ``django.urls.get_resolver()`` recursively and
``conductor_web.routing.websocket_urlpatterns``, and for each entry looks up a *rule* saying what
each named user gets. **An entry without a rule fails** with a message naming it, so a new view
cannot ship without a decision about who may reach it. A rule that matches no entry fails too.

Rules live next to each app's tests, in ``tests/<app>/access_rules.py``, as a module-level
``RULES`` dict (rules for the project-level URLs — home, healthz, login, logout, admin — are in
``CORE_RULES`` below)::

    RULES = {
        # key: the URL name with its namespace ("workers:pool_detail")
        "workers:pool_detail": {
            "kwargs": lambda ctx: {"slug": ctx.pool.slug},  # dict or callable(ctx) -> dict
            "method": "GET",                                # default GET
            "data": None,                                   # dict or callable(ctx) -> dict (query or form body)
            "json": False,                                  # True: send ``data`` as a JSON body
            "headers": {},                                  # extra request headers, e.g. {"HTTP_ACCEPT": "..."}
            # expectations, one per role; all of the REQUIRED_ROLES must be present,
            # "team_admin" and "superuser" are checked when given:
            "anonymous": "login", "owner": 200, "teammate": 200, "outsider": 404,
            "reviewer": 200, "policy_admin": 200,
        },
        # several checks for one URL (e.g. GET and POST): a list of rule dicts
        "workers:pool_edit": [{...GET...}, {"method": "POST", ...}],
        # every name of a namespace: "<namespace>:*"; "sample" is the name actually requested
        "admin:*": {"sample": "admin:index", ...},
        # unnamed patterns: "route:<route prefix>*" ("route:admin/*"), with an explicit "path"
        # websocket routes: "ws:<route name>", with "path": callable(ctx) -> "/ws/...", and
        # expectations "accept" or "reject"
        "ws:run-stream": {"path": lambda ctx: f"/ws/runs/{ctx.memo('run', make_run)}/", "owner": "accept", ...},
    }

An expectation is an HTTP status (``200``), a tuple/set of acceptable statuses, ``"login"`` (a
302 to the login page), or for websockets ``"accept"``/``"reject"``.

``ctx`` (``AccessContext``) offers: the named users (``ctx.owner``, ``ctx.users["reviewer"]``,
…), teams ``ctx.alpha``/``ctx.beta``, ``ctx.fake`` (the ``fake_pool`` fixture: alpha's pool on the
fake OpenAI server) and ``ctx.pool``, and ``ctx.memo(key, factory)`` to build an object once per
URL check (``factory(ctx)`` is called once; the object is shared by all roles).

Each role's request runs in its own savepoint that is rolled back afterwards, so a POST by one
role (removing a member, disabling a pool) does not change what the next role sees.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse

REQUIRED_ROLES = ("anonymous", "owner", "teammate", "outsider", "reviewer", "policy_admin")
OPTIONAL_ROLES = ("team_admin", "superuser")
RULE_KEYS = {"kwargs", "method", "data", "json", "headers", "sample", "path", "note"}

# Project-level URLs (conductor_web/urls.py) and Django's admin.
_everyone = {"owner": 302, "teammate": 302, "outsider": 302, "reviewer": 302, "policy_admin": 302}
CORE_RULES: dict[str, Any] = {
    "home": {"anonymous": "login", **_everyone, "superuser": 302},
    "healthz": {
        "anonymous": (200, 503),
        "owner": (200, 503),
        "teammate": (200, 503),
        "outsider": (200, 503),
        "reviewer": (200, 503),
        "policy_admin": (200, 503),
        "note": "public liveness/readiness; 503 only when a backing service is down",
    },
    "login": {"anonymous": 200, **_everyone, "note": "signed-in users are sent on"},
    "logout": {"method": "POST", "anonymous": "login", **_everyone},
    "admin:*": {
        "sample": "admin:index",
        "anonymous": 302,
        "owner": 302,
        "teammate": 302,
        "outsider": 302,
        "reviewer": 302,
        "policy_admin": 302,
        "superuser": 200,
        "note": "Django admin: staff only (non-staff are redirected to the admin login)",
    },
    "route:admin/*": {
        "path": "/admin/auth/user/1/",
        "anonymous": 302,
        "owner": 302,
        "teammate": 302,
        "outsider": 302,
        "reviewer": 302,
        "policy_admin": 302,
        "note": "the admin's unnamed redirect/catch-all routes",
    },
}


# --- enumeration ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    key: str  # "ns:name", "route:<route>" for unnamed patterns, "ws:<name>" for websocket routes
    route: str
    kind: str  # "http" | "ws"

    @property
    def name(self) -> str | None:
        return None if self.key.startswith("route:") else self.key.removeprefix("ws:")


def _walk(patterns: list[Any], prefix: str = "", namespace: str | None = None) -> Iterator[Entry]:
    for p in patterns:
        if isinstance(p, URLResolver):
            ns = namespace
            if p.namespace:
                ns = f"{namespace}:{p.namespace}" if namespace else p.namespace
            yield from _walk(p.url_patterns, prefix + str(p.pattern), ns)
        elif isinstance(p, URLPattern):
            route = prefix + str(p.pattern)
            if p.name:
                yield Entry(f"{namespace}:{p.name}" if namespace else p.name, route, "http")
            else:
                yield Entry(f"route:{route}", route, "http")


def all_entries() -> list[Entry]:
    from conductor_web.routing import websocket_urlpatterns

    seen: dict[str, Entry] = {}
    for e in _walk(get_resolver().url_patterns):
        seen.setdefault(e.key, e)  # format-suffix variants share a name
    for p in websocket_urlpatterns:
        key = f"ws:{p.name}" if getattr(p, "name", None) else f"ws:route:{p.pattern}"
        seen.setdefault(key, Entry(key, str(p.pattern), "ws"))
    return list(seen.values())


def load_rules() -> tuple[dict[str, Any], list[str]]:
    """CORE_RULES plus every ``tests/<app>/access_rules.py``; also returns duplicate-key problems."""
    rules: dict[str, Any] = dict(CORE_RULES)
    origin = dict.fromkeys(CORE_RULES, "tests/test_access_matrix.py")
    problems = []
    tests_dir = Path(__file__).parent
    for info in sorted(pkgutil.iter_modules([str(tests_dir)]), key=lambda i: i.name):
        if not info.ispkg or not (tests_dir / info.name / "access_rules.py").exists():
            continue
        module = importlib.import_module(f"tests.{info.name}.access_rules")
        for key, rule in getattr(module, "RULES", {}).items():
            if key in rules:
                problems.append(
                    f"{key!r} has rules in both {origin[key]} and tests/{info.name}/access_rules.py"
                )
            rules[key] = rule
            origin[key] = f"tests/{info.name}/access_rules.py"
    return rules, problems


def rule_for(entry: Entry, rules: dict[str, Any]) -> Any | None:
    if entry.key in rules:
        return rules[entry.key]
    for key, rule in rules.items():
        name_glob = key.endswith(":*") and not key.startswith(("route:", "ws:"))
        if name_glob and entry.kind == "http" and entry.name and entry.name.startswith(key[:-1]):
            return rule
        route_glob = key.startswith("route:") and key.endswith("*") and entry.key.startswith("route:")
        if route_glob and entry.route.startswith(key.removeprefix("route:")[:-1]):
            return rule
    return None


ENTRIES = all_entries()
RULES, DUPLICATES = load_rules()


# --- context --------------------------------------------------------------------------------------


@dataclass
class AccessContext:
    users: dict[str, Any]
    alpha: Any
    beta: Any
    fake: Any
    _memo: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        users = self.__dict__.get("users", {})
        if name in users:
            return users[name]
        raise AttributeError(name)

    @property
    def pool(self) -> Any:
        return self.fake.pool

    def memo(self, key: str, factory: Callable[[AccessContext], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = factory(self)
        return self._memo[key]


@pytest.fixture
def access_ctx(named_users: dict[str, Any], alpha: Any, beta: Any, fake_pool: Any) -> AccessContext:
    return AccessContext(users=named_users, alpha=alpha, beta=beta, fake=fake_pool)


def _value(v: Any, ctx: AccessContext) -> Any:
    return v(ctx) if callable(v) else v


def _matches(expected: Any, status: int, location: str) -> bool:
    if expected == "login":
        return status == 302 and location.startswith("/accounts/login/")
    if isinstance(expected, tuple | set | list | frozenset):
        return status in expected
    return status == expected


def _http_check(entry: Entry, rule: dict[str, Any], ctx: AccessContext, role: str) -> tuple[int, str]:
    if "path" in rule:
        url = _value(rule["path"], ctx)
    else:
        name = rule.get("sample") or entry.name
        url = reverse(name, kwargs=_value(rule.get("kwargs") or {}, ctx))
    method = rule.get("method", "GET").upper()
    data = _value(rule.get("data"), ctx)
    headers = dict(rule.get("headers") or {})
    client = Client(raise_request_exception=False)
    with transaction.atomic():
        if role != "anonymous":
            client.force_login(ctx.users[role])
        if rule.get("json") and data is not None:
            resp = client.generic(method, url, json.dumps(data), content_type="application/json", **headers)
        elif method == "GET":
            resp = client.get(url, data or {}, **headers)
        elif method in ("POST", "PUT", "PATCH"):
            resp = getattr(client, method.lower())(url, data or {}, **headers)
        else:
            resp = client.generic(method, url, **headers)
        transaction.set_rollback(True)
    return resp.status_code, resp.get("Location", "") or ""


def _ws_check(rule: dict[str, Any], ctx: AccessContext, role: str) -> str:
    from asgiref.sync import async_to_sync
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import AnonymousUser

    from conductor_web.routing import websocket_urlpatterns

    path = _value(rule["path"], ctx)
    user = AnonymousUser() if role == "anonymous" else ctx.users[role]

    async def connect() -> str:
        comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
        comm.scope["user"] = user
        connected, _ = await comm.connect(timeout=5)
        await comm.disconnect()
        return "accept" if connected else "reject"

    # database_sync_to_async closes "old" connections; inside the test transaction that would
    # close the test's own connection, so it is disabled for this check only.
    with mock.patch("channels.db.close_old_connections"):
        return async_to_sync(connect)()


# --- tests ----------------------------------------------------------------------------------------


def test_rule_files_do_not_overlap() -> None:
    assert not DUPLICATES, "\n".join(DUPLICATES)


def test_every_rule_matches_a_url() -> None:
    keys = {e.key for e in ENTRIES}
    stale = []
    for key in RULES:
        if key in keys:
            continue
        if key.endswith("*") and any(rule_for(e, {key: RULES[key]}) is not None for e in ENTRIES):
            continue
        stale.append(key)
    assert not stale, (
        f"access rules for URLs that do not exist (renamed or removed?): {', '.join(sorted(stale))}"
    )


def test_rules_are_well_formed() -> None:
    problems = []
    for key, rule in RULES.items():
        for r in rule if isinstance(rule, list) else [rule]:
            missing = [role for role in REQUIRED_ROLES if role not in r]
            if missing:
                problems.append(f"{key}: no expectation for {', '.join(missing)}")
            unknown = set(r) - RULE_KEYS - set(REQUIRED_ROLES) - set(OPTIONAL_ROLES)
            if unknown:
                problems.append(f"{key}: unknown rule keys {sorted(unknown)}")
    assert not problems, "\n".join(problems)


@pytest.mark.django_db
@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.key)
def test_access(entry: Entry, access_ctx: AccessContext) -> None:
    rule = rule_for(entry, RULES)
    if rule is None:
        pytest.fail(
            f"No access rule for {entry.key!r} (/{entry.route}). Add one to tests/<app>/access_rules.py "
            "saying what anonymous, owner, teammate, outsider, reviewer and policy_admin get."
        )
    failures = []
    for index, r in enumerate(rule if isinstance(rule, list) else [rule]):
        roles = [role for role in (*REQUIRED_ROLES, *OPTIONAL_ROLES) if role in r]
        for role in roles:
            expected = r[role]
            label = f"[{index}] {r.get('method', 'GET') if entry.kind == 'http' else 'WS'} as {role}"
            if entry.kind == "ws":
                got = _ws_check(r, access_ctx, role)
                if got != expected:
                    failures.append(f"{label}: expected {expected}, got {got}")
                continue
            status, location = _http_check(entry, r, access_ctx, role)
            if not _matches(expected, status, location):
                where = f" → {location}" if location else ""
                failures.append(f"{label}: expected {expected}, got {status}{where}")
    assert not failures, f"{entry.key} (/{entry.route}):\n  " + "\n  ".join(failures)
