"""Streamed exports, verified offline by scripts/verify_audit_export.py with the log's public key
only (issue 40): no AUDIT_HMAC_KEY, no database, no project code."""

from __future__ import annotations

import csv
import io
import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from django.http import StreamingHttpResponse

from apps.audit import notes
from apps.audit.checkpoints import log_origin
from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import audit_checkpoint
from tests.audit.offline import verify_offline
from tests.factories.audit import append_events


def download(client: Any, fmt: str, tmp_path: Path, **params: str) -> Path:
    response = client.get(f"/audit/export.{fmt}", params)
    assert response.status_code == 200, response.content[:500]
    assert isinstance(response, StreamingHttpResponse)
    assert "attachment" in response["Content-Disposition"]
    path = tmp_path / f"export.{fmt}"
    path.write_bytes(b"".join(response.streaming_content))
    return path


def impostor_vkey() -> str:
    """A key with the log's name that is not the log's key."""
    return notes.Signer(log_origin(), secrets.token_bytes(32)).verifier.vkey


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
    # Cut from the checkpoint taken with the export, whose own record (the next seq) is left out.
    assert (
        f"OK: {last_before_export.seq} rows verified in the tree of {last_before_export.seq + 1}"
        in result.stdout
    )
    assert f"of log {log_origin()}" in result.stdout

    exported = AuditEvent.objects.order_by("-seq").first()
    assert exported is not None and exported.event_type == AuditEventType.AUDIT_EXPORTED
    assert exported.actor_id == superuser.pk and exported.payload["format"] == fmt
    assert exported.seq == last_before_export.seq + 1  # the export covers everything before its record

    # Another key under the log's name proves nothing: no trusted signature.
    result = verify_offline(path, vkeys=[impostor_vkey()])
    assert result.returncode == 1 and "no signature from a trusted key" in result.stderr


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
    assert f"seq {row['seq']}: its inclusion proof does not reach the checkpoint's root" in result.stderr

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
    assert verify_offline(path).returncode == 0
    rows = list(csv.reader(io.StringIO(path.read_text(), newline="")))
    header = rows[0]
    rows[3][header.index("actor_label")] = "someone-else"
    buffer = io.StringIO()
    csv.writer(buffer).writerows(rows)
    path.write_text(buffer.getvalue())
    result = verify_offline(path)
    assert (
        result.returncode == 1 and "column 'actor_label' differs from the committed content" in result.stderr
    )


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_removed_middle_row_of_a_filtered_export_is_detected(
    client: Any, reviewer: Any, alpha: Any, tmp_path: Path, fmt: str
) -> None:
    """A filtered export has gaps between seqs by nature, so links cannot tell a removed row:
    the end record, signed by the log, counts and hashes every row (issue 40)."""
    for _ in range(4):
        append_events(1, team=alpha, event_type=AuditEventType.POOL_UPDATED)
        append_events(1, team=alpha, event_type=AuditEventType.TEAM_UPDATED)
    client.force_login(reviewer)
    path = download(client, fmt, tmp_path, type="pool.updated")
    assert verify_offline(path).returncode == 0
    lines = path.read_text().splitlines(keepends=True)
    first_row = 2 if fmt == "csv" else 1
    middle = first_row + 1
    path.write_text("".join(lines[:middle] + lines[middle + 1 :]))
    result = verify_offline(path)
    assert result.returncode == 1
    assert "the end record says 'rows 4" in result.stderr and "rows were removed or changed" in result.stderr


@pytest.mark.django_db
def test_a_checkpoint_signed_with_another_key_is_refused(
    client: Any, superuser: Any, alpha: Any, tmp_path: Path
) -> None:
    """Someone who rewrites an export and signs its checkpoint and end record with a key of
    their own (under the log's name, even) fails against the log's public key."""
    append_events(6, team=alpha)
    client.force_login(superuser)
    path = download(client, "jsonl", tmp_path)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    forger = notes.Signer(log_origin(), secrets.token_bytes(32))
    for record, field in ((records[0], "checkpoint"), (records[-1], "note")):
        text = notes.parse_note(record[field]).text
        record[field] = text + "\n" + forger.signature_line(text)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    result = verify_offline(path)
    assert result.returncode == 1
    assert "no signature from a trusted key" in result.stderr
    # With the forger's key it would pass: the trust is in the key, nothing else.
    assert verify_offline(path, vkeys=[forger.verifier.vkey]).returncode == 0


@pytest.mark.django_db
def test_filtered_export_respects_visibility_and_filters(
    client: Any, reviewer: Any, alpha: Any, beta: Any, tmp_path: Path
) -> None:
    append_events(6, team=alpha, event_type=AuditEventType.POOL_UPDATED)
    append_events(4, team=beta, event_type=AuditEventType.POOL_UPDATED)
    client.force_login(reviewer)
    path = download(client, "jsonl", tmp_path, type="pool.updated")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [records[0]["type"], records[-1]["type"]] == ["checkpoint", "end"]  # cut from a checkpoint
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
    result = verify_offline(path, "--checkpoint", tmp_path / "cp.json")
    assert result.returncode == 0, result.stderr
    (tmp_path / "cp.json").write_text(json.dumps({**checkpoint, "digest": "b" * 64}))
    result = verify_offline(path, "--checkpoint", tmp_path / "cp.json")
    assert result.returncode == 1 and "differs from your checkpoint" in result.stderr


@pytest.mark.django_db
def test_bad_export_requests(client: Any, superuser: Any) -> None:
    client.force_login(superuser)
    assert client.get("/audit/export.xml").status_code == 404
    response = client.get("/audit/export.csv", {"run": "not-a-uuid"})
    assert response.status_code == 302
    assert not AuditEvent.objects.filter(event_type=AuditEventType.AUDIT_EXPORTED).exists()
