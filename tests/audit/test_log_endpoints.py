"""``/audit/log/keys`` (anyone) and ``/audit/log/checkpoint`` (who reviews the audit trail, and
``audit:read`` API keys), against the live server, read as an outside tool would (issue 40)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from django.test import Client

from apps.api.models import ApiScope
from apps.audit.checkpoints import log_origin
from tests.audit.offline import log_vkeys, script_module
from tests.factories.api import make_api_key
from tests.factories.audit import append_events

pytestmark = [pytest.mark.runtime, pytest.mark.django_db(transaction=True)]


def test_keys_for_anyone_and_the_checkpoint_for_audit_readers(
    daphne_server: Any, alpha: Any, team_admin: Any, owner: Any
) -> None:
    append_events(7, team=alpha)
    base = daphne_server.url
    keys = httpx.get(f"{base}/audit/log/keys", timeout=30)  # no session, no key
    assert keys.status_code == 200 and keys.headers["content-type"].startswith("text/plain")
    vkeys = [line for line in keys.text.splitlines() if line and not line.startswith("#")]
    assert vkeys == log_vkeys() and f"# audit log {log_origin()}" in keys.text

    reader = make_api_key(alpha, scopes=[ApiScope.AUDIT_READ], principal=team_admin).plaintext
    response = httpx.get(
        f"{base}/audit/log/checkpoint",
        headers={"Authorization": f"Bearer {reader}", "Accept": "text/plain"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; charset=utf-8"
    # What any signed-note tool does with it: open it with the served keys, read the checkpoint.
    script = script_module()
    text, signed = script.open_note(response.text, [script.Key(v) for v in vkeys])
    origin, size, _root = script.parse_checkpoint(text)
    assert origin == log_origin() and size >= 7 and signed[0][0].name == origin

    runner = make_api_key(alpha, scopes=[ApiScope.RUNS_READ], principal=team_admin).plaintext
    refused = httpx.get(
        f"{base}/audit/log/checkpoint", headers={"Authorization": f"Bearer {runner}"}, timeout=30
    )
    assert refused.status_code == 403 and "audit:read" in refused.json()["detail"]
    assert httpx.get(f"{base}/audit/log/checkpoint", timeout=30).status_code == 401

    session = Client()
    session.force_login(owner)  # a plain member: no audit trail of the team
    cookies = {"sessionid": session.cookies["sessionid"].value}
    member = httpx.get(f"{base}/audit/log/checkpoint", cookies=cookies, timeout=30)
    assert member.status_code == 403 and "view_team_audit" in member.json()["detail"]
