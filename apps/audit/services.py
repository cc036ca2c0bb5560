"""Audit writes. ``audit_record`` is the only way an audit event is created."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import DEFAULT_DB_ALIAS, models, transaction
from django.db.models import Field
from django.db.models.base import ModelState
from django.utils import timezone

from apps.audit.checkpoints import checkpoint_create, served_note
from apps.audit.events import AuditEventType
from apps.audit.heads import from_note
from apps.audit.masking import diff_values, mask_secrets
from apps.audit.models import AuditEvent
from apps.audit.ports import AuditedRun
from apps.audit.proofs import consistency_proof
from apps.audit.sequencer import audit_flush, nudge
from apps.core.compiled import db_value, execute
from apps.core.request_context import current_request_meta
from apps.core.types import Actor

_IP_FIELD = AuditEvent._meta.get_field("ip")
_ACTOR_FIELD: Any = AuditEvent._meta.get_field("actor")
# audit_record builds events positionally in this order; fail at import if the model changes.
_FIELDS = (
    "id", "seq", "created_at", "event_type", "kind", "actor_id", "actor_label", "api_key_id", "ip",
    "user_agent", "team_id", "object_type", "object_id", "object_repr", "run_id",
    "policy_version_id", "payload", "prev_digest", "digest", "leaf_hash", "entry", "colmac",
)  # fmt: skip
if tuple(f.attname for f in AuditEvent._meta.concrete_fields) != _FIELDS:
    raise ImportError("apps.audit.services._FIELDS no longer matches AuditEvent's fields")
_TYPE_INFO: dict[AuditEventType, tuple[str, str]] = {}


def hmac_key() -> bytes:
    return settings.AUDIT_HMAC_KEY.encode()


__all__ = [
    "AuditOutsideTransactionError",
    "audit_batch",
    "audit_flush",
    "audit_record",
    "audit_record_standalone",
    "hmac_key",
]


class AuditOutsideTransactionError(RuntimeError):
    """``audit_record`` was called outside a ``transaction.atomic()`` block (issue #16)."""


def _in_atomic(using: str | None = None) -> bool:
    """Inside an atomic block the application opened (a test case's wrapping block does not count:
    in production that caller would have committed its change and its record separately)."""
    conn = transaction.get_connection(using)
    if not conn.in_atomic_block:
        return False
    blocks = conn.atomic_blocks
    return not blocks[-1]._from_testcase or any(not block._from_testcase for block in blocks)


def _require_atomic(name: str) -> None:
    if not _in_atomic():
        raise AuditOutsideTransactionError(
            f"{name}() must run inside transaction.atomic(), in the same transaction as the change "
            "it records; use audit_record_standalone() when the record is the whole change."
        )


# One encoder: json.dumps(default=str) builds a new one per call.
_ENCODE = json.JSONEncoder(default=str).encode


# --- the INSERT -------------------------------------------------------------------------------

# (column, array type) of what a writer sets; seq/digest/entry stay NULL and prev_digest/leaf_hash/
# colmac '' until the sequencer fills them (the append-only triggers allow exactly that UPDATE).
_INSERT_COLUMNS = (
    ("created_at", "timestamptz"),
    ("event_type", "text"),
    ("kind", "text"),
    ("actor_id", "bigint"),
    ("actor_label", "text"),
    ("api_key_id", "bigint"),
    ("ip", "inet"),
    ("user_agent", "text"),
    ("team_id", "bigint"),
    ("object_type", "text"),
    ("object_id", "text"),
    ("object_repr", "text"),
    ("run_id", "uuid"),
    ("policy_version_id", "bigint"),
    ("payload", "jsonb"),
)
_INSERT_SQL = (
    f"INSERT INTO {AuditEvent._meta.db_table} "  # noqa: S608 - constant identifiers only
    f"({', '.join(c for c, _ in _INSERT_COLUMNS)}, prev_digest, leaf_hash, colmac) "
    f"SELECT {', '.join('v.' + c for c, _ in _INSERT_COLUMNS)}, '', '', '' FROM unnest("
    + ", ".join("%b::text[]" if t == "jsonb" else f"%b::{t}[]" for _, t in _INSERT_COLUMNS)
    + f") WITH ORDINALITY AS v({', '.join(c for c, _ in _INSERT_COLUMNS)}, ord) ORDER BY v.ord "
    "RETURNING id"
).replace("v.payload,", "v.payload::jsonb,")

# One row (the common unbatched call): scalar parameters; arrays of one cost more to adapt.
_INSERT_ONE_SQL = (
    f"INSERT INTO {AuditEvent._meta.db_table} "  # noqa: S608 - constant identifiers only
    f"({', '.join(c for c, _ in _INSERT_COLUMNS)}, prev_digest, leaf_hash, colmac) VALUES ("
    + ", ".join(f"%s::{t}" for _, t in _INSERT_COLUMNS)
    + ", '', '', '') RETURNING id"
)

# The model fields of _INSERT_COLUMNS less the payload, whose JSON text the caller has made.
_INSERT_FIELDS: list[Field[Any, Any]] = [
    AuditEvent._meta.get_field(column)  # type: ignore[misc]
    for column, _ in _INSERT_COLUMNS
    if column != "payload"
]
_SQLITE_INSERT_HEAD = (
    f'INSERT INTO "{AuditEvent._meta.db_table}" '  # noqa: S608 - constant identifiers only
    f"({', '.join(c for c, _ in _INSERT_COLUMNS)}, prev_digest, leaf_hash, colmac) VALUES "
)
_SQLITE_ROW = "(" + ", ".join(["%s"] * len(_INSERT_COLUMNS)) + ", '', '', '')"
# Rows per statement: 15 values each stays far under SQLite's bound-variable limit.
_SQLITE_ROWS = 500


def _insert(events: list[tuple[AuditEvent, str]], using: str) -> None:
    """INSERT ``events`` (each with its payload's JSON text) in order; sets their ``pk``.

    One statement with a constant SQL text, not the ORM's per-field compilation (which cost more
    than the row's whole work in the database). PostgreSQL: column arrays bound in binary on a
    server-binding cursor, so the server parses the text once per connection. SQLite: one
    multi-row VALUES, each value prepared by its field as ``bulk_create`` would.
    """
    conn = transaction.get_connection(using)
    pg = conn.vendor == "postgresql"
    rows = []
    for event, payload_json in events:
        if pg:
            rows.append((*(getattr(event, field.attname) for field in _INSERT_FIELDS), payload_json))
        else:
            values = [db_value(field, getattr(event, field.attname), conn) for field in _INSERT_FIELDS]
            values.append(payload_json)
            rows.append(tuple(values))
    if pg:
        if len(rows) == 1:
            returned = execute(conn, _INSERT_ONE_SQL, rows[0], fetch=True)[1]
        else:
            columns = [list(column) for column in zip(*rows, strict=True)]
            returned = execute(conn, _INSERT_SQL, columns, fetch=True)[1]
        ids = sorted(row[0] for row in returned)
    else:
        ids = []
        for start in range(0, len(rows), _SQLITE_ROWS):
            chunk = rows[start : start + _SQLITE_ROWS]
            sql = _SQLITE_INSERT_HEAD + ", ".join([_SQLITE_ROW] * len(chunk)) + " RETURNING id"
            returned = execute(conn, sql, [value for row in chunk for value in row], fetch=True)[1]
            # SQLite hands out rowids in insert order; RETURNING's order is unspecified.
            ids.extend(sorted(row[0] for row in returned))
    if len(ids) != len(events):
        raise RuntimeError(f"audit insert: {len(ids)} of {len(events)} rows written")
    # PostgreSQL: nextval follows the SELECT's order, so ascending ids are the events in call order.
    for (event, _), pk in zip(events, ids, strict=True):
        event.pk = pk
        event._state.adding = False
        event._state.db = using


# --- batches: one multi-row INSERT per transaction ----------------------------------------------


class _Marker:
    """A no-op on_commit callback per savepoint level: Django drops it when that savepoint rolls
    back, which is how a batch learns that records taken inside it were rolled back."""

    __slots__ = ()

    def __call__(self) -> None:
        return None


class AuditBatch:
    """Records collected by ``audit_batch()``; written with one INSERT when the block ends."""

    def __init__(self, using: str) -> None:
        self.using = using
        self.conn = transaction.get_connection(using)  # this thread's, for the whole block
        self.events: list[tuple[_Marker, AuditEvent, str]] = []
        self._markers: dict[tuple[Any, ...], _Marker] = {}

    def add(self, event: AuditEvent, payload_json: str) -> None:
        key = tuple(self.conn.savepoint_ids)
        marker = self._markers.get(key)
        if marker is None:
            marker = self._markers[key] = _Marker()
            transaction.on_commit(marker, using=self.using)
        self.events.append((marker, event, payload_json))

    def write(self) -> list[AuditEvent]:
        """Insert the records whose savepoints still stand, in call order (= sequencing order)."""
        conn = transaction.get_connection(self.using)
        events, self.events = self.events, []
        if not events or conn.needs_rollback:
            return []  # nothing, or the whole transaction is rolling back anyway
        mine = {id(marker) for marker in self._markers.values()}
        alive = {id(func) for _sids, func, _robust in conn.run_on_commit if isinstance(func, _Marker)}
        keep = [(event, text) for marker, event, text in events if id(marker) in alive]
        conn.run_on_commit = [e for e in conn.run_on_commit if id(e[1]) not in mine]
        self._markers = {}
        if keep:
            _insert(keep, self.using)
            transaction.on_commit(nudge, using=self.using)
        return [event for event, _ in keep]


# A batch is a synchronous ``with`` block, so nothing else runs on its thread meanwhile: a plain
# thread-local (asgiref's Local costs ~10x per lookup, and this is read on every append).
_batches = threading.local()


@contextmanager
def audit_batch(using: str = DEFAULT_DB_ALIAS) -> Iterator[AuditBatch]:
    """Collect the ``audit_record`` calls made inside the block and write them as ONE multi-row
    INSERT when it ends (a run's step boundary writes several), inside the caller's transaction.

    Same rows, same order, same guarantees as one INSERT each: the sequencer numbers them later in
    insert order. Records made inside a nested savepoint that rolls back are dropped with it; an
    exception out of the block still writes them (a caller that catches it and commits keeps
    its changes, so their records too) unless the transaction is already doomed. Inside the block
    a returned event has no ``pk`` until the block ends. Nested batches join the outer one.
    """
    _require_atomic("audit_batch")
    outer: AuditBatch | None = getattr(_batches, "current", None)
    if outer is not None and outer.using == using:
        yield outer
        return
    batch = AuditBatch(using)
    _batches.current = batch
    try:
        yield batch
    except BaseException:
        _batches.current = outer
        # Usually the transaction is rolling back with this error; but a caller may catch it and
        # commit, and then what changed inside the block must not commit without its records.
        if batch.events and not batch.conn.needs_rollback:
            try:
                batch.write()
            except Exception:
                batch.conn.needs_rollback = True  # doomed: no change without its record
        raise
    finally:
        _batches.current = outer
    if not _in_atomic(using):
        raise AuditOutsideTransactionError("audit_batch() must end inside the atomic block it began in")
    batch.write()


def audit_record(
    *,
    event_type: AuditEventType,
    actor: AbstractBaseUser | AnonymousUser | None = None,
    actor_label: str = "",
    team: Any = None,
    obj: models.Model | None = None,
    object_type: str = "",
    object_id: str | int | None = None,
    object_repr: str = "",
    run_id: UUID | str | None = None,
    policy_version_id: int | None = None,
    payload: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
    api_key_id: int | None = None,
) -> AuditEvent:
    """Append one event (pending: ``seq`` NULL until the sequencer numbers it), in the caller's transaction.

    Must be called inside the ``transaction.atomic()`` block of the change it records, so the
    change and its record commit or roll back together; raises ``AuditOutsideTransactionError``
    otherwise (``audit_record_standalone`` is for a record that is the whole change).
    ``before``/``after`` are masked and diffed. The returned event has no ``seq`` yet;
    ``audit_flush()`` numbers it at once when a caller needs it. Inside ``audit_batch()`` the row
    is written when the batch ends.
    """
    # An open batch was opened inside an atomic block that it cannot outlive.
    batch: AuditBatch | None = getattr(_batches, "current", None)
    if batch is None:
        _require_atomic("audit_record")
    if type(event_type) is not AuditEventType:
        event_type = AuditEventType(event_type)
    meta = current_request_meta()
    body = mask_secrets(payload if type(payload) is dict else dict(payload)) if payload else {}
    if meta.request_id and "request_id" not in body:
        body["request_id"] = meta.request_id  # the /v1 x-request-id this change answered
    if before is not None or after is not None:
        body["changes"] = diff_values(before, after)
    user: Any = actor if actor is not None and getattr(actor, "is_authenticated", False) else None
    if obj is not None:
        object_type = object_type or obj._meta.label_lower
        object_id = obj.pk if object_id is None else object_id
        object_repr = object_repr or str(obj)[:200]
    team_id = getattr(team, "pk", team)
    if run_id is not None and type(run_id) is not UUID:
        run_id = UUID(str(run_id)) if run_id else None

    type_info = _TYPE_INFO.get(event_type)
    if type_info is None:
        type_info = _TYPE_INFO[event_type] = (str(event_type.value), str(event_type.kind))
    # One encode: the text is what is inserted, and the returned event holds its read-back
    # (JSON types only, Decimals as strings) as the sequencer will see it.
    payload_json = _ENCODE(body)
    # Insert only (the sequencer numbers and chains it later), so writers never queue on a
    # global lock. No savepoint: if recording fails, the caller's whole change must roll back.
    # Positional, in concrete-field order (_FIELDS): a keyword Model() costs ~3x as much per row.
    values: tuple[Any, ...] = (
        None,  # id
        None,  # seq
        timezone.now(),
        *type_info,  # event_type, kind
        user.pk if user is not None else None,
        (actor_label or (user.get_username() if user else "system"))[:150],
        api_key_id if api_key_id is not None else meta.api_key_id,
        # Normalised as the column will store it (IPv6 forms), so the digest matches read-back.
        _IP_FIELD.get_prep_value(meta.ip) if meta.ip else None,
        meta.user_agent[:256],
        team_id,
        object_type[:64],
        str(object_id if object_id is not None else "")[:64],
        object_repr[:200],
        run_id or None,
        policy_version_id,
        json.loads(payload_json),
        "",  # prev_digest
        None,  # digest
        "",  # leaf_hash
        None,  # entry
        "",  # colmac
    )
    # Built as Model.from_db would be, minus __init__'s per-field descriptor calls (~30 % of an
    # append's Python time); AuditEvent has no init signals or custom __init__ to skip.
    event = AuditEvent.__new__(AuditEvent)
    event._state = ModelState()
    event.__dict__.update(zip(_FIELDS, values, strict=True))
    if user is not None:
        _ACTOR_FIELD.set_cached_value(event, user)
    # One encode: the text is what is inserted, and the returned event holds its read-back
    # (JSON types only, Decimals as strings) as the sequencer will see it.
    if batch is not None and batch.using == DEFAULT_DB_ALIAS:
        batch.add(event, payload_json)
    else:
        _insert([(event, payload_json)], DEFAULT_DB_ALIAS)
        transaction.on_commit(nudge)
    return event


def audit_record_standalone(**kwargs: Any) -> AuditEvent:
    """``audit_record`` for a record that is the whole change (nothing else to commit with it):
    opens its own durable transaction, so it refuses to run inside another one."""
    with transaction.atomic(durable=True):
        return audit_record(**kwargs)


def audit_run_event(
    *,
    event_type: AuditEventType,
    run: AuditedRun,
    actor: Actor = None,
    actor_label: str = "",
    payload: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEvent:
    """An audit event about a run: team, object, run id and policy version come from the run."""
    return audit_record(
        event_type=event_type,
        actor=actor,
        actor_label=actor_label,
        team=run.team_id,
        object_type="runs.run",
        object_id=str(run.pk),
        object_repr=str(run),
        run_id=run.pk,
        policy_version_id=run.policy_version_id,
        payload=payload,
        before=before,
        after=after,
    )


def event_content(event: AuditEvent) -> dict[str, Any]:
    """The digest-covered content of an event (see apps.audit.chain.DIGEST_FIELDS)."""
    return {
        "seq": event.seq,
        "created_at": event.created_at,
        "event_type": event.event_type,
        "kind": event.kind,
        "actor_id": event.actor_id,
        "actor_label": event.actor_label,
        "api_key_id": event.api_key_id,
        "ip": event.ip,
        "user_agent": event.user_agent,
        "team_id": event.team_id,
        "object_type": event.object_type,
        "object_id": event.object_id,
        "object_repr": event.object_repr,
        "run_id": str(event.run_id) if event.run_id else None,
        "policy_version_id": event.policy_version_id,
        "payload": event.payload,
    }


# --- checkpoints and exports --------------------------------------------------------------------

CHECKPOINT_FORMAT = "conductor-audit-checkpoint/3"


def audit_checkpoint(*, actor: Actor = None, since: dict[str, Any] | None = None) -> dict[str, Any]:
    """Capture the chain head (seq, digest) and the signed checkpoint (c2sp.org/tlog-checkpoint,
    with the witnesses' cosignatures) for an auditor to keep outside.

    The checkpoint covers the log as it was before this call; the ``audit.checkpoint`` event
    recording it is appended (and sequenced) right after, so the log shows when each was taken.
    ``since``: an earlier checkpoint; the new one then carries the RFC 9162 consistency proof
    from it (``scripts/verify_audit_export.py --consistency OLD NEW`` checks it offline).
    """

    sth = checkpoint_create()
    head = AuditEvent.objects.filter(seq=sth.tree_size).values_list("digest", flat=True).first()
    checkpoint: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        "origin": sth.origin,
        "seq": sth.tree_size,
        "digest": head or "0" * 64,
        "created_at": timezone.now().isoformat(timespec="seconds"),
        "checkpoint": served_note(sth),
    }
    if since is not None:
        old_size = (
            from_note(str(since["checkpoint"]), "the earlier checkpoint").size
            if since.get("checkpoint")
            else int(since.get("sth", {}).get("tree_size", since.get("seq", 0)))
        )
        checkpoint["consistency"] = {
            "from_size": old_size,
            "proof": [h.hex() for h in consistency_proof(old_size, sth.tree_size)],
        }
    with transaction.atomic():
        audit_record(
            event_type=AuditEventType.AUDIT_CHECKPOINT,
            actor=actor,
            payload={"checkpoint_seq": checkpoint["seq"], "checkpoint_digest": checkpoint["digest"]},
        )
    audit_flush()
    return checkpoint


def audit_export_record(*, actor: Actor, export_format: str, filters: dict[str, Any]) -> AuditEvent:
    """Record that ``actor`` exported a selection; the export then covers rows before this event.

    Returned sequenced (the export is cut at its seq).
    """
    with transaction.atomic():
        event = audit_record(
            event_type=AuditEventType.AUDIT_EXPORTED,
            actor=actor,
            payload={
                "format": export_format,
                "filters": {k: v for k, v in filters.items() if v not in ("", None)},
            },
        )
    audit_flush()
    return AuditEvent.objects.get(pk=event.pk)
