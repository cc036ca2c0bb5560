"""The export streamed by the real ASGI server (daphne), and verified offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from tests.audit.offline import verify_offline
from tests.factories.audit import append_events


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_export_streams_through_daphne(
    daphne_server: Any, superuser: Any, alpha: Any, tmp_path: Path, fmt: str
) -> None:
    append_events(700, team=alpha)  # more than one streamed batch (500 rows)
    client = Client()
    client.force_login(superuser)
    cookies = {"sessionid": client.cookies["sessionid"].value}
    path = tmp_path / f"live.{fmt}"
    chunks = 0
    with httpx.stream(
        "GET", f"{daphne_server.url}/audit/export.{fmt}", cookies=cookies, timeout=60
    ) as response:
        assert response.status_code == 200
        assert response.headers.get("content-length") is None  # streamed, not buffered
        with path.open("wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
                chunks += 1
    assert chunks >= 1
    # Django warns (and buffers the whole body) when ASGI gets a sync iterator; ours is async.
    assert "consume synchronous iterators" not in daphne_server.log.read_text()
    result = verify_offline(path, "--contiguous")
    assert result.returncode == 0, result.stderr
    recorded = AuditEvent.objects.order_by("-seq").first()
    assert recorded is not None and recorded.event_type == AuditEventType.AUDIT_EXPORTED
    assert f"{recorded.seq - 1} rows verified" in result.stdout
