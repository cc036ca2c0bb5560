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
   checkpoint's seq, its digest must be the checkpoint's (proves the history was not recomputed);
5. the signed tree head (first record): its HMAC signature, and every row's RFC 9162 inclusion
   proof (leaf = SHA-256(0x00 || canonical)) up to its root;
6. the end record (last record): its MAC, its row count and first/last seq — a file cut short,
   or with rows removed from its end, fails; with ``--contiguous`` the rows must be 1..last;
7. ``--consistency OLD NEW`` (two checkpoint files, no export needed): both tree heads' signatures
   and the RFC 9162 consistency proof NEW carries from OLD (the log only grew in between).

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
STH_FORMAT = "conductor-audit-sth/1"
END_FIELDS = ("format", "rows", "first_seq", "last_seq", "tree_size", "sth_signature")
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


# --- RFC 9162 (a copy of apps/audit/merkle.py's verification half) -------------------------------


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + entry).digest()


def verify_inclusion(leaf: bytes, index: int, size: int, proof: list[bytes], root: bytes) -> bool:
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = _node(p, r)
            if not fn & 1:
                while not (fn & 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            r = _node(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and hmac.compare_digest(r, root)


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: list[bytes]
) -> bool:
    if first == second:
        return not proof and hmac.compare_digest(first_root, second_root)
    if not 0 < first < second or not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = _node(c, fr), _node(c, sr)
            if not fn & 1:
                while not (fn & 1 or fn == 0):
                    fn >>= 1
                    sn >>= 1
        else:
            sr = _node(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and hmac.compare_digest(fr, first_root) and hmac.compare_digest(sr, second_root)


def sth_valid(key: bytes, sth: dict[str, Any]) -> bool:
    try:
        message = f"{STH_FORMAT}\n{int(sth['tree_size'])}\n{sth['root_hash']}\n{int(sth['timestamp'])}"
    except (KeyError, TypeError, ValueError):
        return False
    expected = hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, str(sth.get("signature", "")))


def end_mac(key: bytes, body: dict[str, Any]) -> str:
    fields = {k: body.get(k) for k in END_FIELDS}
    message = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def read_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, record) from either format: rows, and the ``sth``/``end`` records."""
    csv.field_size_limit(sys.maxsize)
    with path.open(encoding="utf-8", newline="") as fh:
        first = fh.read(1)
        fh.seek(0)
        if first == "{":
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    data = json.loads(line)
                    if data.get("type") in ("sth", "end"):
                        yield lineno, {"record": data["type"], "data": data}
                        continue
                    yield (
                        lineno,
                        {
                            "seq": int(data["seq"]),
                            "prev_digest": data["prev_digest"],
                            "digest": data["digest"],
                            "canonical": data["canonical"],
                            "shown": data.get("content"),
                            "proof": data.get("proof"),
                        },
                    )
        else:
            for lineno, rec in enumerate(csv.DictReader(fh), 2):
                if rec["seq"] in ("#sth", "#end"):
                    yield lineno, {"record": rec["seq"][1:], "data": json.loads(rec["canonical"])}
                    continue
                yield (
                    lineno,
                    {
                        "seq": int(rec["seq"]),
                        "prev_digest": rec["prev_digest"],
                        "digest": rec["digest"],
                        "canonical": rec["canonical"],
                        "shown": {c: rec.get(c, "") for c in CONTENT_COLUMNS},
                        "proof": rec["proof"].split() if rec.get("proof") is not None else None,
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
    sth: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    first_seq: int | None = None
    for lineno, row in read_rows(path):
        if "record" in row:
            if row["record"] == "sth":
                if sth is not None or rows:
                    errors.append(f"line {lineno}: a signed tree head must come first, once")
                sth = row["data"]
                if not sth_valid(key, sth):
                    errors.append(f"line {lineno}: the signed tree head's signature does not verify")
            else:
                if end is not None:
                    errors.append(f"line {lineno}: a second end record")
                end = row["data"]
            continue
        if end is not None:
            errors.append(f"line {lineno}: rows after the end record")
        rows += 1
        seq, canonical = row["seq"], row["canonical"]
        first_seq = seq if first_seq is None else first_seq
        if sth is None:
            if rows == 1:
                errors.append(f"line {lineno}: no signed tree head before the rows")
        elif seq > int(sth["tree_size"]):
            errors.append(f"line {lineno}: seq {seq} is beyond the tree head's size {sth['tree_size']}")
        else:
            try:
                proof = [bytes.fromhex(h) for h in (row["proof"] or [])]
                included = verify_inclusion(
                    leaf_hash(canonical.encode()),
                    seq - 1,
                    int(sth["tree_size"]),
                    proof,
                    bytes.fromhex(str(sth["root_hash"])),
                )
            except ValueError:
                included = False
            if not included:
                errors.append(
                    f"line {lineno}: seq {seq}: inclusion proof does not verify against the tree head"
                )
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
            return errors
    if checkpoint is not None and not checkpoint_seen and not errors:
        errors.append(f"the export does not contain the checkpoint's seq {checkpoint['seq']}")
    if end is None:
        errors.append("no end record: the export is truncated (its tail is missing)")
    else:
        if sth is not None and end.get("sth_signature") != sth.get("signature"):
            errors.append("the end record belongs to another tree head")
        if not hmac.compare_digest(end_mac(key, end), str(end.get("mac", ""))):
            errors.append("the end record's MAC does not verify")
        if end.get("rows") != rows:
            errors.append(
                f"the end record counts {end.get('rows')} rows, the file holds {rows}: rows were removed"
            )
        if end.get("last_seq") != prev_seq or end.get("first_seq") != first_seq:
            errors.append(
                f"the end record spans seq {end.get('first_seq')}..{end.get('last_seq')}, "
                f"the file {first_seq}..{prev_seq}: rows were removed"
            )
        if contiguous and rows and first_seq != 1:
            errors.append(f"seqs 1..{(first_seq or 1) - 1} missing at the start")
    if not errors:
        note = f", {gaps} gap(s) between filtered rows" if gaps else ""
        size = f" in a tree of {sth['tree_size']}" if sth else ""
        print(f"OK: {rows} rows verified{note}{size}")
    return errors


def verify_consistency_files(old_path: Path, new_path: Path, key: bytes) -> list[str]:
    old, new = json.loads(old_path.read_text()), json.loads(new_path.read_text())
    errors = []
    old_sth, new_sth = old.get("sth") or {}, new.get("sth") or {}
    for label, sth in (("old", old_sth), ("new", new_sth)):
        if not sth_valid(key, sth):
            errors.append(f"the {label} checkpoint's tree head signature does not verify")
    if errors:
        return errors
    consistency = new.get("consistency") or {}
    first, second = int(old_sth["tree_size"]), int(new_sth["tree_size"])
    if int(consistency.get("from_size", -1)) != first:
        return [f"the new checkpoint carries no consistency proof from size {first}"]
    proof = [bytes.fromhex(h) for h in consistency.get("proof", [])]
    if not verify_consistency(
        first, second, bytes.fromhex(old_sth["root_hash"]), bytes.fromhex(new_sth["root_hash"]), proof
    ):
        return [f"consistency proof from size {first} to {second} does not verify: history was rewritten"]
    print(f"OK: tree of {second} is an append-only extension of the tree of {first}")
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path, nargs="?", help="a .csv or .jsonl export")
    parser.add_argument(
        "--consistency", nargs=2, type=Path, metavar=("OLD", "NEW"), help="two checkpoint files"
    )
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
    if args.export is None and not args.consistency:
        parser.error("give an export file or --consistency OLD NEW")
        return 2
    checkpoint = json.loads(args.checkpoint.read_text()) if args.checkpoint else None
    errors: list[str] = []
    if args.consistency:
        errors += verify_consistency_files(args.consistency[0], args.consistency[1], key)
    if args.export is not None:
        errors += verify(args.export, key, contiguous=args.contiguous, checkpoint=checkpoint)
    for line in errors:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
