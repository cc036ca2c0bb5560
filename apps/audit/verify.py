"""Walk the audit chain and say whether it is intact, and if not, where and how it broke.

The walk streams rows in ``seq`` order (constant memory at millions of rows) and checks for each:

* its ``seq`` follows the previous one (a gap means rows were **deleted**);
* its ``prev_digest`` is the previous row's digest (the link);
* its digest is the HMAC of its own content and ``prev_digest`` (the content): the stored
  canonical ``entry`` bytes are hashed, and the columns a reader sees are checked against them —
  on PostgreSQL through the column MAC (server-rendered row, no JSON parsing), elsewhere (or for
  rows without a MAC) by re-encoding the columns. See docs/audit.md.

At the first failure it looks a little around the row to name the kind of damage:

* ``edited``    — the content no longer matches the digest but the links around it are intact;
* ``deleted``   — a sequence number is missing (or the tail is shorter than the chain head);
* ``reordered`` — the row links to a row that exists elsewhere in the chain (rows were swapped);
* ``inserted``  — a forged row: its digest does not verify and the chain continues as if it were
  not there (or it sits beyond the recorded chain head);
* ``rewritten`` — the chain verifies but its digest at a checkpoint's ``seq`` is not the
  checkpoint's, i.e. someone holding the HMAC key recomputed history.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.audit import heads, merkle
from apps.audit.chain import (
    DIGEST_FIELDS,
    GENESIS_DIGEST,
    PG_CREATED_US,
    PG_DISPLAY_ROW,
    canonical_json,
    compute_digest,
)
from apps.audit.checkpoints import log_origin, publish_path
from apps.audit.heads import Checkpoint
from apps.audit.logkeys import log_verifiers
from apps.audit.models import AuditChainHead, AuditEvent
from apps.audit.sequencer import audit_flush

# The columns a walk needs, in a fixed order (values_list is far cheaper than model instances).
ROW_FIELDS = (*DIGEST_FIELDS, "prev_digest", "digest")
CHUNK_SIZE = 5000
logger = logging.getLogger(__name__)

EDITED, DELETED, REORDERED, INSERTED, REWRITTEN = "edited", "deleted", "reordered", "inserted", "rewritten"


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    checked: int
    last_seq: int
    broken_seq: int | None = None
    reason: str = ""
    message: str = ""
    frontier: list[list[Any]] | None = field(default=None, compare=False)
    # The heads checked and those left unchecked, each naming its source (see apps.audit.heads).
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        if self.ok:
            text = f"audit chain intact: {self.checked} events verified up to seq {self.last_seq}"
        else:
            text = f"audit chain BROKEN at seq {self.broken_seq}: {self.reason} — {self.message}"
        return "; ".join([text, *self.notes])


def row_content(row: dict[str, Any]) -> dict[str, Any]:
    """The digest-covered content of a row as read back (mirrors services.event_content)."""
    return {
        "seq": row["seq"],
        "created_at": row["created_at"],
        "event_type": row["event_type"],
        "kind": row["kind"],
        "actor_id": row["actor_id"],
        "actor_label": row["actor_label"],
        "api_key_id": row["api_key_id"],
        "ip": row["ip"],
        "user_agent": row["user_agent"],
        "team_id": row["team_id"],
        "object_type": row["object_type"],
        "object_id": row["object_id"],
        "object_repr": row["object_repr"],
        "run_id": str(row["run_id"]) if row["run_id"] else None,
        "policy_version_id": row["policy_version_id"],
        "payload": row["payload"],
    }


def _rows(qs: Any) -> Iterator[dict[str, Any]]:
    for values in qs.values_list(*ROW_FIELDS).iterator(chunk_size=CHUNK_SIZE):
        yield dict(zip(ROW_FIELDS, values, strict=True))


def _row_at(**lookup: Any) -> dict[str, Any] | None:
    values = (
        AuditEvent.objects.filter(seq__isnull=False, **lookup)
        .order_by("seq")
        .values_list(*ROW_FIELDS)
        .first()
    )
    return dict(zip(ROW_FIELDS, values, strict=True)) if values else None


def _digest_ok(key: bytes, row: dict[str, Any], *, as_seq: int | None = None) -> bool:
    content = row_content(row)
    if as_seq is not None:
        content["seq"] = as_seq
    return compute_digest(key, content, row["prev_digest"] or "") == row["digest"]


def _diagnose(
    key: bytes, row: dict[str, Any], expected_seq: int, expected_prev: str, head_digest: str
) -> VerifyResult:
    """Name the damage at the first row that fails (only runs on failure, so it may query)."""
    seq = row["seq"]
    checked = expected_seq - 1
    if seq > expected_seq:
        missing = f"{expected_seq}" if seq == expected_seq + 1 else f"{expected_seq}-{seq - 1}"
        return VerifyResult(
            False, checked, checked, expected_seq, DELETED, f"seq {missing} missing (next row is seq {seq})"
        )

    content_ok = _digest_ok(key, row)
    link_ok = row["prev_digest"] == expected_prev
    if content_ok and link_ok:
        # The columns still match the digest, so the stored canonical bytes were changed.
        return VerifyResult(
            False,
            checked,
            checked,
            seq,
            EDITED,
            f"stored entry bytes or column MAC of seq {seq} do not match its (intact) columns and digest",
        )

    # Does the row link to some other existing row? Then rows were moved (swapped seqs or contents).
    if not link_ok:
        target = _row_at(digest=row["prev_digest"])
        if target is not None:
            belongs = target["seq"] + 1
            return VerifyResult(
                False,
                checked,
                checked,
                seq,
                REORDERED,
                f"row at seq {seq} links to seq {target['seq']} instead of seq {expected_seq - 1}"
                + (f" (it verifies as seq {belongs})" if _digest_ok(key, row, as_seq=belongs) else ""),
            )
        if content_ok:
            return VerifyResult(
                False,
                checked,
                checked,
                seq,
                DELETED,
                f"row at seq {seq} links to a digest no longer in the chain (a row before it was removed)",
            )

    nxt = _row_at(seq__gt=seq)
    if nxt is None:
        if row["digest"] != head_digest:
            return VerifyResult(
                False,
                checked,
                checked,
                seq,
                INSERTED,
                f"forged row at seq {seq}: its digest does not verify and the chain head does not know it",
            )
        return VerifyResult(
            False, checked, checked, seq, EDITED, f"content of seq {seq} does not match its digest"
        )
    if nxt["prev_digest"] == row["digest"] and link_ok:
        return VerifyResult(
            False,
            checked,
            checked,
            seq,
            EDITED,
            f"content of seq {seq} does not match its digest (links intact)",
        )
    if nxt["prev_digest"] == expected_prev:
        return VerifyResult(
            False,
            checked,
            checked,
            seq,
            INSERTED,
            f"forged row at seq {seq}: its digest does not verify and seq {nxt['seq']} links past it",
        )
    return VerifyResult(
        False,
        checked,
        checked,
        seq,
        EDITED,
        f"seq {seq} does not match its digest and the next row does not link to it",
    )


# --- parallel walk ------------------------------------------------------------------------------

# Chunks are aligned to a power of two so each one is a perfect Merkle subtree (RFC 9162 splits
# at powers of two): a chunk reports its subtree root and the tree is assembled from those.
CHUNK_LEAVES = 1 << 16


@dataclass
class ChunkResult:
    start: int
    first_prev: str | None = None
    last_seq: int = 0
    last_digest: str = ""
    count: int = 0
    failure: tuple[dict[str, Any], int, str] | None = None  # (row, expected seq, expected prev)
    leaf_mismatch: int | None = None
    frontier: list[tuple[int, bytes]] | None = None  # perfect subtrees of this chunk
    at_sizes: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # frontier at requested sizes


def _frontier_push(frontier: list[tuple[int, bytes]], size: int, node: bytes) -> None:
    while frontier and frontier[-1][0] == size:
        node = merkle.node_hash(frontier.pop()[1], node)
        size *= 2
    frontier.append((size, node))


def _frontier_root(frontier: list[tuple[int, bytes]]) -> bytes:
    if not frontier:
        return merkle.EMPTY_ROOT
    root = frontier[-1][1]
    for _, left in reversed(frontier[:-1]):
        root = merkle.node_hash(left, root)
    return root


# (seq, entry bytes or None, prev_digest, digest, leaf_hash hex, columns agree with entry)
EntryRow = tuple[int, bytes | None, str, str | None, str, bool]


class _NoColumnMac(Exception):
    """A row sequenced without a column MAC (before migration 0009): re-walk the slow way."""


def _pg_entry_rows(key: bytes, start: int, end: int) -> Iterator[EntryRow]:
    """Stream a seq range through a binary server-side cursor: no ORM converters, no JSON.

    The columns are checked through ``colmac`` (``apps.audit.chain.column_mac``): the server
    renders them as text (cheap) and the MAC over that rendering must match; the entry bytes are
    then hashed by the caller.
    """
    table = AuditEvent._meta.db_table
    sql = (
        f"SELECT seq, entry, prev_digest, digest, leaf_hash, colmac, {PG_CREATED_US}, {PG_DISPLAY_ROW} "  # noqa: S608
        f"FROM {table} WHERE seq >= %s AND seq <= %s ORDER BY seq"
    )
    hmac_digest = hmac.digest
    connection.ensure_connection()
    with connection.connection.cursor(name="audit_verify_walk", binary=True) as cur:
        cur.itersize = CHUNK_SIZE * 4
        cur.execute(sql, [start, end])
        for seq, entry, prev, digest, leaf_hex, colmac, created_us, display in cur:
            if not colmac:
                raise _NoColumnMac(seq)
            message = f"{digest}|{seq}|{created_us}|".encode() + display
            yield seq, entry, prev, digest, leaf_hex, hmac_digest(key, message, "sha256").hex() == colmac


def _orm_entry_rows(start: int, end: int) -> Iterator[EntryRow]:
    """Any backend: re-encode each row's columns and compare them with its stored entry bytes."""
    qs = AuditEvent.objects.filter(seq__gte=start, seq__lte=end).order_by("seq")
    for values in qs.values_list(*ROW_FIELDS, "leaf_hash", "entry").iterator(chunk_size=CHUNK_SIZE):
        row = dict(zip(ROW_FIELDS, values[:-2], strict=True))
        entry = bytes(values[-1]) if values[-1] is not None else None
        cols_ok = entry is not None and canonical_json(row_content(row)).encode() == entry
        yield row["seq"], entry, row["prev_digest"], row["digest"], values[-2], cols_ok


def _walk_chunk(key: bytes, start: int, end: int, start_prev: str | None, sizes: list[int]) -> ChunkResult:
    """Check rows start..end (seq); ``start_prev`` None: the link into the chunk is checked by the caller."""
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():  # the named cursor needs one; a savepoint if nested
                return _walk_rows(key, _pg_entry_rows(key, start, end), start, start_prev, sizes)
        except _NoColumnMac:
            logger.info("audit verify: seq %s-%s has rows without a column MAC; re-encoding them", start, end)
    return _walk_rows(key, _orm_entry_rows(start, end), start, start_prev, sizes)


def _walk_rows(
    key: bytes, rows: Iterator[EntryRow], start: int, start_prev: str | None, sizes: list[int]
) -> ChunkResult:
    out = ChunkResult(start=start, at_sizes={})
    frontier: list[tuple[int, bytes]] = []
    wanted = sorted(s for s in sizes if start <= s)
    expected_seq, expected_prev = start, start_prev
    sha256, hmac_digest, node_hash = hashlib.sha256, hmac.digest, merkle.node_hash
    failed_seq: int | None = None
    for seq, entry, prev, digest, leaf_hex, cols_ok in rows:
        if out.first_prev is None:
            out.first_prev = prev
            if expected_prev is None:
                expected_prev = prev
        if not (
            seq == expected_seq
            and prev == expected_prev
            and cols_ok
            and entry is not None
            and hmac_digest(key, entry + b"|" + prev.encode(), "sha256").hex() == digest
        ):
            failed_seq = seq
            break
        leaf = sha256(b"\x00" + entry).digest()
        if leaf_hex != leaf.hex() and out.leaf_mismatch is None:
            out.leaf_mismatch = seq
        # The frontier push, inlined: it runs once per row.
        size, node = 1, leaf
        while frontier and frontier[-1][0] == size:
            node = node_hash(frontier.pop()[1], node)
            size *= 2
        frontier.append((size, node))
        out.count += 1
        out.last_seq, out.last_digest = seq, digest or ""
        while wanted and wanted[0] == seq:
            out.at_sizes[wanted.pop(0)] = list(frontier)
        expected_seq, expected_prev = seq + 1, digest
    if failed_seq is not None:
        close = getattr(rows, "close", None)
        if close is not None:
            close()  # release the server-side cursor before querying again
        row = _row_at(seq=failed_seq)
        assert row is not None
        out.failure = (row, expected_seq, expected_prev or GENESIS_DIGEST)
    out.frontier = frontier
    return out


def _walk_chunk_in_child(
    key: bytes, start: int, end: int, start_prev: str | None, sizes: list[int]
) -> ChunkResult:
    from django.db import connections

    try:
        return _walk_chunk(key, start, end, start_prev, sizes)
    finally:
        connections.close_all()


def _walk(
    key: bytes, first: int, last: int, start_prev: str, sizes: list[int], workers: int
) -> list[ChunkResult]:
    """Chunks of ``first..last`` (first-1 aligned to CHUNK_LEAVES), in parallel processes when asked."""
    bounds = []
    a = first
    while a <= last:
        b = min(last, ((a - 1) // CHUNK_LEAVES + 1) * CHUNK_LEAVES)
        bounds.append((a, b))
        a = b + 1
    if workers <= 1 or len(bounds) <= 1 or connection.in_atomic_block:
        return [
            _walk_chunk(key, a, b, start_prev if i == 0 else None, sizes) for i, (a, b) in enumerate(bounds)
        ]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from django.db import connections

    connections.close_all()  # children are forked: each opens its own connection
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [
            pool.submit(_walk_chunk_in_child, key, a, b, start_prev if i == 0 else None, sizes)
            for i, (a, b) in enumerate(bounds)
        ]
        return [f.result() for f in futures]


def default_workers() -> int:
    import os

    return max(1, min(8, (os.cpu_count() or 1)))


def _fail(seq: int, reason: str, message: str) -> VerifyResult:
    return VerifyResult(False, max(0, seq - 1), max(0, seq - 1), seq, reason, message)


def verify_chain(
    *,
    key: bytes,
    checkpoint: Checkpoint | None = None,
    published_path: str | None = None,
    incremental: bool = False,
    workers: int | None = None,
) -> VerifyResult:
    """Walk the sequenced log: chain links and digests, Merkle leaves, and every tree head of
    this log (``apps.audit.heads``), each verdict naming the head's source.

    Read-only apart from numbering pending rows first (``audit_flush``). ``published_path``: the
    file of heads published outside the database (default ``AUDIT_STH_PUBLISH_PATH``; "" for
    none); the database must still hold the tree of this log's last one there — this is what
    catches a deleted tail together with a rolled-back head. ``incremental``: resume from the last
    successful verification (its Merkle frontier is kept on the head row) instead of from seq 1.
    ``workers`` > 1: chunks of ``CHUNK_LEAVES`` events are walked in forked processes (the CLI
    does; a server thread does not fork).
    """

    audit_flush()
    origin = log_origin()
    path = publish_path() if published_path is None else (Path(published_path) if published_path else None)
    to_check, head_notes = heads.to_check(origin, checkpoint.head() if checkpoint else None, path)
    result = _verify(key, origin, checkpoint, to_check, incremental, workers)
    return replace(result, notes=tuple(head_notes))


def _verify(
    key: bytes,
    origin: str,
    checkpoint: Checkpoint | None,
    to_check: list[heads.Head],
    incremental: bool,
    workers: int | None,
) -> VerifyResult:
    head_row = AuditChainHead.objects.filter(pk=1).first()
    head = (head_row.seq, head_row.digest) if head_row else (0, GENESIS_DIGEST)
    last = (
        AuditEvent.objects.filter(seq__isnull=False).order_by("-seq").values_list("seq", flat=True).first()
        or 0
    )
    first, start_prev, base_frontier = 1, GENESIS_DIGEST, []
    if incremental and head_row is not None and head_row.last_verified_ok and head_row.last_verified_seq:
        vs = head_row.last_verified_seq
        at = AuditEvent.objects.filter(seq=vs).values_list("digest", flat=True).first()
        if at is not None and vs <= last:
            first, start_prev = vs + 1, at
            base_frontier = [(int(n), bytes.fromhex(str(h))) for n, h in head_row.verified_frontier or []]
    sizes = sorted({h.size for h in to_check if h.size >= first} | {last})
    chunks = _walk(key, first, last, start_prev, sizes, workers or 1) if last >= first else []

    # Stitch the chunks in order: links across boundaries, first failure wins.
    expected_seq, expected_prev = first, start_prev
    frontier = list(base_frontier)
    roots: dict[int, bytes] = {}
    if first == 1:
        roots[0] = merkle.EMPTY_ROOT
    checkpoint_seen = False
    for chunk in chunks:
        if chunk.count == 0 and chunk.failure is None:
            # Nothing at all in this seq range: the rows were deleted.
            nxt = (
                AuditEvent.objects.filter(seq__gt=chunk.start)
                .order_by("seq")
                .values_list("seq", flat=True)
                .first()
            )
            return _fail(expected_seq, DELETED, f"seq {expected_seq}-{(nxt or last + 1) - 1} missing")
        if chunk.first_prev is not None and chunk.first_prev != expected_prev and chunk.failure is None:
            row = _row_at(seq=chunk.start)
            if row is not None:
                return _diagnose(key, row, expected_seq, expected_prev, head[1])
        if chunk.failure is not None:
            row, exp_seq, exp_prev = chunk.failure
            if exp_seq == chunk.start:
                exp_prev = expected_prev
            return _diagnose(key, row, exp_seq, exp_prev, head[1])
        if chunk.last_seq != min(last, ((chunk.start - 1) // CHUNK_LEAVES + 1) * CHUNK_LEAVES):
            return _fail(chunk.last_seq + 1, DELETED, f"seq {chunk.last_seq + 1} missing")
        if chunk.leaf_mismatch is not None:
            return _fail(
                chunk.leaf_mismatch,
                EDITED,
                f"stored Merkle leaf of seq {chunk.leaf_mismatch} does not match its content",
            )
        for size, part in sorted((chunk.at_sizes or {}).items()):
            roots[size] = _frontier_root(frontier + part)
        for size, node in chunk.frontier or []:
            _frontier_push(frontier, size, node)
        if (
            checkpoint is not None
            and checkpoint.seq is not None
            and chunk.start <= checkpoint.seq <= chunk.last_seq
        ):
            checkpoint_seen = True
            at = AuditEvent.objects.filter(seq=checkpoint.seq).values_list("digest", flat=True).first()
            if at != checkpoint.digest:
                return VerifyResult(
                    False,
                    checkpoint.seq,
                    checkpoint.seq,
                    checkpoint.seq,
                    REWRITTEN,
                    f"digest at seq {checkpoint.seq} differs from the checkpoint taken {checkpoint.created_at or '(no time)'}: "
                    "history up to it was recomputed",
                )
        expected_seq, expected_prev = chunk.last_seq + 1, chunk.last_digest
    if checkpoint is not None and (checkpoint.seq in (None, 0) or (incremental and checkpoint.seq < first)):
        # No chain digest to compare (a bare note; or size 0, the genesis, which every chain
        # extends), or verified by an earlier full walk.
        checkpoint_seen = True

    head_now = AuditChainHead.objects.filter(pk=1).values_list("seq", "digest").first() or (0, GENESIS_DIGEST)
    if last < head[0]:
        return _fail(last + 1, DELETED, f"chain ends at seq {last} but its head is seq {head[0]}")
    if last > head_now[0]:
        return _fail(head_now[0] + 1, INSERTED, f"rows beyond the chain head (seq {head_now[0]})")
    if last == head_now[0] and last and expected_prev != head_now[1]:
        return VerifyResult(
            False,
            last - 1,
            last - 1,
            last,
            EDITED,
            f"last row's digest differs from the chain head's at seq {last}",
        )
    if checkpoint is not None and checkpoint.seq is not None and not checkpoint_seen:
        return _fail(
            last + 1, DELETED, f"chain ends at seq {last}, before the checkpoint at seq {checkpoint.seq}"
        )

    verifiers = log_verifiers(origin)
    for tree_head in to_check:
        if problem := tree_head.problem(origin=origin, verifiers=verifiers, hmac_key=key):
            return _fail(
                max(tree_head.size, 1), REWRITTEN, f"{tree_head.source} for size {tree_head.size} {problem}"
            )
        if tree_head.size < first and incremental:
            continue
        if tree_head.size > last:
            return _fail(
                last + 1,
                DELETED,
                f"chain ends at seq {last} but {tree_head.source} covers {tree_head.size} events: its tail was deleted",
            )
        if roots.get(tree_head.size) is None or roots[tree_head.size].hex() != tree_head.root_hex:
            return _fail(
                tree_head.size,
                REWRITTEN,
                f"the Merkle root at size {tree_head.size} differs from {tree_head.source}: history was rewritten",
            )
    return VerifyResult(True, last, last, frontier=[[n, h.hex()] for n, h in frontier])


def verify_and_record(
    *, key: bytes, checkpoint: Checkpoint | None = None, incremental: bool = False, workers: int = 1
) -> VerifyResult:
    """Verify and store the outcome on the chain head row (which the UI shows)."""
    result = verify_chain(key=key, checkpoint=checkpoint, incremental=incremental, workers=workers)
    AuditChainHead.objects.get_or_create(pk=1)
    fields: dict[str, Any] = {
        "last_verified_at": timezone.now(),
        "last_verified_ok": result.ok,
        "last_verified_seq": result.last_seq if result.ok else (result.broken_seq or 0),
        "last_verify_message": result.summary()[:2000],
    }
    if result.ok:
        fields["verified_frontier"] = result.frontier or []
    AuditChainHead.objects.filter(pk=1).update(**fields)
    return result
