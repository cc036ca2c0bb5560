"""The one sequencer: numbers pending audit rows, chains them, grows the Merkle tree.

Writers only INSERT pending rows (``seq`` NULL) inside their own transaction, so no writer waits
on a global lock. A sequencing pass (one short transaction) takes the pending rows that have
committed, in insert-id order, and gives each ``seq = head + 1``, the chain digest, its RFC 9162
leaf hash and a ``created_at`` never earlier than its predecessor's (time filters map onto seq
ranges, see ``apps.audit.filters``). The head row keeps the tree's right edge (``frontier``), so
a pass costs O(batch + log n).

Exactly one pass runs at a time anywhere: on PostgreSQL under a transaction-scoped advisory lock
(every Celery worker process runs a sequencer thread and they contend for it); on SQLite the
IMMEDIATE write transaction already serialises. In the distributed mode the web processes only
stand by: they sequence when the oldest pending row is older than ``AUDIT_SEQUENCER_STANDBY_S``
(no worker is sequencing), so at load one process pays a pass's fixed cost, not two. A sequencer
killed mid-pass rolls back: its rows stay pending and the next pass numbers them;
``sequencer_lag`` shows the gap meanwhile.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import BinaryField, Count, Min
from django.db.models.expressions import RawSQL
from django.utils import timezone

from apps.audit import merkle
from apps.audit.chain import DIGEST_FIELDS, GENESIS_DIGEST, PG_DISPLAY_ROW, canonical_json, column_mac
from apps.audit.models import AuditChainHead, AuditEvent
from apps.core.compiled import CompiledRead, CompiledUpdate
from apps.core.executor_db import keep_connection_healthy, kept_connection

logger = logging.getLogger(__name__)

# pg_advisory_xact_lock key: "audit-sequencer" as a stable 63-bit integer.
ADVISORY_KEY = 0x61756469745F7371
BATCH = 5000
# Columns read for a pending row: the digest-covered content (less seq, which this assigns) plus the
# id to update it by.
_PENDING_FIELDS = ("id", *(name for name in DIGEST_FIELDS if name != "seq"))


def _pending_query(vendor: str, batch: int = BATCH) -> Any:
    qs = AuditEvent.objects.filter(seq__isnull=True).order_by("id")
    if vendor == "postgresql":
        # The columns as the server renders them, from this same row version (column_mac).
        qs = qs.annotate(display_row=RawSQL(PG_DISPLAY_ROW, (), output_field=BinaryField()))  # noqa: S611
        return qs.values_list(*_PENDING_FIELDS, "display_row")[:batch]
    return qs.values_list(*_PENDING_FIELDS)[:batch]


# A pass every few milliseconds sends these same three statements: compiled once per process, they
# cost the pass a fraction of what building the querysets did (issue #15).
_PENDING = CompiledRead(_pending_query)
_HEAD_FIELDS = ("seq", "digest", "created_at", "frontier")
_HEAD = CompiledRead(
    lambda vendor: AuditChainHead.objects.select_for_update().filter(pk=1).values_list(*_HEAD_FIELDS)
)
_HEAD_UPDATE = CompiledUpdate(AuditChainHead, (*_HEAD_FIELDS, "sequenced_at"))

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros(value: datetime) -> int:
    """Microseconds since the epoch, exactly (what PG_CREATED_US renders)."""
    return (value - _EPOCH) // timedelta(microseconds=1)


def hmac_key() -> bytes:
    return settings.AUDIT_HMAC_KEY.encode()


def _lock(*, wait: bool) -> bool:
    if connection.vendor != "postgresql":
        return True  # SQLite: the IMMEDIATE transaction is the lock
    with connection.cursor() as cur:
        if not wait:
            # A background pass gives way fast (well under deadlock_timeout) to anything holding
            # table locks, e.g. a TRUNCATE: it is retried on the next tick anyway.
            cur.execute("SET LOCAL lock_timeout = '100ms'")
        if wait:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [ADVISORY_KEY])
            return True
        cur.execute("SELECT pg_try_advisory_xact_lock(%s)", [ADVISORY_KEY])
        return bool(cur.fetchone()[0])


def sequence_pass(
    *, batch: int = BATCH, wait: bool = True, on_row: Callable[[int], None] | None = None
) -> int:
    """Sequence up to ``batch`` pending rows in one transaction; returns how many (-1: lock busy).

    ``on_row(seq)`` is called after each row is numbered (before commit) — an observation hook.
    """
    key = hmac_key()
    with transaction.atomic():
        if not _lock(wait=wait):
            return -1
        pg = connection.vendor == "postgresql"
        rows = _PENDING.rows() if batch == BATCH else list(_pending_query(connection.vendor, batch))
        if not rows:
            return 0
        head = _HEAD.rows()
        if not head:
            AuditChainHead.objects.get_or_create(pk=1)
            head = _HEAD.rows()
        seq, prev, last_time, frontier_json = head[0]
        prev = prev or GENESIS_DIGEST
        frontier: merkle.Frontier = list(frontier_json or [])
        updates: list[tuple[Any, ...]] = []
        for values in rows:
            row = dict(zip(_PENDING_FIELDS, values[: len(_PENDING_FIELDS)], strict=True))
            seq += 1
            created_at: datetime = row["created_at"]
            if last_time is not None and created_at < last_time:
                created_at = last_time  # clock skew between writers must not reorder time
            last_time = created_at
            content = {**row, "seq": seq, "created_at": created_at}
            content["run_id"] = str(row["run_id"]) if row["run_id"] else None
            entry = canonical_json(content).encode()
            digest = hmac.digest(key, entry + b"|" + prev.encode(), "sha256").hex()
            leaf = merkle.leaf_hash(entry)
            frontier = merkle.frontier_append(frontier, leaf)
            colmac = column_mac(key, digest, seq, micros(created_at), bytes(values[-1])) if pg else ""
            updates.append((seq, created_at, prev, digest, leaf.hex(), entry, colmac, row["id"]))
            prev = digest
            if on_row is not None:
                on_row(seq)
        _write(updates)
        _HEAD_UPDATE.execute(1, (seq, prev, last_time, frontier, timezone.now()))
    return len(rows)


def _write(updates: list[tuple[Any, ...]]) -> None:
    # Raw SQL: the model refuses updates (append-only); the triggers allow exactly this shape.
    table = AuditEvent._meta.db_table
    field = AuditEvent._meta.get_field("created_at")
    with connection.cursor() as cur:
        if connection.vendor == "postgresql":
            # One set-based statement per batch (arrays, not one round trip per row): the pass
            # must number rows faster than writers can add them.
            cols = list(zip(*updates, strict=True))
            # A server-binding cursor with binary (%b) arrays: Django's client-side cursor would
            # quote 8 x BATCH values into the SQL text, which costs more than the hashing.
            raw = psycopg.Cursor(connection.connection)
            raw.execute(
                f"UPDATE {table} AS t SET seq = v.seq, created_at = v.created_at, "  # noqa: S608
                "prev_digest = v.prev, digest = v.digest, leaf_hash = v.leaf, entry = v.entry, "
                "colmac = v.colmac FROM unnest(%b::bigint[], %b::timestamptz[], %b::text[], %b::text[], "
                "%b::text[], %b::bytea[], %b::text[], %b::bigint[]) "
                "AS v(seq, created_at, prev, digest, leaf, entry, colmac, id) "
                "WHERE t.id = v.id AND t.seq IS NULL",
                [list(c) for c in cols],
                prepare=True,
            )
            rowcount = raw.rowcount
        else:
            params = [
                (s, field.get_db_prep_value(t, connection), p, d, h, e, i)
                for s, t, p, d, h, e, _, i in updates
            ]
            cur.executemany(
                f"UPDATE {table} SET seq = %s, created_at = %s, prev_digest = %s, digest = %s, "  # noqa: S608
                "leaf_hash = %s, entry = %s WHERE id = %s AND seq IS NULL",
                params,
            )
            rowcount = cur.rowcount
    if rowcount != len(updates):
        # Another pass numbered some of these rows: roll this one back rather than fork the chain.
        raise RuntimeError(f"audit sequencer: {rowcount} of {len(updates)} pending rows updated")


def audit_flush() -> int:
    """Sequence every pending row visible to this connection, now; returns how many.

    Tests call it after an action, and verify/export call it before they read, so they see a
    fully numbered log. Inside an open transaction it also numbers that transaction's own rows.
    """
    total = 0
    while True:
        n = sequence_pass(wait=True)
        if n <= 0:
            return total
        total += n


# --- lag ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lag:
    pending: int
    oldest_age_s: float | None
    head_seq: int
    sequenced_at: datetime | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "oldest_pending_age_s": None if self.oldest_age_s is None else round(self.oldest_age_s, 3),
            "head_seq": self.head_seq,
            "last_pass_at": self.sequenced_at.isoformat() if self.sequenced_at else None,
        }


def sequencer_lag() -> Lag:
    agg = AuditEvent.objects.filter(seq__isnull=True).aggregate(n=Count("id"), oldest=Min("created_at"))
    head = AuditChainHead.objects.filter(pk=1).values_list("seq", "sequenced_at").first() or (0, None)
    age = (timezone.now() - agg["oldest"]).total_seconds() if agg["oldest"] else None
    return Lag(agg["n"] or 0, age, head[0], head[1])


# --- publishing tree heads -----------------------------------------------------------------------

# apps.audit.checkpoints.checkpoint_publish, set at app ready (it imports this module: a hook, not
# an import, keeps the two acyclic). The thread calls it on its timer.
_publisher: list[Callable[[], Any]] = []


def set_publisher(publish: Callable[[], Any]) -> None:
    _publisher[:] = [publish]


# --- the daemon thread ---------------------------------------------------------------------------

_started = False
_start_lock = threading.Lock()
_wake = threading.Event()
# What this process's sequencer thread is (shown on /healthz): "none" (no thread: a CLI, a test
# process), "active", "standby" (distributed web process) or "standing in" (a standby sequencing).
_role = {"now": "none"}


def sequencer_role() -> str:
    return _role["now"]


def nudge() -> None:
    """Wake this process's sequencer (called on commit of an audit_record)."""
    _wake.set()


def start_sequencer_thread(*, publish: bool, standby: bool = False) -> bool:
    """Start this process's sequencer thread once. ``publish``: also append STHs on a timer.
    ``standby``: sequence only when the log lags by ``AUDIT_SEQUENCER_STANDBY_S`` (see the module
    doc; 0 makes it an active sequencer); a standby never publishes."""
    if publish and standby:
        raise ValueError("a standing-by sequencer does not publish tree heads")
    global _started
    with _start_lock:
        if _started:
            return False
        _started = True
    standby_s = float(getattr(settings, "AUDIT_SEQUENCER_STANDBY_S", 1.0)) if standby else 0.0
    _role["now"] = "standby" if standby_s > 0 else "active"
    if standby_s > 0:
        target: Callable[..., None] = _standby_loop
        args: tuple[Any, ...] = (standby_s,)
    else:
        target, args = _loop, (publish,)
    threading.Thread(target=target, args=args, daemon=True, name="audit-sequencer").start()
    return True


def batch_pause(*, since_last_pass: float, window_s: float, gap_s: float) -> float:
    """How long a woken sequencer waits before its pass: the window that lets concurrent commits
    land in one batch, stretched so that passes start at least ``gap_s`` apart. An idle server
    sequences a lone commit after the window; a busy one makes one pass per gap over everything
    committed in it, instead of a pass (a transaction and its statements) per commit (issue #15)."""
    return max(window_s, gap_s - since_last_pass)


def _loop(publish: bool) -> None:
    poll_s = float(getattr(settings, "AUDIT_SEQUENCER_POLL_MS", 200)) / 1000
    window_s = float(getattr(settings, "AUDIT_SEQUENCER_WINDOW_MS", 5)) / 1000
    gap_s = float(getattr(settings, "AUDIT_SEQUENCER_MIN_GAP_MS", 50)) / 1000
    sth_every = float(getattr(settings, "AUDIT_STH_INTERVAL_S", 60))
    last_sth = last_pass = time.monotonic()
    while True:
        if _wake.wait(poll_s):
            time.sleep(
                batch_pause(since_last_pass=time.monotonic() - last_pass, window_s=window_s, gap_s=gap_s)
            )
        # Cleared after the pause: the commits that nudged during it are in this pass. One that
        # nudges during the pass sets it again, so nothing waits for the poll.
        _wake.clear()
        publish_now = publish and time.monotonic() - last_sth >= sth_every
        if publish_now:
            last_sth = time.monotonic()
        last_pass = time.monotonic()
        if not _tick(publish_sth=publish_now):
            time.sleep(1.0)


def _tick(*, publish_sth: bool) -> bool:
    """One wake-up of the sequencer thread: every pending row sequenced, then (if due) a tree head
    published. False when it failed (nothing is lost: the rows stay pending for the next).

    The thread keeps its connection between ticks, a pooled one too (one slot for the process's
    life): reconnecting every pass cost the embedded server ~5% of its CPU at 40 runs/s, and a
    pooled checkout still cost a health-check round trip per pass (2 to 3% of a busy process)."""
    try:
        keep_connection_healthy()
        while sequence_pass(wait=False) == BATCH:
            pass
        if publish_sth and _publisher:
            _publisher[0]()
        return True
    except Exception:
        logger.exception("audit sequencer pass failed")
        connection.close()
        return False


def standby_due(standby_s: float) -> bool:
    """Whether a standing-by sequencer must pass: the oldest pending row (the first by id, but for
    clock skew; one read of the ``audit_pending`` index) has waited ``standby_s`` or longer."""
    oldest = AuditEvent.objects.filter(seq__isnull=True).order_by("id").values_list("created_at", flat=True)
    first = oldest.first()
    return first is not None and (timezone.now() - first).total_seconds() >= standby_s


def standby_look(standby_s: float) -> bool:
    """One look of a standing-by sequencer: a full tick when rows have waited ``standby_s`` or
    longer; returns whether they had. Its pooled connection goes back after each look: it is
    needed for one short read every ``standby_s``."""
    try:
        with kept_connection():
            due = standby_due(standby_s)
            if due:
                _tick(publish_sth=False)
            return due
    except Exception:
        logger.exception("audit sequencer standby look failed")
        connection.close()
        return False


def _standby_loop(standby_s: float) -> None:
    """A web process's sequencer in the distributed mode (Celery beat publishes the tree heads).
    The workers' sequencers pass every few milliseconds under load; this one looks every
    ``standby_s`` and passes only when rows have waited that long (no worker sequencing, e.g. all
    stopped), so the log never stalls: a row waits at most about twice ``standby_s``, and
    ``/healthz`` shows the lag meanwhile."""
    standing_in = False
    while True:
        time.sleep(standby_s)
        due = standby_look(standby_s)
        if due != standing_in:
            standing_in = due
            _role["now"] = "standing in" if due else "standby"
            if due:
                logger.warning("audit sequencer: rows pending for %.1f s or more; sequencing here", standby_s)
            else:
                logger.info("audit sequencer: caught up; standing by again")
