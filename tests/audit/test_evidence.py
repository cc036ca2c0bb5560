"""The evidence pack (issue 40): one zip for a run, a team or a time range, holding the events
with their inclusion proofs, the checkpoints with signatures and cosignatures, the public keys,
the verifier and a README whose exact command verifies it; retention stated."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import transaction
from django.http import StreamingHttpResponse
from django.test import Client

from apps.audit.checkpoints import checkpoint_publish
from apps.audit.events import AuditEventType
from apps.audit.models import AuditEvent
from apps.audit.services import audit_flush, audit_run_event
from tests.audit.offline import log_vkeys
from tests.factories.audit import append_events, make_run
from tests.fixtures.audit import NAME, WitnessProcess


def _download(client: Any, url: str, params: dict[str, str] | None = None) -> zipfile.ZipFile:
    response = client.get(url, params or {})
    assert response.status_code == 200, response.content[:300]
    assert isinstance(response, StreamingHttpResponse)  # streamed, not built in memory
    assert response["Content-Type"] == "application/zip"
    return zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))


def _readme_command(archive: zipfile.ZipFile) -> list[str]:
    readme = archive.read("README.md").decode()
    block = readme.split("```\n", 2)[1]
    (line,) = [ln for ln in block.splitlines() if ln.strip()]
    return shlex.split(line)


def _run_readme_command(archive: zipfile.ZipFile, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """As the README says: unzip, then run its command there (python3 = this interpreter, -I)."""
    folder = tmp_path / "pack"
    archive.extractall(folder)
    command = _readme_command(archive)
    assert command[:2] == ["python3", "verify_audit_export.py"]
    return subprocess.run(
        [sys.executable, "-I", *command[1:]],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.django_db
def test_a_runs_evidence_pack_verifies_with_the_command_in_its_readme(
    client: Any, reviewer: Any, alpha: Any, owner: Any, tmp_path: Path
) -> None:
    alpha.retention_days = 30
    alpha.save(update_fields=["retention_days"])
    run = make_run(alpha, created_by=owner)
    with transaction.atomic():
        for kind in (AuditEventType.RUN_CREATED, AuditEventType.RUN_FINISHED):
            audit_run_event(event_type=kind, run=run, payload={"status": "succeeded"})
    append_events(3, team=alpha)  # not the run's
    audit_flush()
    client.force_login(reviewer)
    archive = _download(client, f"/audit/runs/{run.pk}/evidence.zip")
    names = set(archive.namelist())
    assert {
        "events.jsonl",
        "checkpoints/checkpoint.txt",
        "keys/log.vkey",
        "keys/witnesses.vkey",
        "verify_audit_export.py",
        "README.md",
        "manifest.json",
    } <= names
    assert archive.read("keys/log.vkey").decode().split() == log_vkeys()  # step 1 of the README
    readme = archive.read("README.md").decode()
    assert f"run {run.pk}" in readme
    assert "team `alpha`: run content (questions, answers, step instructions and outputs" in readme
    assert "erased 30 days after the run" in readme and "SHA-256 and length" in readme
    assert _readme_command(archive) == [
        "python3", "verify_audit_export.py", "--vkey-file", "keys/log.vkey", "events.jsonl",
    ]  # fmt: skip
    result = _run_readme_command(archive, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OK: 2 rows verified" in result.stdout
    # The checkpoint file is a plain C2SP note: transparency tooling reads it as is.
    assert archive.read("checkpoints/checkpoint.txt").decode().split("\n")[0].startswith("testserver/audit/")
    recorded = AuditEvent.objects.order_by("-seq").first()
    assert recorded is not None and recorded.payload == {
        "format": "evidence",
        "filters": {"run": str(run.pk)},
    }


@pytest.mark.runtime
@pytest.mark.django_db
def test_a_team_and_time_range_pack_carries_the_witnesses_and_their_command(
    witness: WitnessProcess,
    client: Any,
    reviewer: Any,
    alpha: Any,
    beta: Any,
    tmp_path: Path,
) -> None:
    append_events(4, team=alpha)
    append_events(2, team=beta)
    sth = checkpoint_publish()  # cosigned by the witness
    append_events(2, team=alpha)
    client.force_login(reviewer)
    archive = _download(client, "/audit/evidence.zip", {"team": "alpha", "since": "2000-01-01"})
    assert f"checkpoints/witnessed-{sth.tree_size}.txt" in archive.namelist()
    assert f"— {NAME} " in archive.read(f"checkpoints/witnessed-{sth.tree_size}.txt").decode()
    assert archive.read("keys/witnesses.vkey").decode().split() == [witness.vkey]
    assert "--witness-file keys/witnesses.vkey" in " ".join(_readme_command(archive))
    readme = archive.read("README.md").decode()
    assert "team `alpha`: no `retention_days`" in readme and "`beta`" not in readme
    result = _run_readme_command(archive, tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"cosigned by: {NAME} size {sth.tree_size}" in result.stdout
    events = [line for line in archive.read("events.jsonl").decode().splitlines() if '"seq"' in line]
    assert all(f'"team_id":{alpha.pk}' in line for line in events) and len(events) >= 6


@pytest.mark.django_db
def test_evidence_packs_refuse_who_may_not_review_and_bad_parameters(
    client: Any, owner: Any, outsider: Any, alpha: Any
) -> None:
    run = make_run(alpha, created_by=owner)
    client.force_login(owner)
    response = client.get(f"/audit/runs/{run.pk}/evidence.zip")
    assert response.status_code == 403 and b"review_team_runs" in response.content
    client.force_login(outsider)
    assert client.get(f"/audit/runs/{run.pk}/evidence.zip").status_code == 404
    response = client.get("/audit/evidence.zip", {"since": "yesterday-ish"})
    assert response.status_code == 400 and b"since" in response.content
    assert not AuditEvent.objects.filter(event_type=AuditEventType.AUDIT_EXPORTED).exists()


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_the_pack_streams_through_daphne(
    daphne_server: Any, superuser: Any, alpha: Any, tmp_path: Path
) -> None:
    append_events(600, team=alpha)  # more than one streamed batch of rows
    client = Client()
    client.force_login(superuser)
    cookies = {"sessionid": client.cookies["sessionid"].value}
    chunks = []
    with httpx.stream(
        "GET", f"{daphne_server.url}/audit/evidence.zip", cookies=cookies, timeout=120
    ) as response:
        assert response.status_code == 200 and response.headers["content-type"] == "application/zip"
        assert response.headers.get("content-length") is None  # streamed, not buffered
        chunks = list(response.iter_bytes())
    assert "consume synchronous iterators" not in daphne_server.log.read_text()
    archive = zipfile.ZipFile(io.BytesIO(b"".join(chunks)))
    result = _run_readme_command(archive, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OK: " in result.stdout and "rows verified" in result.stdout
