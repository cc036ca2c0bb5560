"""Streamed CSV / JSON Lines exports of a filtered selection, verifiable offline.

Every row carries ``seq``, ``prev_digest``, ``digest`` and ``canonical`` — the exact string the
digest covers (``HMAC-SHA256(key, canonical + "|" + prev_digest)``), so
``scripts/verify_audit_export.py`` can check each row and, where seqs are contiguous, the links,
without this application. Rows are read with ``.iterator(chunk_size=...)`` and written in small
batches: memory stays flat whatever the selection's size.
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
from apps.audit.verify import ROW_FIELDS, row_content

CONTENT_COLUMNS = DIGEST_FIELDS
CSV_COLUMNS = (*CONTENT_COLUMNS, "prev_digest", "digest", "canonical")
EXPORT_CHUNK_ROWS = 2000
BATCH_ROWS = 500  # rows per yielded chunk: large enough for throughput, small enough to stream

FORMATS = {
    "csv": ("text/csv; charset=utf-8", "csv"),
    "jsonl": ("application/x-ndjson; charset=utf-8", "jsonl"),
}


def export_rows(qs: QuerySet[Any]) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, canonical) in ascending seq order."""
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


def csv_chunks(qs: QuerySet[Any]) -> Iterator[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(CSV_COLUMNS)
    for count, (row, canonical) in enumerate(export_rows(qs), 1):
        # Raw column values render exactly as their canonical (normalised) form would.
        writer.writerow(
            [*(_csv_cell(row[c]) for c in CONTENT_COLUMNS), row["prev_digest"], row["digest"], canonical]
        )
        if count % BATCH_ROWS == 0:
            yield buffer.getvalue().encode()
            buffer.seek(0)
            buffer.truncate()
    yield buffer.getvalue().encode()


def jsonl_chunks(qs: QuerySet[Any]) -> Iterator[bytes]:
    lines: list[str] = []
    for row, canonical in export_rows(qs):
        lines.append(
            f'{{"seq":{row["seq"]},"prev_digest":"{row["prev_digest"]}","digest":"{row["digest"]}",'
            f'"canonical":{json.dumps(canonical, ensure_ascii=False)},"content":{canonical}}}'
        )
        if len(lines) >= BATCH_ROWS:
            yield ("\n".join(lines) + "\n").encode()
            lines = []
    if lines:
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
