#!/usr/bin/env python3
"""Verify a Conductor Web audit export or evidence pack offline, with only the log's public key.

Standard library only (no Django, no database, no ``cryptography``: Ed25519 is verified here).

Usage::

    python3 verify_audit_export.py --vkey 'HOST/audit/LOGID+1a2b3c4d+AbC...' export.jsonl
    python3 verify_audit_export.py --vkey-file keys/log.vkey --witness-file keys/witnesses.vkey pack.zip
    python3 verify_audit_export.py --vkey-file log.vkey --consistency old.json new.json

The verifier key ("vkey", c2sp.org/signed-note) comes from ``manage.py audit_keys`` or
``/audit/log/keys``; get it from the operator out of band and keep it: the one inside an evidence
pack only tells you which key the pack claims. What is checked for a CSV or JSON Lines export
(``/audit/export.csv|jsonl``), or the ``events.jsonl`` of an evidence pack (.zip or directory):

1. the checkpoint the export was cut from (c2sp.org/tlog-checkpoint) carries a valid Ed25519
   signature of a ``--vkey``; its origin names the log (``--origin`` pins it);
2. every row's RFC 6962 inclusion proof: SHA-256(0x00 || canonical) is leaf ``seq - 1`` of that
   tree, so the row's content is what the log committed to;
3. the display columns equal the committed content (CSV cells neutralised against formula
   injection are read back first), ``seq`` is the committed one, consecutive rows link
   (``prev_digest``), seq 1 starts from the genesis digest; ``--contiguous`` forbids gaps;
4. the end record, signed by the log, counts the rows and hashes their seqs and leaves: a file
   cut short, or with any row removed, fails;
5. ``--witness VKEY`` (c2sp.org/tlog-cosignature, type 0x04): that witness cosigned the
   checkpoint, or an earlier one that the export proves it extends (RFC 6962 consistency). A
   witness refuses to cosign a rewritten history, so an operator who re-signs one is caught;
6. ``--checkpoint FILE``: a checkpoint you kept (a note, or the JSON of ``manage.py
   audit_checkpoint``) is consistent with the export's; ``--consistency OLD NEW`` checks two
   checkpoint files (NEW carries the proof);
7. ``--hmac-key-file``: also each row's chain HMAC (needs the deployment's secret; optional).

Exit status 0 when every check passes, 1 otherwise (the first failures are printed), 2 on usage
errors.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import csv
import hashlib
import hmac
import io
import itertools
import json
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

GENESIS = "0" * 64
EMPTY_ROOT = hashlib.sha256(b"").digest()
LEAF_PREFIX, NODE_PREFIX = b"\x00", b"\x01"
DASH = "\u2014"
END_HEADER = "conductor-audit-export-end/2"
CONTENT_COLUMNS = (
    "seq", "created_at", "event_type", "kind", "actor_id", "actor_label", "api_key_id", "ip",
    "user_agent", "team_id", "object_type", "object_id", "object_repr", "run_id",
    "policy_version_id", "payload",
)  # fmt: skip
# apps.core.csvsafe: cells starting with one of these got a leading apostrophe.
CSV_TRIGGERS = ("=", "+", "-", "@", "\t", "\r", "'")

# --- Ed25519 verification (RFC 8032 section 5.1.7), cofactorless, canonical encodings only ----

_P = 2**255 - 19
_L = 2**252 + 27742317777372353535851937790883648493
_D = -121665 * pow(121666, _P - 2, _P) % _P
_SQRT_M1 = pow(2, (_P - 1) // 4, _P)


def _recover_x(y: int, sign: int) -> int | None:
    x2 = (y * y - 1) * pow(_D * y * y + 1, _P - 2, _P) % _P
    if x2 == 0:
        return None if sign else 0
    x = pow(x2, (_P + 3) // 8, _P)
    if (x * x - x2) % _P:
        x = x * _SQRT_M1 % _P
    if (x * x - x2) % _P:
        return None
    return _P - x if (x & 1) != sign else x


def _point(data: bytes) -> tuple[int, int, int, int] | None:
    if len(data) != 32:
        return None
    y = int.from_bytes(data, "little")
    sign, y = y >> 255, y & ((1 << 255) - 1)
    x = _recover_x(y, sign) if y < _P else None
    return None if x is None else (x, y, 1, x * y % _P)


def _add(p: tuple[int, ...], q: tuple[int, ...]) -> tuple[int, int, int, int]:
    a = (p[1] - p[0]) * (q[1] - q[0]) % _P
    b = (p[1] + p[0]) * (q[1] + q[0]) % _P
    c = 2 * p[3] * q[3] * _D % _P
    d = 2 * p[2] * q[2] % _P
    e, f, g, h = b - a, d - c, d + c, b + a
    return e * f % _P, g * h % _P, f * g % _P, e * h % _P


def _mul(scalar: int, p: tuple[int, ...]) -> tuple[int, ...]:
    acc: tuple[int, ...] = (0, 1, 1, 0)
    while scalar:
        if scalar & 1:
            acc = _add(acc, p)
        p, scalar = _add(p, p), scalar >> 1
    return acc


_BASE = _point(int.to_bytes(4 * pow(5, _P - 2, _P) % _P, 32, "little"))


def ed25519_verify(public: bytes, message: bytes, signature: bytes) -> bool:
    if len(signature) != 64 or _BASE is None:
        return False
    a, r, s = _point(public), _point(signature[:32]), int.from_bytes(signature[32:], "little")
    if a is None or r is None or s >= _L:
        return False
    k = int.from_bytes(hashlib.sha512(signature[:32] + public + message).digest(), "little") % _L
    left, right = _mul(s, _BASE), _add(r, _mul(k, a))
    return (left[0] * right[2] - right[0] * left[2]) % _P == 0 and (
        left[1] * right[2] - right[1] * left[2]
    ) % _P == 0


# --- signed notes, vkeys, checkpoints, cosignatures (c2sp.org) --------------------------------


class Bad(ValueError):
    pass


def unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise Bad(f"not base64: {text[:40]!r}") from None


def _name_ok(name: str) -> bool:
    return bool(name) and "+" not in name and not any(ch.isspace() for ch in name)


class Key:
    """A vkey: ``name+hex(key id)+base64(type || Ed25519 public key)``; type 1 signs notes, type 4
    is a witness's cosignature/v1 key."""

    def __init__(self, vkey: str) -> None:
        self.vkey = vkey.strip()
        name, _, rest = self.vkey.partition("+")
        hex_id, _, key_b64 = rest.partition("+")
        data = unb64(key_b64) if key_b64 else b""
        if not _name_ok(name) or len(hex_id) != 8 or len(data) != 33 or data[0] not in (1, 4):
            raise Bad(f"not an Ed25519 verifier key: {self.vkey[:80]!r}")
        self.name, self.type, self.public = name, data[0], data[1:]
        digest = hashlib.sha256(name.encode() + b"\n" + data).digest()
        self.id = int.from_bytes(digest[:4], "big")
        if f"{self.id:08x}" != hex_id.lower():
            raise Bad(f"verifier key {name}+{hex_id}: the id does not match the name and key")

    def check(self, text: str, raw: bytes) -> int | None:
        """Signature bytes (after the key id) over the note text: cosignature time, 0, or None."""
        if self.type == 4:
            if len(raw) != 72 or raw[0] & 0x80:
                return None
            when = int.from_bytes(raw[:8], "big")
            message = f"cosignature/v1\ntime {when}\n{text}".encode()
            return when if ed25519_verify(self.public, message, raw[8:]) else None
        return 0 if ed25519_verify(self.public, text.encode(), raw) else None


def open_note(data: str, keys: list[Key]) -> tuple[str, list[tuple[Key, int]]]:
    """signed-note verification: unknown keys are ignored, a known key's bad signature rejects
    the note, and at least one known key must have signed. Returns (text, [(key, time)])."""
    if not data.endswith("\n") or any(ord(c) < 0x20 and c != "\n" for c in data):
        raise Bad("malformed note (it ends with a newline and holds no other control characters)")
    cut = data.rfind("\n\n")
    if cut < 0:
        raise Bad("malformed note (no blank line before the signatures)")
    text, lines = data[: cut + 1], data[cut + 2 :].splitlines()
    if not lines or len(lines) > 100:
        raise Bad("a note carries 1 to 100 signatures")
    known = {(k.name, k.id): k for k in keys}
    signed: list[tuple[Key, int]] = []
    for line in lines:
        name, _, sig = line.removeprefix(DASH + " ").partition(" ")
        raw = unb64(sig) if line.startswith(DASH + " ") and _name_ok(name) else b""
        if len(raw) < 5:
            raise Bad(f"malformed signature line {line[:60]!r}")
        key = known.get((name, int.from_bytes(raw[:4], "big")))
        if key is not None:
            when = key.check(text, raw[4:])
            if when is None:
                raise Bad(f"the signature of {key.name}+{key.id:08x} does not verify")
            signed.append((key, when))
    if not signed:
        raise Bad("no signature from a trusted key")
    return text, signed


def parse_checkpoint(text: str) -> tuple[str, int, bytes]:
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] or not all(lines[:-1]):
        raise Bad("a checkpoint is origin, size and root hash lines")
    size = lines[1]
    if not (size.isascii() and size.isdigit()) or (size != "0" and size[0] == "0"):
        raise Bad(f"checkpoint size {size!r} is not a decimal")
    root = unb64(lines[2])
    if len(root) != 32 or (size == "0" and root != EMPTY_ROOT):
        raise Bad("a checkpoint's root hash is 32 bytes (the empty tree's at size 0)")
    return lines[0], int(size), root


# --- RFC 6962 Merkle proofs, as transparency-dev/merkle verifies them ---------------------------


def leaf_hash(entry: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _chain(seed: bytes, proof: list[bytes], index: int, *, left_only: bool = False) -> bytes:
    for i, h in enumerate(proof):
        if (index >> i) & 1:
            seed = node_hash(h, seed)
        elif not left_only:
            seed = node_hash(seed, h)
    return seed


def _border(seed: bytes, proof: list[bytes]) -> bytes:
    for h in proof:
        seed = node_hash(h, seed)
    return seed


def _ok(*hashes: bytes) -> bool:
    return all(len(h) == 32 for h in hashes)


def verify_inclusion(leaf: bytes, index: int, size: int, proof: list[bytes], root: bytes) -> bool:
    if not 0 <= index < size or not _ok(leaf, root, *proof):
        return False
    inner = (index ^ (size - 1)).bit_length()
    if len(proof) != inner + bin(index >> inner).count("1"):
        return False
    return hmac.compare_digest(_border(_chain(leaf, proof[:inner], index), proof[inner:]), root)


def verify_consistency(first: int, second: int, root1: bytes, root2: bytes, proof: list[bytes]) -> bool:
    if not 0 < first <= second:
        return False  # a proof from the empty tree means nothing (see checkpoints_consistent)
    if first == second:
        return not proof and hmac.compare_digest(root1, root2)
    if not proof or not _ok(root1, root2, *proof):
        return False
    fork = ((first - 1) ^ (second - 1)).bit_length()
    border = bin((first - 1) >> fork).count("1")
    shift = (first & -first).bit_length() - 1
    inner = fork - shift
    seed, skip = (root1, 0) if first == 1 << shift else (proof[0], 1)
    if len(proof) != skip + inner + border:
        return False
    path, mask = proof[skip:], (first - 1) >> shift
    old = _border(_chain(seed, path[:inner], mask, left_only=True), path[inner:])
    new = _border(_chain(seed, path[:inner], mask), path[inner:])
    return hmac.compare_digest(old, root1) and hmac.compare_digest(new, root2)


def checkpoints_consistent(first: int, second: int, root1: bytes, root2: bytes, proof: list[bytes]) -> bool:
    if first == 0:  # the empty tree is consistent with every tree (c2sp.org/tlog-witness)
        return not proof and root1 == EMPTY_ROOT and second >= 0
    return verify_consistency(first, second, root1, root2, proof)


def _hexes(items: Any) -> list[bytes]:
    return [bytes.fromhex(h) for h in (items or [])]


# --- reading exports ---------------------------------------------------------------------------


def un_neutralise(cell: str) -> str:
    return cell[1:] if cell.startswith("'") and cell[1:2] in CSV_TRIGGERS and cell[1:2] else cell


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def open_text(path: Path) -> io.TextIOBase:
    if path.is_dir():
        path = path / "events.jsonl"
    if zipfile.is_zipfile(path):
        archive = zipfile.ZipFile(path)
        name = next((n for n in archive.namelist() if n.endswith("events.jsonl")), None)
        if name is None:
            raise Bad(f"{path} holds no events.jsonl")
        return io.TextIOWrapper(archive.open(name), encoding="utf-8", newline="")
    return path.open(encoding="utf-8", newline="")


def read_records(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, record): header/end records as ``{"record": type, "data": ...}``, rows as dicts."""
    csv.field_size_limit(sys.maxsize)
    with open_text(path) as fh:
        head = fh.readline()
        lines = itertools.chain([head], fh)
        if head.startswith("{"):
            for lineno, line in enumerate(lines, 1):
                if line.strip():
                    data = json.loads(line)
                    if "type" in data:
                        yield lineno, {"record": data["type"], "data": data}
                    else:
                        yield lineno, {**data, "shown": data.get("content")}
            return
        for lineno, rec in enumerate(csv.DictReader(lines), 2):
            rec = {k: un_neutralise(v or "") for k, v in rec.items() if k is not None}
            if rec["seq"].startswith("#"):
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
                    "proof": rec["proof"].split(),
                },
            )


class TooMany(Exception):
    pass


class Report:
    def __init__(self) -> None:
        self.errors: list[str] = []
        self.lines: list[str] = []

    def fail(self, message: str) -> None:
        self.errors.append(message)
        if len(self.errors) == 20:
            self.errors.append("(stopping after 20 errors)")
            raise TooMany


class Verifier:
    def __init__(self, args: argparse.Namespace, keys: list[Key], witnesses: list[Key]) -> None:
        self.args, self.keys, self.witnesses = args, keys, witnesses
        self.hmac_key: bytes | None = (
            args.hmac_key_file.read_text().strip().encode() if args.hmac_key_file else None
        )

    def checkpoint(self, note: str, what: str) -> tuple[str, int, bytes, list[tuple[Key, int]]]:
        try:
            text, signed = open_note(note, self.keys + self.witnesses)
        except Bad as exc:
            raise Bad(f"{what}: {exc}") from None
        if not any(key.type == 1 for key, _ in signed):
            raise Bad(f"{what} carries no valid signature of the log's key")
        origin, size, root = parse_checkpoint(text)
        if self.args.origin and origin != self.args.origin:
            raise Bad(f"{what} is from another log ({origin}), not {self.args.origin}")
        if not any(key.name == origin for key, _ in signed if key.type == 1):
            raise Bad(f"{what} names origin {origin} but is signed by {signed[0][0].name}")
        return origin, size, root, signed

    def header(self, data: dict[str, Any], out: Report) -> tuple[str, int, bytes]:
        origin, size, root, signed = self.checkpoint(data["checkpoint"], "the export's checkpoint")
        signer = next(f"{k.name}+{k.id:08x}" for k, _ in signed if k.type == 1)
        out.lines.append(f"checkpoint: log {origin}, size {size}, signed by {signer}")
        cosigned: dict[str, str] = {k.vkey: f"size {size} (at its cut)" for k, _ in signed if k.type == 4}
        for item in data.get("witnessed") or []:
            stated = [*str(item.get("checkpoint", "")).split("\n"), "", "?"][1]
            what = f"the witnessed checkpoint of size {stated}"
            w_origin, w_size, w_root, w_signed = self.checkpoint(item["checkpoint"], what)
            if w_origin != origin:
                raise Bad(f"a witnessed checkpoint is from another log ({w_origin})")
            if not checkpoints_consistent(w_size, size, w_root, root, _hexes(item.get("proof"))):
                names = ", ".join(k.name for k, _ in w_signed if k.type == 4) or "no trusted witness"
                raise Bad(
                    f"the checkpoint at size {size} is not consistent with the one cosigned at size {w_size} "
                    f"({names}): history was rewritten after it was witnessed"
                )
            for key, when in w_signed:
                if key.type == 4:
                    cosigned.setdefault(key.vkey, f"size {w_size} (time {when}), extended to {size}")
        for key in self.witnesses:
            if key.vkey not in cosigned:
                out.fail(f"witness {key.name} cosigned neither this checkpoint nor one it extends")
        if cosigned:
            out.lines.append(
                "cosigned by: " + "; ".join(f"{v.split('+')[0]} {w}" for v, w in cosigned.items())
            )
        else:
            out.lines.append("cosigned by: no trusted witness (give --witness VKEY to require one)")
        return origin, size, root

    def end(
        self, data: dict[str, Any], origin: str, size: int, root: bytes, tally: dict[str, Any], out: Report
    ) -> None:
        text, _ = open_note(data["note"], [k for k in self.keys if k.name == origin and k.type == 1])
        expected = (
            f"{END_HEADER}\n{origin}\ncheckpoint {size} {base64.b64encode(root).decode()}\n"
            f"rows {tally['rows']} {tally['first'] if tally['first'] is not None else '-'} "
            f"{tally['last'] if tally['last'] is not None else '-'}\n"
            f"sha256 {base64.b64encode(tally['hash'].digest()).decode()}\n"
        )
        if text.split("\n")[2:3] != expected.split("\n")[2:3]:
            out.fail("the end record belongs to another checkpoint")
        elif text != expected:
            claimed = text.split("\n")[3] if text.count("\n") > 3 else "?"
            out.fail(
                f"the end record says {claimed!r}, the file holds rows {tally['rows']}: rows were removed or changed"
            )

    def export(self, path: Path, out: Report) -> None:
        cut: tuple[str, int, bytes] | None = None
        tally: dict[str, Any] = {"rows": 0, "first": None, "last": None, "hash": hashlib.sha256()}
        prev_seq, prev_digest, ended = None, "", False
        kept = _kept_checkpoint(self.args.checkpoint, self) if self.args.checkpoint else None
        frontier: list[tuple[int, bytes]] = []
        for lineno, row in read_records(path):
            where = f"line {lineno}"
            if "record" in row:
                if row["record"] in ("checkpoint", "sth"):
                    if cut is not None or tally["rows"]:
                        out.fail(f"{where}: the checkpoint comes first, once")
                    if row["record"] == "sth":
                        raise Bad(
                            "this is a format-2 export (HMAC tree head): verify it with the script it came with"
                        )
                    cut = self.header(row["data"], out)
                elif row["record"] == "end":
                    if ended:
                        out.fail(f"{where}: a second end record")
                    if cut is not None:
                        self.end(row["data"], *cut, tally, out)
                    ended = True
                continue
            if cut is None:
                raise Bad(f"{where}: no checkpoint before the rows")
            if ended:
                out.fail(f"{where}: rows after the end record")
            seq, canonical = int(row["seq"]), str(row["canonical"])
            leaf = leaf_hash(canonical.encode())
            try:
                included = verify_inclusion(leaf, seq - 1, cut[1], _hexes(row.get("proof")), cut[2])
            except ValueError:
                included = False
            if not included:
                out.fail(f"{where}: seq {seq}: its inclusion proof does not reach the checkpoint's root")
            content = json.loads(canonical)
            if content.get("seq") != seq:
                out.fail(f"{where}: seq column {seq} differs from the committed seq {content.get('seq')}")
            for column in CONTENT_COLUMNS if row.get("shown") is not None else ():
                if column in row["shown"] and _cell(row["shown"][column]) != _cell(content.get(column)):
                    out.fail(f"{where}: seq {seq}: column {column!r} differs from the committed content")
            if self.hmac_key is not None:
                mac = hmac.new(
                    self.hmac_key, canonical.encode() + b"|" + row["prev_digest"].encode(), "sha256"
                )
                if not hmac.compare_digest(mac.hexdigest(), row["digest"]):
                    out.fail(f"{where}: seq {seq}: the chain HMAC does not verify (edited, or the wrong key)")
            if seq == 1 and row["prev_digest"] != GENESIS:
                out.fail(f"{where}: seq 1 does not start from the genesis digest")
            if prev_seq is not None and seq <= prev_seq:
                out.fail(f"{where}: seq {seq} out of order after {prev_seq}")
            elif prev_seq is not None and seq == prev_seq + 1 and row["prev_digest"] != prev_digest:
                out.fail(f"{where}: seq {seq} does not link to seq {prev_seq}")
            elif self.args.contiguous and seq != (prev_seq or 0) + 1:
                out.fail(f"{where}: seqs {(prev_seq or 0) + 1}..{seq - 1} missing")
            if seq == len_of(frontier) + 1:  # rows 1..seq so far: the tree can be rebuilt
                _push(frontier, leaf)
                _check_kept(kept, frontier, seq, row, out)
            tally["rows"] += 1
            tally["first"] = seq if tally["first"] is None else tally["first"]
            tally["last"] = seq
            tally["hash"].update(f"{seq} {leaf.hex()}\n".encode())
            prev_seq, prev_digest = seq, row["digest"]
        if cut is None:
            raise Bad("no checkpoint record: this is not an audit export")
        if not ended:
            out.fail("no end record: the export is truncated (its tail is missing)")
        if kept is not None and not kept.get("seen"):
            _kept_by_proof(kept, cut, out)
        out.lines.insert(0, f"OK: {tally['rows']} rows verified in the tree of {cut[1]} of log {cut[0]}")


def len_of(frontier: list[tuple[int, bytes]]) -> int:
    return sum(size for size, _ in frontier)


def _push(frontier: list[tuple[int, bytes]], node: bytes) -> None:
    size = 1
    while frontier and frontier[-1][0] == size:
        node, size = node_hash(frontier.pop()[1], node), size * 2
    frontier.append((size, node))


def _root(frontier: list[tuple[int, bytes]]) -> bytes:
    if not frontier:
        return EMPTY_ROOT
    root = frontier[-1][1]
    for _, left in reversed(frontier[:-1]):
        root = node_hash(left, root)
    return root


def _kept_checkpoint(path: Path, verifier: Verifier) -> dict[str, Any]:
    raw = path.read_text(encoding="utf-8")
    data = json.loads(raw) if raw.lstrip().startswith("{") else {"checkpoint": raw}
    kept: dict[str, Any] = {"seq": data.get("seq"), "digest": data.get("digest"), "seen": False}
    if data.get("checkpoint"):
        kept["origin"], kept["size"], kept["root"], _ = verifier.checkpoint(
            data["checkpoint"], f"checkpoint {path}"
        )
    return kept


def _check_kept(
    kept: dict[str, Any] | None, frontier: list[tuple[int, bytes]], seq: int, row: dict[str, Any], out: Report
) -> None:
    if kept is None:
        return
    if kept.get("seq") == seq and kept.get("digest") and row["digest"] != kept["digest"]:
        out.fail(f"seq {seq}: the chain digest differs from your checkpoint's: history was rewritten")
    if kept.get("size") == seq:
        kept["seen"] = True
        if _root(frontier) != kept["root"]:
            out.fail(
                f"the tree of the first {seq} rows differs from your checkpoint's: history was rewritten"
            )


def _kept_by_proof(kept: dict[str, Any], cut: tuple[str, int, bytes], out: Report) -> None:
    if "size" not in kept:
        return
    if kept["origin"] != cut[0]:
        out.fail(f"your checkpoint is from another log ({kept['origin']})")
    elif kept["size"] > cut[1]:
        out.fail(
            f"your checkpoint covers {kept['size']} events, the export's only {cut[1]}: the log's tail was removed"
        )
    elif kept["size"] == cut[1] and kept["root"] != cut[2]:
        out.fail(
            "your checkpoint and the export's have the same size and different roots: history was rewritten"
        )
    elif kept["size"] == 0 or kept["size"] == cut[1]:
        return
    else:
        out.fail(
            f"this export does not rebuild the tree up to your checkpoint's size {kept['size']} (export the "
            "whole log, or check checkpoint files with --consistency)"
        )


def verify_consistency_files(old_path: Path, new_path: Path, verifier: Verifier) -> list[str]:
    old, new = (json.loads(p.read_text()) for p in (old_path, new_path))
    o_origin, o_size, o_root, _ = verifier.checkpoint(old["checkpoint"], "the old checkpoint")
    n_origin, n_size, n_root, _ = verifier.checkpoint(new["checkpoint"], "the new checkpoint")
    if o_origin != n_origin:
        return [f"the checkpoints are from two logs ({o_origin}, {n_origin})"]
    consistency = new.get("consistency") or {}
    if int(consistency.get("from_size", -1)) != o_size:
        return [f"the new checkpoint carries no consistency proof from size {o_size}"]
    if not checkpoints_consistent(o_size, n_size, o_root, n_root, _hexes(consistency.get("proof"))):
        return [f"the tree of {n_size} is not an extension of the tree of {o_size}: history was rewritten"]
    print(f"OK: tree of {n_size} is an append-only extension of the tree of {o_size} (log {n_origin})")
    return []


def _keys(values: list[str], files: list[Path]) -> list[Key]:
    lines = [
        *values,
        *(ln for f in files for ln in f.read_text().splitlines() if ln.strip() and not ln.startswith("#")),
    ]
    return [Key(v) for v in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "export", type=Path, nargs="?", help="a .csv/.jsonl export, or an evidence pack (.zip or directory)"
    )
    parser.add_argument(
        "--vkey", action="append", default=[], help="the log's verifier key (repeat for rotated keys)"
    )
    parser.add_argument(
        "--vkey-file", action="append", default=[], type=Path, help="a file of verifier keys, one a line"
    )
    parser.add_argument("--origin", help="require this log origin")
    parser.add_argument(
        "--witness", action="append", default=[], help="a witness's cosigner key that must have cosigned"
    )
    parser.add_argument(
        "--witness-file", action="append", default=[], type=Path, help="a file of witness keys"
    )
    parser.add_argument(
        "--contiguous", action="store_true", help="no seq missing from 1 on (unfiltered exports)"
    )
    parser.add_argument(
        "--checkpoint", type=Path, help="a checkpoint you kept (note or audit_checkpoint JSON)"
    )
    parser.add_argument(
        "--consistency", nargs=2, type=Path, metavar=("OLD", "NEW"), help="two checkpoint files"
    )
    parser.add_argument(
        "--hmac-key-file", type=Path, help="also check each row's chain HMAC (AUDIT_HMAC_KEY)"
    )
    args = parser.parse_args(argv)
    try:
        keys = _keys(args.vkey, args.vkey_file)
        witnesses = _keys(args.witness, args.witness_file)
    except (Bad, OSError) as exc:
        parser.error(str(exc))
    if not any(k.type == 1 for k in keys):
        parser.error(
            "give the log's verifier key: --vkey or --vkey-file (manage.py audit_keys, /audit/log/keys)"
        )
    if any(k.type != 4 for k in witnesses):
        parser.error("witness keys are cosignature keys (type 0x04)")
    if args.export is None and not args.consistency:
        parser.error("give an export file or --consistency OLD NEW")
    verifier, report = Verifier(args, [k for k in keys if k.type == 1], witnesses), Report()
    try:
        if args.consistency:
            report.errors += verify_consistency_files(args.consistency[0], args.consistency[1], verifier)
        if args.export is not None:
            verifier.export(args.export, report)
    except TooMany:
        pass
    except (Bad, OSError, ValueError, KeyError, TypeError) as exc:
        report.errors.append(str(exc) or type(exc).__name__)
    for line in report.errors:
        print(f"FAIL {line}", file=sys.stderr)
    if not report.errors:
        print("\n".join(report.lines))
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
