#!/usr/bin/env python3
"""Verify a Conductor Web audit export offline (standard library only; no Django, no database).

Usage::

    AUDIT_HMAC_KEY=... python scripts/verify_audit_export.py export.jsonl
    python scripts/verify_audit_export.py --key-file audit_hmac.key export.csv
    python scripts/verify_audit_export.py --key-file k --contiguous --checkpoint cp.json export.jsonl

What it checks, for every row of a CSV or JSON Lines export from ``/audit/export.csv|jsonl``:

1. ``digest == HMAC-SHA256(key, canonical + "|" + prev_digest)`` — the row's content is what was
   recorded (``canonical`` is the exact canonical JSON the digest covers);
2. the human-readable columns agree with ``canonical`` (nobody edited the display columns);
3. links: where two exported rows have consecutive seqs, the later row's ``prev_digest`` is the
   earlier row's ``digest``; seq 1 links to the genesis digest (64 zeros). A filtered export has
   gaps between seqs; ``--contiguous`` makes any gap an error (use it for unfiltered exports);
4. ``--checkpoint FILE`` (from ``manage.py audit_checkpoint``): if the export holds the
   checkpoint's seq, its digest must be the checkpoint's (proves the history was not recomputed).

Exit status 0 when every check passes, 1 otherwise (the first failures are printed), 2 on usage
errors.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import hmac
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
CONTENT_COLUMNS = (
    "seq",
    "created_at",
    "event_type",
    "kind",
    "actor_id",
    "actor_label",
    "api_key_id",
    "ip",
    "user_agent",
    "team_id",
    "object_type",
    "object_id",
    "object_repr",
    "run_id",
    "policy_version_id",
    "payload",
)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, {seq, prev_digest, digest, canonical, shown}) from either format."""
    csv.field_size_limit(sys.maxsize)
    with path.open(encoding="utf-8", newline="") as fh:
        first = fh.read(1)
        fh.seek(0)
        if first == "{":
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    data = json.loads(line)
                    yield (
                        lineno,
                        {
                            "seq": int(data["seq"]),
                            "prev_digest": data["prev_digest"],
                            "digest": data["digest"],
                            "canonical": data["canonical"],
                            "shown": data.get("content"),
                        },
                    )
        else:
            for lineno, rec in enumerate(csv.DictReader(fh), 2):
                yield (
                    lineno,
                    {
                        "seq": int(rec["seq"]),
                        "prev_digest": rec["prev_digest"],
                        "digest": rec["digest"],
                        "canonical": rec["canonical"],
                        "shown": {c: rec.get(c, "") for c in CONTENT_COLUMNS},
                    },
                )


def verify(
    path: Path, key: bytes, *, contiguous: bool = False, checkpoint: dict[str, Any] | None = None
) -> list[str]:
    errors: list[str] = []
    prev_seq: int | None = None
    prev_digest = ""
    rows = gaps = 0
    checkpoint_seen = False
    for lineno, row in read_rows(path):
        rows += 1
        seq, canonical = row["seq"], row["canonical"]
        expected = hmac.new(
            key, canonical.encode() + b"|" + row["prev_digest"].encode(), hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(expected, row["digest"]):
            errors.append(f"line {lineno}: seq {seq}: digest does not verify (content edited or wrong key)")
        content = json.loads(canonical)
        if content.get("seq") != seq:
            errors.append(f"line {lineno}: seq column {seq} differs from the signed seq {content.get('seq')}")
        shown = row["shown"]
        if shown is not None:
            for column in CONTENT_COLUMNS:
                if column in shown and _cell(shown[column]) != _cell(content.get(column)):
                    errors.append(
                        f"line {lineno}: seq {seq}: column {column!r} differs from the signed content"
                    )
        if seq == 1 and row["prev_digest"] != GENESIS:
            errors.append(f"line {lineno}: seq 1 does not start from the genesis digest")
        if prev_seq is not None:
            if seq <= prev_seq:
                errors.append(f"line {lineno}: seq {seq} out of order after {prev_seq}")
            elif seq == prev_seq + 1:
                if row["prev_digest"] != prev_digest:
                    errors.append(f"line {lineno}: seq {seq} does not link to seq {prev_seq}")
            else:
                gaps += 1
                if contiguous:
                    errors.append(f"line {lineno}: seqs {prev_seq + 1}..{seq - 1} missing")
        if checkpoint is not None and seq == int(checkpoint["seq"]):
            checkpoint_seen = True
            if row["digest"] != checkpoint["digest"]:
                errors.append(
                    f"line {lineno}: seq {seq}: digest differs from the checkpoint (history rewritten)"
                )
        prev_seq, prev_digest = seq, row["digest"]
        if len(errors) >= 20:
            errors.append("(stopping after 20 errors)")
            break
    if checkpoint is not None and not checkpoint_seen and not errors:
        errors.append(f"the export does not contain the checkpoint's seq {checkpoint['seq']}")
    if not errors:
        note = f", {gaps} gap(s) between filtered rows" if gaps else ""
        print(f"OK: {rows} rows verified{note}")
    return errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, help="a .csv or .jsonl export")
    parser.add_argument(
        "--key-file", type=Path, help="file holding AUDIT_HMAC_KEY (default: $AUDIT_HMAC_KEY)"
    )
    parser.add_argument("--contiguous", action="store_true", help="treat any seq gap as an error")
    parser.add_argument("--checkpoint", type=Path, help="a checkpoint JSON from manage.py audit_checkpoint")
    args = parser.parse_args(argv)
    if args.key_file:
        key = args.key_file.read_text().strip().encode()
    elif os.environ.get("AUDIT_HMAC_KEY"):
        key = os.environ["AUDIT_HMAC_KEY"].encode()
    else:
        parser.error("give --key-file or set AUDIT_HMAC_KEY")
        return 2
    checkpoint = json.loads(args.checkpoint.read_text()) if args.checkpoint else None
    errors = verify(args.export, key, contiguous=args.contiguous, checkpoint=checkpoint)
    for line in errors:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
