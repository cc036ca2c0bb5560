"""Streamed CSV / JSON Lines exports of a filtered selection, verifiable offline with the log's
public key alone (``scripts/verify_audit_export.py``).

An export is cut from a signed checkpoint (c2sp.org/tlog-checkpoint). Its first record holds
that checkpoint (with the witnesses' cosignatures) and, for each witness, the last checkpoint it
cosigned with the RFC 6962 consistency proof from it to the cut: the export then shows its
history is the one the witnesses saw. Every row carries ``seq``, ``prev_digest``, ``digest``,
``canonical`` — the exact string the chain HMAC covers and whose SHA-256(0x00 || canonical) is
the row's Merkle leaf — and ``proof``, the leaf's inclusion proof in the cut's tree. The last
record (``end``) is a note signed by the log's key: the cut, the row count, first and last seq
and a SHA-256 over every row's seq and leaf, so a file cut short or with a row removed no longer
verifies. Proofs come from a ``StreamedTree`` (bounded memory); rows stream with
``.iterator(chunk_size=...)``; CSV cells are neutralised against formula injection
(``apps.core.csvsafe``), which the verifier undoes before comparing.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.db.models import QuerySet

from apps.audit import notes
from apps.audit.chain import DIGEST_FIELDS, canonical_json
from apps.audit.checkpoints import checkpoint_create, served_note, witnessed_checkpoints
from apps.audit.logkeys import log_signer
from apps.audit.proofs import StreamedTree
from apps.audit.verify import ROW_FIELDS, row_content
from apps.core import csvsafe

CONTENT_COLUMNS = DIGEST_FIELDS
CSV_COLUMNS = (*CONTENT_COLUMNS, "prev_digest", "digest", "canonical", "proof")
EXPORT_FORMAT = "conductor-audit-export/3"
END_FORMAT = "conductor-audit-export-end/2"
EXPORT_CHUNK_ROWS = 2000
BATCH_ROWS = 500  # rows per yielded chunk: large enough for throughput, small enough to stream

FORMATS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"),
}


class Cut:
    """The checkpoint an export is cut from, its tree (for proofs) and the running tally."""

    def __init__(self) -> None:
        self.sth = checkpoint_create()
        self.tree = StreamedTree(self.sth.tree_size)
        if self.tree.root().hex() != self.sth.root_hash:
            raise ValueError(
                f"the stored leaves do not give checkpoint {self.sth.pk}'s root: run manage.py audit_verify"
            )
        self.rows = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self._rows_hash = hashlib.sha256()

    def header(self) -> dict[str, Any]:
        witnessed = [
            {
                "checkpoint": served_note(w),
                "proof": [h.hex() for h in self.tree.consistency_proof(w.tree_size)] if w.tree_size else [],
            }
            for w in witnessed_checkpoints(self.sth.tree_size)
            if w.pk != self.sth.pk
        ]
        return {
            "type": "checkpoint",
            "format": EXPORT_FORMAT,
            "origin": self.sth.origin,
            "tree_size": self.sth.tree_size,
            "checkpoint": served_note(self.sth),
            "witnessed": witnessed,
        }

    def proof(self, seq: int, canonical: str) -> list[str]:
        self.rows += 1
        self.first_seq = seq if self.first_seq is None else self.first_seq
        self.last_seq = seq
        leaf = hashlib.sha256(b"\x00" + canonical.encode()).hexdigest()
        self._rows_hash.update(f"{seq} {leaf}\n".encode())
        return [h.hex() for h in self.tree.inclusion_proof(seq - 1)]

    def trailer(self) -> dict[str, Any]:
        return {
            "type": "end",
            "format": END_FORMAT,
            "rows": self.rows,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "note": end_note(
                origin=self.sth.origin,
                size=self.sth.tree_size,
                root_hex=self.sth.root_hash,
                rows=self.rows,
                first=self.first_seq,
                last=self.last_seq,
                rows_sha256=self._rows_hash.digest(),
            ),
        }


def end_note(
    *,
    origin: str,
    size: int,
    root_hex: str,
    rows: int,
    first: int | None,
    last: int | None,
    rows_sha256: bytes,
) -> str:
    """The end record, a note signed by the log's key. Its first line is not an origin: no
    checkpoint parser takes it for a tree head."""
    text = (
        f"{END_FORMAT}\n{origin}\ncheckpoint {size} {notes.b64(bytes.fromhex(root_hex))}\n"
        f"rows {rows} {'-' if first is None else first} {'-' if last is None else last}\n"
        f"sha256 {notes.b64(rows_sha256)}\n"
    )
    return text + "\n" + log_signer(origin).signature_line(text)


def export_rows(qs: QuerySet[Any], cut: Cut | None = None) -> Iterator[tuple[dict[str, Any], str]]:
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
    # The checkpoint / end records ride in the ``canonical`` column of a row whose seq is "#...".
    cells = [""] * len(CSV_COLUMNS)
    cells[0] = f"#{kind}"
    cells[CSV_COLUMNS.index("canonical")] = json.dumps(record, sort_keys=True)
    return cells


def csv_chunks(qs: QuerySet[Any]) -> Iterator[bytes]:
    cut = Cut()
    buffer = io.StringIO()
    writer = csvsafe.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    writer.writerow(_csv_record("checkpoint", cut.header()))
    for count, (row, canonical) in enumerate(export_rows(qs, cut), 1):
        # Raw column values render exactly as their canonical (normalised) form would.
        writer.writerow(
            [
                *(_csv_cell(row[c]) for c in CONTENT_COLUMNS),
                row["prev_digest"],
                row["digest"],
                canonical,
                " ".join(cut.proof(row["seq"], canonical)),
            ]
        )
        if count % BATCH_ROWS == 0:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    writer.writerow(_csv_record("end", cut.trailer()))
    yield buffer.getvalue().encode()


def jsonl_chunks(qs: QuerySet[Any], cut: Cut | None = None) -> Iterator[bytes]:
    cut = cut or Cut()
    lines: list[str] = [json.dumps(cut.header(), sort_keys=True)]
    for row, canonical in export_rows(qs, cut):
        proof = json.dumps(cut.proof(row["seq"], canonical))
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
