"""Streamed CSV / JSON Lines exports of a filtered selection, verifiable offline.

An export is cut from a signed tree head (STH): its first record is the STH (tree size, root,
time, signature), every row carries ``seq``, ``prev_digest``, ``digest``, ``canonical`` — the
exact string the digest covers (``HMAC-SHA256(key, canonical + "|" + prev_digest)``) and whose
SHA-256(0x00 || canonical) is the row's Merkle leaf — and ``proof``, the RFC 9162 inclusion proof
of that leaf in the STH's tree. The last record (``end``) counts the rows and is MACed with the
STH, so a file cut short (tail truncation) no longer verifies. ``scripts/verify_audit_export.py``
checks all of it without this application. Rows stream with ``.iterator(chunk_size=...)``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import QuerySet

from apps.audit.chain import DIGEST_FIELDS, canonical_json
from apps.audit.models import SignedTreeHead
from apps.audit.proofs import load_tree
from apps.audit.sequencer import hmac_key, sth_create
from apps.audit.verify import ROW_FIELDS, row_content

CONTENT_COLUMNS = DIGEST_FIELDS
CSV_COLUMNS = (*CONTENT_COLUMNS, "prev_digest", "digest", "canonical", "proof")
EXPORT_FORMAT = "conductor-audit-export/2"
END_FORMAT = "conductor-audit-export-end/1"
EXPORT_CHUNK_ROWS = 2000
BATCH_ROWS = 500  # rows per yielded chunk: large enough for throughput, small enough to stream

FORMATS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"),
}


class _Cut:
    """The STH an export is cut from, its tree (for inclusion proofs) and the running tally."""

    def __init__(self) -> None:
        self.sth: SignedTreeHead = sth_create()
        self.tree = load_tree(self.sth.tree_size)
        self.rows = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None

    def header(self) -> dict[str, Any]:
        return {"type": "sth", "format": EXPORT_FORMAT, **self.sth.as_dict()}

    def proof(self, seq: int) -> list[str]:
        self.rows += 1
        self.first_seq = seq if self.first_seq is None else self.first_seq
        self.last_seq = seq
        return [h.hex() for h in self.tree.inclusion_proof(seq - 1, self.sth.tree_size)]

    def trailer(self) -> dict[str, Any]:
        body = {
            "type": "end",
            "format": END_FORMAT,
            "rows": self.rows,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "tree_size": self.sth.tree_size,
            "sth_signature": self.sth.signature,
        }
        return {**body, "mac": end_mac(hmac_key(), body)}


def end_mac(key: bytes, body: dict[str, Any]) -> str:
    import hashlib
    import hmac

    fields = {
        k: body.get(k) for k in ("format", "rows", "first_seq", "last_seq", "tree_size", "sth_signature")
    }
    message = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def export_rows(qs: QuerySet[Any], cut: _Cut | None = None) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, canonical) in ascending seq order (sequenced rows only; up to the cut's tree size)."""
    qs = qs.filter(seq__isnull=False)
    if cut is not None:
        qs = qs.filter(seq__lte=cut.sth.tree_size)
    for values in qs.order_by("seq").values_list(*ROW_FIELDS).iterator(chunk_size=EXPORT_CHUNK_ROWS):
        row = dict(zip(ROW_FIELDS, values, strict=True))
        yield row, canonical_json(row_content(row))


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    if hasattr(value, "isoformat"):
        return value.isoformat(timespec="microseconds")
    return str(value)


def _csv_record(kind: str, record: dict[str, Any]) -> list[str]:
    # The STH / end records ride in the ``canonical`` column of a row whose seq is "#sth"/"#end".
    cells = [""] * len(CSV_COLUMNS)
    cells[0] = f"#{kind}"
    cells[CSV_COLUMNS.index("canonical")] = json.dumps(record, sort_keys=True)
    return cells


def csv_chunks(qs: QuerySet[Any]) -> Iterator[bytes]:
    cut = _Cut()
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    writer.writerow(_csv_record("sth", cut.header()))
    for count, (row, canonical) in enumerate(export_rows(qs, cut), 1):
        # Raw column values render exactly as their canonical (normalised) form would.
        writer.writerow(
            [
                *(_csv_cell(row[c]) for c in CONTENT_COLUMNS),
                row["prev_digest"],
                row["digest"],
                canonical,
                " ".join(cut.proof(row["seq"])),
            ]
        )
        if count % BATCH_ROWS == 0:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    writer.writerow(_csv_record("end", cut.trailer()))
    yield buffer.getvalue().encode()


def jsonl_chunks(qs: QuerySet[Any]) -> Iterator[bytes]:
    cut = _Cut()
    lines: list[str] = [json.dumps(cut.header(), sort_keys=True)]
    for row, canonical in export_rows(qs, cut):
        proof = json.dumps(cut.proof(row["seq"]))
        lines.append(
            f'{{"seq":{row["seq"]},"prev_digest":"{row["prev_digest"]}","digest":"{row["digest"]}",'
            f'"canonical":{json.dumps(canonical, ensure_ascii=False)},"content":{canonical},"proof":{proof}}}'
        )
        if len(lines) >= BATCH_ROWS:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    lines.append(json.dumps(cut.trailer(), sort_keys=True))
    yield ("\n".join(lines) + "\n").encode()


def export_chunks(qs: QuerySet[Any], export_format: str) -> Iterator[bytes]:
    return csv_chunks(qs) if export_format == "csv" else jsonl_chunks(qs)


async def as_async(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Serve a sync generator to ASGI without Django buffering it whole.

    (Django's ASGI handler consumes a *sync* streaming iterator with ``list()`` first.) Each
    batch is pulled in the thread-sensitive executor, the thread that owns the DB connection.
    """
    sentinel: Any = object()
    pull = sync_to_async(lambda: next(chunks, sentinel), thread_sensitive=True)
    try:
        while True:
            chunk = await pull()
            if chunk is sentinel:
                break
            yield chunk
    finally:
        await sync_to_async(chunks.close, thread_sensitive=True)()  # type: ignore[attr-defined]
