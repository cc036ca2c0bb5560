"""Streamed exports, verified offline by scripts/verify_audit_export.py run as a subprocess."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.http import StreamingHttpResponse

from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import audit_checkpoint
from tests.factories.audit import append_events

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "verify_audit_export.py"


def verify_offline(path: Path, *args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AUDIT_HMAC_KEY"}
    env["AUDIT_HMAC_KEY"] = key if key is not None else settings.AUDIT_HMAC_KEY
    # -I: isolated, so the script cannot lean on this project's modules.
    return subprocess.run(
        [sys.executable, "-I", str(SCRIPT), str(path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def download(client: Any, fmt: str, tmp_path: Path, **params: str) -> Path:
    response = client.get(f"/audit/export.{fmt}", params)
    assert response.status_code == 200, response.content[:500]
    assert isinstance(response, StreamingHttpResponse)
    assert "attachment" in response["Content-Disposition"]
    path = tmp_path / f"export.{fmt}"
    path.write_bytes(b"".join(response.streaming_content))
    return path


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_full_export_verifies_offline_and_is_recorded(
    client: Any, superuser: Any, alpha: Any, tmp_path: Path, fmt: str
) -> None:
    append_events(30, team=alpha)
    audit_checkpoint()
    last_before_export = AuditEvent.objects.order_by("-seq").first()
    assert last_before_export is not None
    client.force_login(superuser)
    path = download(client, fmt, tmp_path)

    result = verify_offline(path, "--contiguous")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{last_before_export.seq} rows verified" in result.stdout

    exported = AuditEvent.objects.order_by("-seq").first()
    assert exported is not None and exported.event_type == AuditEventType.AUDIT_EXPORTED
    assert exported.actor_id == superuser.pk and exported.payload["format"] == fmt
    assert exported.seq == last_before_export.seq + 1  # the export covers everything before its record

    # The wrong key fails every row.
    assert verify_offline(path, key="wrong-key").returncode == 1


@pytest.mark.django_db
def test_tampered_jsonl_export_fails_offline(client: Any, superuser: Any, alpha: Any, tmp_path: Path) -> None:
    append_events(10, team=alpha)
    client.force_login(superuser)
    path = download(client, "jsonl", tmp_path)
    lines = path.read_text().splitlines()
    row = json.loads(lines[-4])
    edited = row["canonical"].replace('"note":"event', '"note":"edited event')
    assert edited != row["canonical"]
    row["canonical"], row["content"] = edited, json.loads(edited)
    lines[-4] = json.dumps(row, ensure_ascii=False)
    path.write_text("\n".join(lines) + "\n")
    result = verify_offline(path, "--contiguous")
    assert result.returncode == 1
    assert f"seq {row['seq']}: digest does not verify" in result.stderr

    # Dropping a row breaks contiguity.
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:3] + lines[4:]) + "\n")
    assert "missing" in verify_offline(path, "--contiguous").stderr


@pytest.mark.django_db
def test_edited_display_column_in_csv_fails_offline(
    client: Any, superuser: Any, alpha: Any, tmp_path: Path
) -> None:
    append_events(5, team=alpha)
    client.force_login(superuser)
    path = download(client, "csv", tmp_path)
    rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    header = rows[0]
    rows[3][header.index("actor_label")] = "someone-else"
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    path.write_text(buffer.getvalue())
    result = verify_offline(path)
    assert result.returncode == 1 and "'actor_label' differs" in result.stderr


@pytest.mark.django_db
def test_filtered_export_respects_visibility_and_filters(
    client: Any, reviewer: Any, alpha: Any, beta: Any, tmp_path: Path
) -> None:
    append_events(6, team=alpha, event_type=AuditEventType.POOL_UPDATED)
    append_events(4, team=beta, event_type=AuditEventType.POOL_UPDATED)
    client.force_login(reviewer)
    path = download(client, "jsonl", tmp_path, type="pool.updated")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [records[0]["type"], records[-1]["type"]] == ["sth", "end"]  # cut from a signed tree head
    rows = records[1:-1]
    assert len(rows) == 6
    assert {r["content"]["team_id"] for r in rows} == {alpha.pk}
    assert {r["content"]["event_type"] for r in rows} == {"pool.updated"}
    result = verify_offline(path)  # gaps are fine for a filtered selection, rows and links still verify
    assert result.returncode == 0, result.stderr
    recorded = AuditEvent.objects.order_by("-seq").first()
    assert recorded is not None and recorded.payload["filters"] == {"type": "pool.updated"}


@pytest.mark.django_db
def test_checkpoint_in_offline_verification(client: Any, superuser: Any, tmp_path: Path) -> None:
    append_events(4)
    checkpoint = audit_checkpoint()
    (tmp_path / "cp.json").write_text(json.dumps(checkpoint))
    client.force_login(superuser)
    path = download(client, "jsonl", tmp_path)
    assert verify_offline(path, "--checkpoint", str(tmp_path / "cp.json")).returncode == 0
    (tmp_path / "cp.json").write_text(json.dumps({**checkpoint, "digest": "b" * 64}))
    result = verify_offline(path, "--checkpoint", str(tmp_path / "cp.json"))
    assert result.returncode == 1 and "checkpoint" in result.stderr


@pytest.mark.django_db
def test_bad_export_requests(client: Any, superuser: Any) -> None:
    client.force_login(superuser)
    assert client.get("/audit/export.xml").status_code == 404
    response = client.get("/audit/export.csv", {"run": "not-a-uuid"})
    assert response.status_code == 302
    assert not AuditEvent.objects.filter(event_type=AuditEventType.AUDIT_EXPORTED).exists()
