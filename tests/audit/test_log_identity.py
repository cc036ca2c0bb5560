"""The log's identity (origin) and its keys (issue 40): heads of another log are never taken for
tampering, every verdict names its heads' source, the UI and the CLI give one verdict, keys
rotate without orphaning old checkpoints, and a checkpoint signed by another key is a forgery."""

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
from django.test import Client

from apps.audit import notes
from apps.audit.checkpoints import checkpoint_create, log_origin
from apps.audit.logkeys import log_signer
from apps.audit.models import AuditChainHead, AuditEvent, SignedTreeHead
from apps.audit.services import audit_checkpoint, hmac_key
from apps.audit.tasks import audit_sth_publish
from apps.audit.verify import verify_chain
from apps.governance.models import Role
from apps.workers.secrets import key_env_refusal
from tests.audit.offline import verify_offline
from tests.factories.audit import append_events
from tests.factories.governance import TeamFactory, member_of


def cli_verify() -> tuple[int, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("audit_verify", stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), (out.getvalue() + err.getvalue()).strip()
    return 0, (out.getvalue() + err.getvalue()).strip()


def ui_verify(client: Client) -> str:
    response = client.post("/audit/verify/", follow=True)
    assert response.status_code == 200
    (message,) = [str(m) for m in response.context["messages"]]
    return message


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_fresh_database_on_a_checkout_with_another_databases_heads_verifies_intact(
    settings: Any, tmp_path: Path
) -> None:
    """`make clean && make demo`, or the same checkout pointed at PostgreSQL: the published
    heads of the old database stay in var/. They belong to another log; the verdict says so and
    names the file, and the UI and the CLI say the same thing."""
    published = tmp_path / "audit-sth.jsonl"
    settings.AUDIT_STH_PUBLISH_PATH = str(published)
    append_events(12)
    audit_sth_publish()  # the timer's task: signs the head, appends it to the file
    assert published.read_text().count("\n") == 1
    call_command("flush", interactive=False, verbosity=0)  # another database: a fresh log
    reviewer = member_of(TeamFactory(slug="fresh"), Role.REVIEWER)
    append_events(3)
    head = AuditChainHead.objects.get(pk=1).seq
    client = Client()
    client.force_login(reviewer)

    code, cli = cli_verify()
    ui = ui_verify(client)
    assert code == 0, cli
    assert cli.startswith("OK audit chain intact: ")
    assert re.sub(r" \(\d+\.\d+s\)$", "", cli.removeprefix("OK ")) == ui  # one verdict, one text
    assert f"audit chain intact: {head} events verified up to seq {head}" in ui
    assert "not checked: another log (testserver/audit/" in ui and f"1 head in {published}" in ui
    assert f"no published checkpoint of this log in {published}" in ui
    assert f"log {log_origin()}" in ui
    assert AuditChainHead.objects.get(pk=1).last_verify_message == ui  # what the audit page shows


@pytest.mark.runtime
@pytest.mark.django_db(transaction=True)
def test_a_broken_verdict_names_the_head_and_its_source_in_the_ui_and_the_cli(
    settings: Any, tmp_path: Path, tamper: Any, reviewer: Any
) -> None:
    published = tmp_path / "audit-sth.jsonl"
    settings.AUDIT_STH_PUBLISH_PATH = str(published)
    events = append_events(8)
    size = audit_sth_publish()
    SignedTreeHead.objects.all().delete()  # the attacker's database no longer has its heads...
    tamper.delete(events[-1].seq)  # ... and the newest event is gone, the head rolled back
    AuditChainHead.objects.filter(pk=1).update(seq=events[-2].seq, digest=events[-2].digest)
    client = Client()
    client.force_login(reviewer)
    code, cli = cli_verify()
    ui = ui_verify(client)
    assert code == 1
    assert f"published checkpoint ({published}, line 1) covers {size} events: its tail was deleted" in ui
    assert cli.startswith(f"BROKEN seq={size} reason=deleted: ")
    assert ui.startswith(f"audit chain BROKEN at seq {size}: deleted — ")
    assert cli.split(": ", 1)[1] in ui  # the same message and the same sources


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
