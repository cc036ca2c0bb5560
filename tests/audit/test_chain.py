"""The chain: appends, append-only guards, and tamper detection by ``audit_verify``."""

from __future__ import annotations

import itertools
import json
import threading
from io import StringIO
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction

from apps.audit import merkle, notes
from apps.audit.chain import (
    GENESIS_DIGEST,
    PG_CREATED_US,
    PG_DISPLAY_ROW,
    canonical_json,
    column_mac,
    compute_digest,
)
from apps.audit.checkpoints import log_origin
from apps.audit.events import AuditEventType
from apps.audit.logkeys import log_signer
from apps.audit.models import AppendOnlyError, AuditChainHead, AuditEvent, SignedTreeHead
from apps.audit.services import audit_flush, audit_record, audit_record_standalone, event_content, hmac_key
from apps.audit.verify import verify_chain
from apps.core.request_context import RequestMeta, request_meta
from tests.factories.audit import append_events

pytestmark = pytest.mark.runtime


def run_verify(*args: str) -> tuple[int, str]:
    """Run the management command; (exit code, combined output)."""
    out, err = StringIO(), StringIO()
    try:
        call_command("audit_verify", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue() + err.getvalue()
    return 0, out.getvalue() + err.getvalue()


@pytest.mark.django_db
def test_appends_form_a_chain_that_verifies() -> None:
    events = append_events(5)
    first = AuditEvent.objects.order_by("seq").first()
    assert first is not None and first.seq == 1 and first.prev_digest == GENESIS_DIGEST
    seqs = list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    for prev, cur in itertools.pairwise(events):
        assert cur.prev_digest == prev.digest
        assert cur.digest == compute_digest(hmac_key(), event_content(cur), prev.digest)
    head = AuditChainHead.objects.get(pk=1)
    assert (head.seq, head.digest) == (events[-1].seq, events[-1].digest)
    code, output = run_verify()
    assert code == 0, output
    assert f"up to seq {events[-1].seq}" in output
    head.refresh_from_db()
    assert head.last_verified_ok is True and head.last_verified_at is not None
    assert head.last_verified_seq == events[-1].seq


@pytest.mark.django_db
def test_request_context_is_recorded_and_reread_digest_matches() -> None:
    with request_meta(RequestMeta(ip="2001:DB8::1", user_agent="pytest-agent", api_key_id=42)):
        event = audit_record_standalone(
            event_type=AuditEventType.APIKEY_DENIED, payload={"n": 1.5, "nested": {"b": [1, "x"]}}
        )
    assert event.seq is None  # pending until the sequencer numbers it
    audit_flush()
    stored = AuditEvent.objects.get(pk=event.pk)
    assert stored.ip == "2001:db8::1" and stored.user_agent == "pytest-agent" and stored.api_key_id == 42
    # The digest holds over what the database gives back, not only over what was written.
    assert compute_digest(hmac_key(), event_content(stored), stored.prev_digest) == stored.digest
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_model_refuses_update_and_delete() -> None:
    (event,) = append_events(1)
    event.payload = {"changed": True}
    with pytest.raises(AppendOnlyError):
        event.save()
    with pytest.raises(AppendOnlyError):
        event.delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).update(payload={})
    with pytest.raises(AppendOnlyError):
        AuditEvent.objects.filter(pk=event.pk).delete()
    with pytest.raises(AppendOnlyError):
        AuditEvent(seq=999, payload={}).save()
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_secrets_in_before_after_never_reach_the_row() -> None:
    secret = "sk-live-THIS-MUST-NOT-LEAK-1234567890"
    event = audit_record_standalone(
        event_type=AuditEventType.PROVIDER_UPDATED,
        before={"base_url": "http://a", "api_key": secret, "headers": {"Authorization": f"Bearer {secret}"}},
        after={"base_url": "http://b", "api_key": secret + "x", "client_secret": secret},
        payload={"password": secret, "api_key_env": "OPENAI_API_KEY"},
    )
    with connection.cursor() as cur:
        cur.execute(f"SELECT * FROM {AuditEvent._meta.db_table} WHERE id = %s", [event.pk])
        raw = json.dumps([str(v) for v in cur.fetchone()])
    assert secret not in raw and "THIS-MUST-NOT-LEAK" not in raw
    changes = AuditEvent.objects.get(pk=event.pk).payload["changes"]
    assert changes["base_url"] == {"before": "http://a", "after": "http://b"}
    # A rotated key shows as a change, without either value.
    assert changes["api_key"] == {"before": "••••", "after": "••••"}
    assert changes["client_secret"] == {"before": None, "after": "••••"}
    assert changes["headers"] == {"before": {"Authorization": "••••"}, "after": None}
    assert event.payload["api_key_env"] == "OPENAI_API_KEY"  # where a key lives is not a secret


# --- tampering ------------------------------------------------------------------------------------


@pytest.fixture
def chain(db: Any) -> list[AuditEvent]:
    append_events(8)
    return list(AuditEvent.objects.order_by("seq"))


def test_edited_payload_is_detected(chain: list[AuditEvent], tamper: Any) -> None:
    victim = chain[4]
    tamper.set_payload(victim.seq, json.dumps({"i": 999, "note": "rewritten by an attacker"}))
    result = verify_chain(key=hmac_key())
    assert not result.ok
    assert (result.broken_seq, result.reason) == (victim.seq, "edited")
    code, output = run_verify()
    assert code == 1
    assert f"seq={victim.seq}" in output and "reason=edited" in output
    head = AuditChainHead.objects.get(pk=1)
    assert head.last_verified_ok is False and head.last_verified_seq == victim.seq


def test_edited_last_row_is_detected(chain: list[AuditEvent], tamper: Any) -> None:
    tamper.set_payload(chain[-1].seq, json.dumps({"i": -1}))
    result = verify_chain(key=hmac_key())
    assert (result.ok, result.broken_seq, result.reason) == (False, chain[-1].seq, "edited")


def test_deleted_row_is_detected(chain: list[AuditEvent], tamper: Any) -> None:
    victim = chain[3]
    tamper.delete(victim.seq)
    result = verify_chain(key=hmac_key())
    assert (result.ok, result.broken_seq, result.reason) == (False, victim.seq, "deleted")
    code, output = run_verify()
    assert code == 1 and f"seq={victim.seq}" in output and "reason=deleted" in output


def test_deleted_tail_is_detected(chain: list[AuditEvent], tamper: Any) -> None:
    tamper.delete(chain[-1].seq)
    result = verify_chain(key=hmac_key())
    assert (result.ok, result.broken_seq, result.reason) == (False, chain[-1].seq, "deleted")


def test_swapped_rows_are_detected(chain: list[AuditEvent], tamper: Any) -> None:
    a, b = chain[2], chain[3]
    tamper.swap(a.seq, b.seq)
    result = verify_chain(key=hmac_key())
    assert (result.ok, result.broken_seq, result.reason) == (False, a.seq, "reordered")
    code, output = run_verify()
    assert code == 1 and f"seq={a.seq}" in output and "reason=reordered" in output


def test_swapped_distant_rows_are_detected(chain: list[AuditEvent], tamper: Any) -> None:
    a, b = chain[1], chain[5]
    tamper.swap(a.seq, b.seq)
    result = verify_chain(key=hmac_key())
    assert (result.ok, result.broken_seq, result.reason) == (False, a.seq, "reordered")


def test_forged_row_inserted_in_the_middle_is_detected(chain: list[AuditEvent], tamper: Any) -> None:
    at = chain[4].seq
    tamper.shift_from(at)
    # The forger links it to the real predecessor but cannot compute a valid HMAC without the key.
    tamper.insert_copy(
        like_seq=chain[1].seq,
        seq=at,
        prev_digest=chain[3].digest,
        digest="f" * 64,
        payload_json=json.dumps({"i": 0, "note": "forged approval"}),
    )
    result = verify_chain(key=hmac_key())
    assert (result.ok, result.broken_seq, result.reason) == (False, at, "inserted")
    code, output = run_verify()
    assert code == 1 and f"seq={at}" in output and "reason=inserted" in output


def test_forged_row_appended_at_the_tail_is_detected(chain: list[AuditEvent], tamper: Any) -> None:
    last = chain[-1]
    assert last.seq is not None and last.digest is not None
    forged_digest = compute_digest(b"not-the-key", event_content(last), last.digest)
    tamper.insert_copy(
        like_seq=last.seq,
        seq=last.seq + 1,
        prev_digest=last.digest,
        digest=forged_digest,
        payload_json=json.dumps({"i": 1}),
    )
    result = verify_chain(key=hmac_key())
    assert (result.ok, result.broken_seq, result.reason) == (False, last.seq + 1, "inserted")


def test_checkpoint_proves_a_rewrite_by_a_key_holder(
    chain: list[AuditEvent], tamper: Any, tmp_path: Any
) -> None:
    cp_file = tmp_path / "checkpoint.json"
    assert chain[-1].seq is not None and chain[1].digest is not None
    call_command("audit_checkpoint", "--out", str(cp_file), stdout=StringIO(), stderr=StringIO())
    checkpoint = json.loads(cp_file.read_text())
    assert (checkpoint["seq"], checkpoint["digest"]) == (chain[-1].seq, chain[-1].digest)
    recorded = AuditEvent.objects.get(seq=chain[-1].seq + 1)
    assert recorded.event_type == "audit.checkpoint"
    assert recorded.payload == {"checkpoint_seq": chain[-1].seq, "checkpoint_digest": chain[-1].digest}
    assert run_verify("--checkpoint", str(cp_file))[0] == 0

    # An insider with the HMAC key edits seq 3 and recomputes every digest, Merkle leaf and the
    # head after it.
    key = hmac_key()
    tamper.set_payload(chain[2].seq, json.dumps({"i": 2, "note": "quietly changed"}))
    prev = chain[1].digest
    for event in AuditEvent.objects.filter(seq__gte=chain[2].seq).order_by("seq"):
        assert event.seq is not None
        digest = compute_digest(key, event_content(event), prev)
        entry = canonical_json(event_content(event)).encode()
        leaf = merkle.leaf_hash(entry).hex()
        tamper.sql(
            "UPDATE {t} SET prev_digest = %s, digest = %s, leaf_hash = %s, entry = %s WHERE seq = %s",
            [prev, digest, leaf, entry, event.seq],
        )
        if connection.vendor == "postgresql":  # and the MAC over the columns as the server renders them
            with connection.cursor() as cur:
                cur.execute(
                    f"SELECT {PG_CREATED_US}, {PG_DISPLAY_ROW} FROM {AuditEvent._meta.db_table} WHERE seq = %s",
                    [event.seq],
                )
                created_us, display = cur.fetchone()
            mac = column_mac(key, digest, event.seq, created_us, bytes(display))
            tamper.sql("UPDATE {t} SET colmac = %s WHERE seq = %s", [mac, event.seq])
        prev = digest
    leaves = [
        bytes.fromhex(h) for h in AuditEvent.objects.order_by("seq").values_list("leaf_hash", flat=True)
    ]
    tree = merkle.Tree(leaves)
    frontier: list[list[object]] = []
    for leaf_bytes in leaves:
        frontier = merkle.frontier_append(frontier, leaf_bytes)
    AuditChainHead.objects.filter(pk=1).update(digest=prev, frontier=frontier)

    # The HMAC key alone no longer signs tree heads (issue 40): the checkpoints in the database,
    # signed with the Ed25519 key, still commit to the old tree.
    code, output = run_verify()
    assert code == 1 and "reason=rewritten" in output
    assert "checkpoint #" in output and "in the database: history was rewritten" in output

    # An operator holding the signing key too re-signs them: then only a head kept outside the
    # database (or a witness, tests/audit/test_witness.py) tells.
    signer = log_signer(log_origin())
    for sth in SignedTreeHead.objects.all():
        root = tree.root(sth.tree_size)
        body = notes.Checkpoint(sth.origin, sth.tree_size, root).text
        note = body + "\n" + signer.signature_line(body)
        SignedTreeHead.objects.filter(pk=sth.pk).update(root_hash=root.hex(), note=note)
    code, output = run_verify()
    assert code == 0, "a full recomputation with both keys is invisible without an outside head"
    code, output = run_verify("--checkpoint", str(cp_file))
    assert code == 1
    assert f"seq={checkpoint['seq']}" in output and "reason=rewritten" in output


def test_checkpoint_beyond_the_chain_fails(chain: list[AuditEvent], tmp_path: Any) -> None:
    cp_file = tmp_path / "cp.json"
    assert chain[-1].seq is not None
    cp_file.write_text(json.dumps({"seq": chain[-1].seq + 50, "digest": "a" * 64}))
    code, output = run_verify("--checkpoint", str(cp_file))
    assert code == 1 and "reason=deleted" in output


# --- PostgreSQL specifics -------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.django_db
def test_postgres_trigger_rejects_update_and_delete() -> None:
    (event,) = append_events(1)
    table = AuditEvent._meta.db_table
    for statement in (
        f"UPDATE {table} SET payload = '{{}}'::jsonb WHERE seq = %s",
        f"DELETE FROM {table} WHERE seq = %s",
    ):
        with (
            pytest.raises(DatabaseError, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cur,
        ):
            cur.execute(statement, [event.seq])
    assert AuditEvent.objects.get(pk=event.pk).payload == event.payload
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.distributed
@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_leave_one_unbroken_chain() -> None:
    writers, per_writer = 8, 25
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write(n: int) -> None:
        try:
            start.wait()
            for i in range(per_writer):
                with transaction.atomic():
                    audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"writer": n, "i": i})
        except BaseException as exc:  # surfaced below
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    audit_flush()
    rows = list(AuditEvent.objects.order_by("seq").values_list("seq", "prev_digest", "digest"))
    assert len(rows) == writers * per_writer
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    assert all(cur[1] == prev[2] for prev, cur in itertools.pairwise(rows))
    assert len({r[2] for r in rows}) == len(rows)
    result = verify_chain(key=hmac_key())
    assert result.ok and result.last_seq == len(rows), result
    assert settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


@pytest.mark.django_db
def test_time_never_goes_backwards_along_the_chain() -> None:
    from datetime import timedelta

    from django.utils import timezone

    (first,) = append_events(1)
    ahead = timezone.now() + timedelta(minutes=5)  # as if the previous writer's clock ran ahead
    AuditChainHead.objects.filter(pk=1).update(created_at=ahead)
    (second,) = append_events(1)
    assert second.created_at == ahead >= first.created_at
    assert AuditChainHead.objects.get(pk=1).created_at == ahead
    assert verify_chain(key=hmac_key()).ok
