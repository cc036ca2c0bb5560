"""The log's identity (origin) and its keys (issue 40): the origin names every checkpoint, keys
rotate without orphaning old checkpoints, a checkpoint signed by another key is a forgery, a
checkpoint of the empty log is consistent with every later one. (Heads of another log, and one
verdict for the UI and the CLI: test_another_log.py.)"""

from __future__ import annotations

import base64
import json
import re
import secrets
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from apps.audit import notes
from apps.audit.checkpoints import checkpoint_create, log_origin
from apps.audit.logkeys import log_signer
from apps.audit.models import AuditEvent, SignedTreeHead
from apps.audit.services import audit_checkpoint, hmac_key
from apps.audit.verify import verify_chain
from apps.workers.secrets import key_env_refusal
from tests.audit.offline import verify_offline
from tests.factories.audit import append_events


@pytest.mark.django_db
def test_the_origin_is_created_with_the_log_and_names_its_checkpoints() -> None:
    origin = log_origin()
    assert re.fullmatch(r"testserver/audit/[0-9a-f]{16}", origin)
    assert log_origin() == origin  # stable
    append_events(4)
    sth = checkpoint_create()
    opened = notes.open_note(sth.note, [log_signer(origin).verifier])
    assert opened.note.text == f"{origin}\n4\n{base64.b64encode(bytes.fromhex(sth.root_hash)).decode()}\n"
    assert [s.name for s in opened.note.signatures] == [origin]  # the key name is the origin
    assert checkpoint_create().pk == sth.pk  # the tree did not grow: the same checkpoint


@pytest.mark.django_db
def test_rotation_keeps_old_checkpoints_verifiable(settings: Any) -> None:
    origin = log_origin()
    append_events(3)
    old = checkpoint_create()
    old_key = log_signer(origin)
    settings.AUDIT_SIGNING_KEY = base64.b64encode(secrets.token_bytes(32)).decode()
    settings.AUDIT_SIGNING_KEYS_RETIRED = [notes.b64(old_key.public)]
    append_events(2)
    new = checkpoint_create()
    assert (
        notes.parse_note(new.note).signatures[0].key_id
        == log_signer(origin).verifier.key_id
        != old_key.verifier.key_id
    )
    result = verify_chain(key=hmac_key(), published_path="")
    assert result.ok, result.summary()
    assert "checked: 2 checkpoints in the database" in result.summary()
    out = StringIO()
    call_command("audit_keys", stdout=out)
    assert out.getvalue().split() == [log_signer(origin).verifier.vkey, old_key.verifier.vkey]  # signer first
    # Dropping the old public key orphans the old checkpoint: verify says which one, and where.
    settings.AUDIT_SIGNING_KEYS_RETIRED = []
    result = verify_chain(key=hmac_key(), published_path="")
    assert (result.ok, result.reason) == (False, "rewritten")
    assert (
        f"checkpoint #{old.pk} in the database for size 3 has no valid signature of this log's keys"
        in result.message
    )


@pytest.mark.django_db
def test_a_checkpoint_signed_with_another_key_is_a_forgery() -> None:
    origin = log_origin()
    append_events(5)
    checkpoint_create()
    forger = notes.Signer(origin, secrets.token_bytes(32))  # the log's name, not its key
    body = notes.Checkpoint(origin, 5, b"\x42" * 32).text
    forged = SignedTreeHead.objects.create(
        origin=origin,
        tree_size=5,
        root_hash=("42" * 32),
        timestamp_ms=0,
        note=body + "\n" + forger.signature_line(body),
    )
    result = verify_chain(key=hmac_key(), published_path="")
    assert (result.ok, result.reason) == (False, "rewritten")
    assert f"checkpoint #{forged.pk} in the database for size 5 has no valid signature" in result.message


@pytest.mark.django_db
def test_audit_keys_prints_what_the_offline_verifier_reads() -> None:
    out = StringIO()
    call_command("audit_keys", "--origin", stdout=out)
    assert out.getvalue().strip() == log_origin()
    out = StringIO()
    call_command("audit_keys", stdout=out)
    (vkey,) = out.getvalue().split()
    assert notes.parse_vkey(vkey) == log_signer(log_origin()).verifier
    out, err = StringIO(), StringIO()
    call_command("audit_keys", "--generate", stdout=out, stderr=err)
    value = out.getvalue().strip().removeprefix("AUDIT_SIGNING_KEY=")
    assert len(base64.b64decode(value)) == 32 and "AUDIT_SIGNING_KEYS_RETIRED" in err.getvalue()


@pytest.mark.django_db
def test_a_checkpoint_of_the_empty_log_is_consistent_with_every_later_one(tmp_path: Path) -> None:
    """Issue 40, item 4: a checkpoint taken at tree size 0 was reported as "history was
    rewritten" against any later one. The empty tree is consistent with every tree."""
    assert not AuditEvent.objects.exists()
    empty = audit_checkpoint()
    assert empty["seq"] == 0
    append_events(5)
    later = audit_checkpoint(since=empty)
    assert later["consistency"] == {"from_size": 0, "proof": []}
    (tmp_path / "old.json").write_text(json.dumps(empty))
    (tmp_path / "new.json").write_text(json.dumps(later))
    result = verify_offline("--consistency", tmp_path / "old.json", tmp_path / "new.json")
    assert result.returncode == 0, result.stderr
    assert f"tree of {later['seq']} is an append-only extension of the tree of 0" in result.stdout
    out, err = StringIO(), StringIO()
    call_command("audit_verify", "--checkpoint", str(tmp_path / "old.json"), stdout=out, stderr=err)
    assert out.getvalue().startswith("OK audit chain intact") and "checkpoint file" in out.getvalue()


@pytest.mark.django_db
def test_the_audit_page_shows_the_log_its_checkpoint_and_the_evidence_links(
    client: Any, reviewer: Any
) -> None:
    client.force_login(reviewer)
    html = client.get("/audit/").content.decode()
    assert f'data-testid="log-origin">{log_origin()}<' in html
    assert "none signed yet" in html and 'href="/audit/log/keys"' in html
    append_events(2)
    sth = checkpoint_create()
    html = client.get("/audit/?team=alpha").content.decode()
    assert f"size {sth.tree_size}, signed" in html and "no witness configured" in html
    assert 'href="/audit/evidence.zip?team=alpha"' in html


def test_the_signing_key_is_never_a_provider_key(settings: Any) -> None:
    settings.PROVIDER_KEY_ENV_ALLOWED = ["AUDIT_SIGNING_KEY"]  # even when an operator lists it
    refusal = key_env_refusal("AUDIT_SIGNING_KEY")
    assert refusal is not None and "AUDIT_SIGNING_KEY" in refusal
