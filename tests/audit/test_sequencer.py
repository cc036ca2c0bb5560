"""The sequenced, Merkle-tree audit log: sequencer, proofs, signed tree heads, triggers (issue #15)."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from django.db import DatabaseError, IntegrityError, close_old_connections, connection, transaction
from django.db.backends.signals import connection_created

from apps.audit import merkle, notes
from apps.audit.checkpoints import checkpoint_publish, log_origin
from apps.audit.events import AuditEventType
from apps.audit.logkeys import log_signer, log_verifiers
from apps.audit.models import AuditChainHead, AuditEvent, SignedTreeHead
from apps.audit.proofs import StreamedTree
from apps.audit.sequencer import (
    ADVISORY_KEY,
    _lock,
    _tick,
    audit_flush,
    batch_pause,
    sequencer_lag,
    standby_look,
)
from apps.audit.services import audit_checkpoint, audit_record, hmac_key
from apps.audit.verify import verify_chain
from tests.audit.offline import verify_offline
from tests.factories.audit import append_events
from tests.fixtures.core import ROOT, subprocess_env
from tests.fixtures.waits import wait_until


def _rfc_mth(leaves: list[bytes]) -> bytes:
    """RFC 9162 2.1.1 written recursively, as the reference."""
    if not leaves:
        return merkle.EMPTY_ROOT
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return merkle.node_hash(_rfc_mth(leaves[:k]), _rfc_mth(leaves[k:]))


def test_merkle_matches_rfc_and_proofs_verify_and_fail_on_tamper() -> None:
    leaves = [merkle.leaf_hash(f"entry {i}".encode()) for i in range(37)]
    frontier: list[list[object]] = []
    for n in range(1, len(leaves) + 1):
        frontier = merkle.frontier_append(frontier, leaves[n - 1])
        tree = merkle.Tree(leaves[:n])
        assert tree.root() == _rfc_mth(leaves[:n]) == merkle.frontier_root(frontier)
        for i in range(n):
            proof = tree.inclusion_proof(i)
            assert merkle.verify_inclusion(leaves[i], i, n, proof, tree.root())
            assert not merkle.verify_inclusion(leaves[(i + 1) % n], i, n, proof, tree.root()) or n == 1
        for m in range(1, n + 1):
            proof = tree.consistency_proof(m)
            assert merkle.verify_consistency(m, n, tree.root(m), tree.root(), proof)
            if m < n:
                bad_old = merkle.node_hash(tree.root(m), b"x" * 32)
                assert not merkle.verify_consistency(m, n, bad_old, tree.root(), proof)


@pytest.mark.django_db
def test_record_is_pending_until_sequenced_and_lag_shows_it() -> None:
    append_events(3)
    with transaction.atomic():
        pending = audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"pending": True})
    assert pending.seq is None
    lag = sequencer_lag()
    assert lag.pending == 1 and lag.oldest_age_s is not None and lag.head_seq == 3
    assert audit_flush() == 1
    pending.refresh_from_db()
    assert pending.seq == 4 and pending.digest and pending.leaf_hash
    assert sequencer_lag().pending == 0
    head = AuditChainHead.objects.get(pk=1)
    leaves = [
        bytes.fromhex(h) for h in AuditEvent.objects.order_by("seq").values_list("leaf_hash", flat=True)
    ]
    assert merkle.frontier_root(head.frontier) == merkle.root_of(leaves)
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_record_rolls_back_with_the_change() -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"doomed": True})
        raise RuntimeError("the change fails")
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db
def test_trigger_rejects_update_and_delete_on_both_backends() -> None:
    (event,) = append_events(1)
    table = AuditEvent._meta.db_table
    json_param = "%s::jsonb" if connection.vendor == "postgresql" else "%s"
    statements = [
        (f"UPDATE {table} SET payload = {json_param} WHERE id = %s", ['{"x": 1}', event.pk]),
        (f"UPDATE {table} SET seq = 99 WHERE id = %s", [event.pk]),
        (f"DELETE FROM {table} WHERE id = %s", [event.pk]),
    ]
    with transaction.atomic():
        pending = audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"p": 1})
    # Even a pending row's content is frozen: only the sequencing columns may be set.
    statements.append(
        (f"UPDATE {table} SET seq = 50, payload = {json_param} WHERE id = %s", ['{"forged": 1}', pending.pk])
    )
    for sql, params in statements:
        with (
            pytest.raises((DatabaseError, IntegrityError), match="append-only"),
            transaction.atomic(),
            connection.cursor() as cur,
        ):
            cur.execute(sql, params)
    assert AuditEvent.objects.get(pk=event.pk).payload == event.payload
    assert audit_flush() == 1  # the sequencer's own UPDATE still passes
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_tail_deletion_with_head_rollback_is_caught_by_the_published_head(
    tamper: Any, tmp_path: Path, settings: Any
) -> None:
    settings.AUDIT_STH_PUBLISH_PATH = str(tmp_path / "sth.jsonl")
    events = append_events(6)
    published = checkpoint_publish()
    assert published.tree_size == 6
    line = json.loads((tmp_path / "sth.jsonl").read_text().splitlines()[-1])
    assert (line["origin"], line["tree_size"]) == (log_origin(), 6)
    opened = notes.open_note(line["checkpoint"], log_verifiers(log_origin()))  # a C2SP checkpoint
    assert notes.parse_checkpoint(opened.note.text).size == 6
    assert verify_chain(key=hmac_key()).ok
    # The attacker deletes the two newest events, rolls the head back and drops the DB's STHs.
    tamper.delete(events[-1].seq)
    tamper.delete(events[-2].seq)
    SignedTreeHead.objects.all().delete()
    four = events[-3]
    leaves = [
        bytes.fromhex(h) for h in AuditEvent.objects.order_by("seq").values_list("leaf_hash", flat=True)
    ]
    frontier: list[list[object]] = []
    for leaf in leaves:
        frontier = merkle.frontier_append(frontier, leaf)
    AuditChainHead.objects.filter(pk=1).update(seq=four.seq, digest=four.digest, frontier=frontier)
    result = verify_chain(key=hmac_key(), published_path="")  # without the published head: passes
    assert result.ok
    result = verify_chain(key=hmac_key())  # with it (read from AUDIT_STH_PUBLISH_PATH)
    assert (result.ok, result.reason) == (False, "deleted")
    assert f"published checkpoint ({tmp_path / 'sth.jsonl'}, line 1) covers 6 events" in result.message


@pytest.mark.django_db
def test_incremental_verify_resumes_from_the_last_verification(tamper: Any) -> None:
    from apps.audit.verify import verify_and_record

    append_events(20)
    assert verify_and_record(key=hmac_key()).ok
    later = append_events(5)
    result = verify_and_record(key=hmac_key(), incremental=True)
    assert result.ok and result.last_seq == 25 and later[-1].seq == 25
    newest = append_events(5)
    tamper.set_payload(newest[2].seq, json.dumps({"i": -1}))
    result = verify_chain(key=hmac_key(), incremental=True)
    assert (result.ok, result.broken_seq, result.reason) == (False, newest[2].seq, "edited")


def _offline(*args: str) -> subprocess.CompletedProcess[str]:
    return verify_offline(*args)


@pytest.mark.django_db
def test_checkpoints_carry_a_consistency_proof_verified_offline(tamper: Any, tmp_path: Path) -> None:
    append_events(5)
    old = audit_checkpoint()
    append_events(7)
    new = audit_checkpoint(since=old)
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    result = _offline("--consistency", str(tmp_path / "old.json"), str(tmp_path / "new.json"))
    assert result.returncode == 0, result.stderr
    assert f"tree of {new['seq']} is an append-only extension" in result.stdout
    # A proof against a rewritten old tree fails (re-signed with the log's own key, as its
    # operator could: only the proof can tell).
    size = notes.parse_checkpoint(notes.parse_note(old["checkpoint"]).text).size
    body = notes.Checkpoint(log_origin(), size, b"\xab" * 32).text
    forged = {**old, "checkpoint": body + "\n" + log_signer(log_origin()).signature_line(body)}
    (tmp_path / "forged.json").write_text(json.dumps(forged))
    result = _offline("--consistency", str(tmp_path / "forged.json"), str(tmp_path / "new.json"))
    assert result.returncode == 1 and "history was rewritten" in result.stderr
    # A forged signature fails too.
    note = notes.parse_note(old["checkpoint"])
    bad = note.text + "\n" + note.signatures[0].line[:-10] + "AAAAAAAAA=\n"
    (tmp_path / "badsig.json").write_text(json.dumps({**old, "checkpoint": bad}))
    result = _offline("--consistency", str(tmp_path / "badsig.json"), str(tmp_path / "new.json"))
    assert result.returncode == 1 and "does not verify" in result.stderr


def _export(client: Any, tmp_path: Path, fmt: str = "jsonl") -> Path:
    response = client.get(f"/audit/export.{fmt}")
    assert response.status_code == 200
    path = tmp_path / f"export.{fmt}"
    path.write_bytes(b"".join(response.streaming_content))
    return path


@pytest.mark.django_db
@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_export_tail_truncation_fails_offline(client: Any, superuser: Any, tmp_path: Path, fmt: str) -> None:
    append_events(12)
    client.force_login(superuser)
    path = _export(client, tmp_path, fmt)
    result = _offline(str(path), "--contiguous")
    assert result.returncode == 0, result.stderr
    assert "12 rows verified in the tree of 13" in result.stdout
    lines = path.read_text().splitlines()
    # (b) cut the file short: the last two rows and the end record are gone.
    path.write_text("\n".join(lines[:-3]) + "\n")
    result = _offline(str(path))
    assert result.returncode == 1 and "truncated" in result.stderr
    # Drop the last two rows but keep the end record: the count and span no longer match.
    path.write_text("\n".join([*lines[:-3], lines[-1]]) + "\n")
    result = _offline(str(path))
    assert result.returncode == 1 and "the end record says 'rows 12 1 12'" in result.stderr


@pytest.mark.django_db
def test_export_inclusion_proofs_fail_on_each_tamper_kind(
    client: Any, superuser: Any, tmp_path: Path
) -> None:
    append_events(9)
    client.force_login(superuser)
    path = _export(client, tmp_path)
    lines = path.read_text().splitlines()
    rows = [json.loads(line) for line in lines[1:-1]]

    def check(new_rows: list[dict[str, Any]], needle: str) -> None:
        path.write_text("\n".join([lines[0], *(json.dumps(r) for r in new_rows), lines[-1]]) + "\n")
        result = _offline(str(path))
        assert result.returncode == 1 and needle in result.stderr, result.stderr

    # Edit, recomputing the HMAC is impossible without the key; the leaf no longer proves in.
    edited = dict(rows[4])
    edited["canonical"] = edited["canonical"].replace('"note":"event', '"note":"changed')
    edited["content"] = json.loads(edited["canonical"])
    check([*rows[:4], edited, *rows[5:]], "inclusion proof does not reach")
    check([*rows[:4], *rows[5:]], "rows were removed")  # delete
    check([*rows[:3], rows[4], rows[3], *rows[5:]], "out of order")  # swap
    forged = {**rows[2], "proof": rows[3]["proof"]}  # insert a copy claiming another proof
    check([*rows[:3], forged, *rows[3:]], "inclusion proof does not reach")
    bad_head = json.loads(lines[0])
    note = notes.parse_note(bad_head["checkpoint"])
    origin, size, _root = note.text.split("\n")[:3]
    bad_head["checkpoint"] = note.with_lines([]).replace(note.text, f"{origin}\n{size}\n{'zQ' * 21}zQ=\n")
    path.write_text("\n".join([json.dumps(bad_head), *lines[1:]]) + "\n")
    assert "does not verify" in _offline(str(path)).stderr


# --- several processes -----------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import sys, django
    django.setup()
    from django.db import transaction
    from apps.audit.events import AuditEventType
    from apps.audit.services import audit_record
    n, count = int(sys.argv[1]), int(sys.argv[2])
    for i in range(count):
        with transaction.atomic():
            audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"writer": n, "i": i})
    print("done", flush=True)
    """
)

SEQUENCER = textwrap.dedent(
    """
    import os, sys, django
    django.setup()
    from django.db import OperationalError, connection
    from apps.audit.sequencer import sequence_pass
    def on_row(seq):
        if seq == int(sys.argv[1]):
            print("mid-batch", flush=True)
            sys.stdin.readline()  # the test writes nothing more: holds the transaction open until SIGKILLed
            os._exit(1)  # stdin closed (the test went away): leave without committing
    print("ready", flush=True)
    sys.stdin.readline()  # "go": the test has just committed pending rows
    for attempt in range(30):  # SQLite: another connection may hold the write lock briefly
        try:
            n = sequence_pass(on_row=on_row)
            break
        except OperationalError as exc:
            # SQLite's busy handler already waited (the 30 s timeout) before raising: retry at once.
            print(f"retry: {exc}", file=sys.stderr, flush=True)
            connection.close()
    print("empty", flush=True)  # another process's sequencer numbered them first
    """
)


@pytest.mark.django_db(transaction=True)
def test_writer_processes_give_one_gap_free_sequence_with_a_valid_tree() -> None:
    writers, per_writer = 4, 15
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(n), str(per_writer)],
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(writers)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0 and "done" in out, err[-2000:]
    audit_flush()
    rows = list(AuditEvent.objects.order_by("seq").values_list("seq", "prev_digest", "digest", "payload"))
    assert [r[0] for r in rows] == list(range(1, writers * per_writer + 1))
    assert all(cur[1] == prev[2] for prev, cur in itertools.pairwise(rows))
    for n in range(writers):  # each writer's own events keep their order
        mine = [r[3]["i"] for r in rows if r[3]["writer"] == n]
        assert mine == list(range(per_writer))
    sth = checkpoint_publish()
    assert StreamedTree(sth.tree_size).root().hex() == sth.root_hash
    assert verify_chain(key=hmac_key()).ok


def _advisory_waiters(conn: Any) -> int:
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()
    return int(row[0])


def _hold_sequencer_lock() -> Any:
    """PostgreSQL: take the sequencer's advisory lock in a side connection (None on SQLite)."""
    if connection.vendor != "postgresql":
        return None
    import psycopg

    from apps.audit.sequencer import ADVISORY_KEY
    from tests.fixtures.core import test_database_url

    side = psycopg.connect(test_database_url().replace("postgres://", "postgresql://"), autocommit=True)
    side.execute("SELECT pg_advisory_lock(%s)", [ADVISORY_KEY])
    return side


def _hand_lock_to_waiter(side: Any) -> None:
    """Release the lock once the subprocess queues for it: PostgreSQL grants it to the waiter."""
    if side is None:
        return
    # PostgreSQL announces nothing when a session starts waiting for a lock: a condition wait.
    wait_until(lambda: _advisory_waiters(side), 60, "the subprocess to queue for the sequencer lock")
    side.execute("SELECT pg_advisory_unlock_all()")
    side.close()


def _queue_for_sequencer_lock() -> Any:
    """PostgreSQL: a side connection blocks on the lock in a thread; returns a join -> connection."""
    import threading

    if connection.vendor != "postgresql":
        return lambda: None
    import psycopg

    from apps.audit.sequencer import ADVISORY_KEY
    from tests.fixtures.core import test_database_url

    side = psycopg.connect(test_database_url().replace("postgres://", "postgresql://"), autocommit=True)
    thread = threading.Thread(target=side.execute, args=("SELECT pg_advisory_lock(%s)", [ADVISORY_KEY]))
    thread.start()
    with psycopg.connect(
        test_database_url().replace("postgres://", "postgresql://"), autocommit=True
    ) as probe:
        # As in _hand_lock_to_waiter: no event says the side connection now waits.
        wait_until(lambda: _advisory_waiters(probe), 60, "the side connection to queue for the lock")

    def join() -> Any:
        thread.join(timeout=60)
        return side

    return join


@pytest.mark.django_db(transaction=True)
def test_sequencer_killed_mid_batch_loses_nothing() -> None:
    # Other sequencers may run in this session (daphne's thread, Celery workers'): on PostgreSQL
    # the test hands the advisory lock to the subprocess; on SQLite a lost race is retried.
    append_events(3)
    for _attempt in range(10):
        # A lost race leaves the last attempt's rows to another sequencer, which may commit them
        # after this read: number them here first, so the head read is this attempt's base.
        audit_flush()
        base = AuditChainHead.objects.get(pk=1).seq
        proc = subprocess.Popen(
            [sys.executable, "-c", SEQUENCER, str(base + 5)],
            cwd=ROOT,
            env=subprocess_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
            blocker = _hold_sequencer_lock()
            with transaction.atomic():
                for i in range(10):
                    audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"i": i})
            proc.stdin.write("go\n")
            proc.stdin.flush()
            _hand_lock_to_waiter(blocker)
            line = proc.stdout.readline().strip()
            if line == "empty":
                continue
            assert line == "mid-batch", proc.stderr.read() if proc.stderr else ""  # 5 numbered, uncommitted
            # Queue for the lock behind the doomed pass, so we (not a Celery worker) get it next.
            queued = _queue_for_sequencer_lock()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            break
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    else:
        pytest.fail("the subprocess never got to sequence the rows")
    side = queued()
    lag = sequencer_lag()
    # The killed pass committed nothing: its rows are pending (the gap shows), or, on SQLite,
    # the next sequencer (daphne's) already numbered all ten.
    assert (lag.pending, lag.head_seq) in {(10, base), (0, base + 10)}
    if side is not None:
        assert (lag.pending, lag.head_seq) == (10, base)
        side.execute("SELECT pg_advisory_unlock_all()")
        side.close()
    audit_flush()
    seqs = list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, base + 11)) and sequencer_lag().pending == 0
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.django_db
def test_lag_on_healthz_and_pending_rows_in_the_audit_ui(client: Any, superuser: Any) -> None:
    append_events(2)
    with transaction.atomic():
        audit_record(event_type=AuditEventType.POOL_UPDATED, payload={"late": True})
    body = client.get("/healthz").json()
    assert body["audit_sequencer"]["pending"] == 1 and body["audit_sequencer"]["head_seq"] == 2
    assert body["audit_sequencer"]["oldest_pending_age_s"] is not None
    assert body["audit_sequencer"]["this_process"] in {"none", "active", "standby", "standing in"}
    client.force_login(superuser)
    html = client.get("/audit/").content.decode()
    assert "data-pending=" in html and "1 pending" in html
    audit_flush()
    assert client.get("/healthz").json()["audit_sequencer"]["pending"] == 0
    html = client.get("/audit/").content.decode()
    assert "data-pending=" not in html and 'data-seq="3"' in html and "up to date" in html


@pytest.mark.django_db(transaction=True)
def test_parallel_chunked_verify_finds_the_same_first_break(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.audit import verify as verify_module
    from tests.factories.audit import Tamper

    monkeypatch.setattr(verify_module, "CHUNK_LEAVES", 4)  # 19 events: five chunks, two processes
    events = append_events(19)
    checkpoint_publish()
    result = verify_chain(key=hmac_key(), workers=2)
    assert result.ok and result.last_seq == 19, result
    with Tamper() as tamper:
        tamper.set_payload(events[9].seq, json.dumps({"i": 99}))
        result = verify_chain(key=hmac_key(), workers=2)
        assert (result.ok, result.broken_seq, result.reason) == (False, 10, "edited")
        assert result == verify_chain(key=hmac_key(), workers=1)
        tamper.swap(8, 9)  # across a chunk boundary, before the edit
        result = verify_chain(key=hmac_key(), workers=2)
        assert (result.ok, result.broken_seq, result.reason) == (False, 8, "reordered")
        for seq in (13, 14, 15, 16):  # a whole chunk
            tamper.delete(seq)
        tamper.swap(8, 9)
        tamper.set_payload(10, events[9].payload and json.dumps(events[9].payload))
        result = verify_chain(key=hmac_key(), workers=2)
        assert (result.ok, result.broken_seq, result.reason) == (False, 13, "deleted")


@pytest.mark.django_db(transaction=True)
def test_the_sequencer_thread_keeps_its_connection_between_ticks() -> None:
    """Each wake-up used to close the thread's connection and the next one to open it again (on
    SQLite its PRAGMAs; 12% of a busy server's GIL samples). Now the thread keeps it, a pooled one
    too: checking it out of the pool again cost a health-check round trip per pass."""
    opened: list[str] = []
    outcomes: list[tuple[bool, int]] = []
    held_after_tick: list[bool] = []

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        opened.append(threading.current_thread().name)

    def sequencer_thread() -> None:
        # Other sequencers on this database (the distributed phase's session Celery worker) could
        # hold the lock during a tick, which then sequences nothing: a session-level hold on this
        # thread's one connection keeps them out, and its own ticks re-enter it.
        hold = connection.vendor == "postgresql"
        try:
            if hold:
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_lock(%s)", [ADVISORY_KEY])
            for _ in range(3):
                with transaction.atomic():
                    audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"tick": True})
                ok = _tick(publish_sth=False)
                held_after_tick.append(connection.connection is not None)
                outcomes.append((ok, sequencer_lag().pending))
        finally:
            if hold:  # before the connection goes back to the pool
                with connection.cursor() as cur:
                    cur.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])
            close_old_connections()
            connection.close()

    connection_created.connect(on_connection)
    try:
        thread = threading.Thread(target=sequencer_thread, name="audit-sequencer-test")
        thread.start()
        thread.join(60)
    finally:
        connection_created.disconnect(on_connection)
    assert outcomes == [(True, 0)] * 3, outcomes  # every tick sequenced what was pending
    mine = [name for name in opened if name == "audit-sequencer-test"]
    assert held_after_tick == [True] * 3  # kept between ticks
    assert mine == ["audit-sequencer-test"], opened  # one connection for all three ticks
    assert verify_chain(key=hmac_key()).ok


def test_a_busy_sequencer_makes_one_pass_per_gap_and_an_idle_one_waits_only_the_window() -> None:
    """Passes start at least AUDIT_SEQUENCER_MIN_GAP_MS apart under load (one transaction over
    everything committed in the gap, not one per commit: issue #15); a lone commit on an idle
    server waits only the window."""
    window, gap = 0.005, 0.05
    assert batch_pause(since_last_pass=10.0, window_s=window, gap_s=gap) == window  # idle
    assert batch_pause(since_last_pass=0.0, window_s=window, gap_s=gap) == gap  # right after a pass
    assert batch_pause(since_last_pass=0.02, window_s=window, gap_s=gap) == pytest.approx(0.03)
    assert batch_pause(since_last_pass=0.049, window_s=window, gap_s=gap) == window
    assert batch_pause(since_last_pass=0.0, window_s=window, gap_s=0) == window  # gap switched off


@pytest.mark.django_db(transaction=True)
def test_a_standing_by_sequencer_passes_only_when_rows_have_waited() -> None:
    """Distributed web processes stand by (issue #15): at load the Celery workers' sequencers pass
    every few milliseconds and a second process contending for the lock paid a pass's fixed cost
    again (11% of a busy daphne's CPU). A standby passes only when rows have waited
    ``standby_s``, so with every worker stopped the log still gets sequenced."""
    audit_flush()
    # Every other sequencer on this database (the distributed phase's session Celery worker, a
    # live daphne) would take the row at any moment (CI caught one mid-pass). One transaction
    # holding their lock keeps them out; this connection's own pass re-enters it.
    with transaction.atomic():
        _lock(wait=True)
        assert standby_look(0.0) is False  # nothing pending: nothing due, even at once
        event = audit_record(event_type=AuditEventType.TEAM_UPDATED, payload={"standby": 1})
        assert standby_look(3600.0) is False  # a fresh row is the active sequencer's
        assert AuditEvent.objects.get(pk=event.pk).seq is None
        assert standby_look(0.0) is True  # a row that has waited long enough: sequenced here
        assert AuditEvent.objects.get(pk=event.pk).seq is not None
    assert verify_chain(key=hmac_key()).ok


@pytest.mark.parametrize(("backend", "standby"), [("thread", False), ("celery", True)])
def test_servers_stand_by_only_in_the_distributed_mode(
    settings: Any, monkeypatch: pytest.MonkeyPatch, backend: str, standby: bool
) -> None:
    from conductor_web import background

    started: list[dict[str, bool]] = []
    settings.EXECUTION_BACKEND = backend
    monkeypatch.setattr(background, "start_sequencer_thread", lambda **kw: started.append(kw))
    monkeypatch.setattr(background, "start_lease_keeper", lambda **kw: None)
    monkeypatch.setattr(background, "start_sweeper", lambda: None)
    background.start_server_background()
    # Embedded: the server is the one sequencer and publishes tree heads (beat does, distributed).
    assert started == [{"publish": not standby, "standby": standby}]


def test_a_standing_by_sequencer_refuses_to_publish_tree_heads() -> None:
    from apps.audit.sequencer import start_sequencer_thread

    # Beat publishes in the distributed mode; a standby that also did would publish twice.
    with pytest.raises(ValueError, match="does not publish"):
        start_sequencer_thread(publish=True, standby=True)
