#!/usr/bin/env python3
"""A small witness for Conductor Web audit logs (c2sp.org/tlog-witness, tlog-cosignature).

Run it somewhere the log's operator cannot write: it keeps its own state file (per log origin,
the size and root it last cosigned), cosigns a checkpoint only when it carries a valid signature
of a log key it trusts and is an append-only extension of that state (RFC 6962 consistency
proof), and refuses a fork. Needs Python 3.11+ and ``cryptography`` (to sign); verification
comes from ``verify_audit_export.py`` beside it (standard library only).

    python3 audit_witness.py keygen --name witness.example/w1 --key w1.key    # prints the vkey
    python3 audit_witness.py serve --name witness.example/w1 --key w1.key --state w1.json \\
        --log-vkey 'HOST/audit/LOGID+1a2b3c4d+Ab...' --listen 127.0.0.1:8070
    python3 audit_witness.py add ... < request     # one add-checkpoint request from a file

The log sends ``POST <url>/add-checkpoint`` (set ``AUDIT_WITNESSES="<vkey> http://host:8070/"``
on the log). Answers as the protocol says: 200 with the cosignature line; 409 with the size we
cosigned last (``text/x.tlog.size``) when the request's old size differs; 400 malformed; 403
no valid signature of a trusted key; 404 unknown origin; 422 inconsistent (a fork) or bad proof.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verify_audit_export as v

MAX_BODY = 64 * 1024


def _signer(seed: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(seed)


def _public(seed: bytes) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return _signer(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def vkey_of(name: str, seed: bytes) -> str:
    data = b"\x04" + _public(seed)
    key_id = int.from_bytes(hashlib.sha256(name.encode() + b"\n" + data).digest()[:4], "big")
    return f"{name}+{key_id:08x}+{base64.b64encode(data).decode()}"


class Witness:
    def __init__(self, name: str, seed: bytes, state: Path, log_keys: list[v.Key]) -> None:
        if not v._name_ok(name):
            raise SystemExit(f"witness name {name!r} must be non-empty, without spaces or '+'")
        self.name, self.seed, self.state, self.log_keys = name, seed, state, log_keys
        self.key = v.Key(vkey_of(name, seed))

    def cosign(self, text: str) -> str:
        when = int(time.time())
        message = f"cosignature/v1\ntime {when}\n{text}".encode()
        raw = self.key.id.to_bytes(4, "big") + when.to_bytes(8, "big") + _signer(self.seed).sign(message)
        return f"{v.DASH} {self.name} {base64.b64encode(raw).decode()}\n"

    def add_checkpoint(self, body: bytes) -> tuple[int, str, str]:
        """(status, content type, body) for one add-checkpoint request, state updated atomically."""
        try:
            head, sep, note = body.decode("utf-8").partition("\n\n")
            lines = head.split("\n")
            if not sep or not lines[0].startswith("old ") or not lines[0][4:].isdigit() or len(lines) > 64:
                raise v.Bad("the body is 'old <size>', proof lines, a blank line and the checkpoint")
            old = int(lines[0][4:])
            proof = [v.unb64(line) for line in lines[1:]]
            text = note.split("\n", 1)[0]
        except (UnicodeDecodeError, v.Bad) as exc:
            return 400, "text/plain", f"{exc}\n"
        keys = [k for k in self.log_keys if k.name == text]
        if not keys:
            return 404, "text/plain", f"unknown log origin {text!r}\n"
        try:
            checkpoint_text, _ = v.open_note(note, keys)
        except v.Bad as exc:
            return 403, "text/plain", f"{exc}\n"
        try:
            origin, size, root = v.parse_checkpoint(checkpoint_text)
        except v.Bad as exc:
            return 422, "text/plain", f"{exc}\n"
        if old > size:
            return 400, "text/plain", f"old size {old} is beyond the checkpoint's {size}\n"
        with self._locked() as state:
            mine = state.setdefault("logs", {}).get(
                origin, {"size": 0, "root": base64.b64encode(v.EMPTY_ROOT).decode()}
            )
            if old != mine["size"]:
                return 409, "text/x.tlog.size", f"{mine['size']}\n"
            if not v.checkpoints_consistent(old, size, base64.b64decode(mine["root"]), root, proof):
                print(
                    f"REFUSED fork of {origin}: size {size} is not an extension of size {old}",
                    file=sys.stderr,
                )
                return (
                    422,
                    "text/plain",
                    f"not consistent with the checkpoint of size {old} this witness cosigned\n",
                )
            line = self.cosign(checkpoint_text)
            state["logs"][origin] = {
                "size": size,
                "root": base64.b64encode(root).decode(),
                "checkpoint": note + line,
            }
            self._save(state)
        return 200, "text/plain; charset=utf-8", line

    def _locked(self) -> Any:
        witness = self

        class Held:
            def __enter__(self) -> dict[str, Any]:
                self.fh = witness.state.with_suffix(witness.state.suffix + ".lock").open("a")
                fcntl.flock(self.fh, fcntl.LOCK_EX)
                return json.loads(witness.state.read_text()) if witness.state.exists() else {"version": 1}

            def __exit__(self, *exc: object) -> None:
                fcntl.flock(self.fh, fcntl.LOCK_UN)
                self.fh.close()

        return Held()

    def _save(self, state: dict[str, Any]) -> None:
        temp = self.state.with_suffix(self.state.suffix + ".tmp")
        temp.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
        with temp.open("rb") as fh:
            os.fsync(fh.fileno())
        temp.replace(self.state)  # the new state is on disk before the cosignature leaves


def serve(witness: Witness, listen: str) -> None:
    host, _, port = listen.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path.rstrip("/").rsplit("/", 1)[-1] != "add-checkpoint":
                self._answer(404, "text/plain", "POST <prefix>/add-checkpoint\n")
                return
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 < length <= MAX_BODY:
                self._answer(400, "text/plain", "a body of at most 64 KiB\n")
                return
            self._answer(*witness.add_checkpoint(self.rfile.read(length)))

        def _answer(self, status: int, content_type: str, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"witness {witness.name}: {format % args}", file=sys.stderr, flush=True)

    server = HTTPServer((host.strip("[]") or "127.0.0.1", int(port)), Handler)
    print(f"witness {witness.key.vkey} listening on {listen}", flush=True)
    server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    keygen = sub.add_parser("keygen", help="write a new private key and print its vkey")
    keygen.add_argument("--name", required=True)
    keygen.add_argument("--key", type=Path, required=True)
    for name in ("serve", "add"):
        cmd = sub.add_parser(name)
        cmd.add_argument("--name", required=True, help="this witness's key name, e.g. witness.example/w1")
        cmd.add_argument("--key", type=Path, required=True, help="its private key file (keygen)")
        cmd.add_argument("--state", type=Path, required=True, help="its state file (created on first use)")
        cmd.add_argument("--log-vkey", action="append", required=True, help="a log key it trusts (repeat)")
        if name == "serve":
            cmd.add_argument("--listen", default="127.0.0.1:8070")
    args = parser.parse_args(argv)
    if not v._name_ok(args.name):
        parser.error(f"witness name {args.name!r} must be non-empty, without spaces or '+'")
    if args.command == "keygen":
        seed = os.urandom(32)
        args.key.touch(mode=0o600)
        args.key.write_text(base64.b64encode(seed).decode() + "\n")
        print(vkey_of(args.name, seed))
        return 0
    seed = base64.b64decode(args.key.read_text().strip())
    try:
        log_keys = [v.Key(k) for k in args.log_vkey]
    except v.Bad as exc:
        parser.error(str(exc))
    witness = Witness(args.name, seed, args.state, [k for k in log_keys if k.type == 1])
    if args.command == "serve":
        serve(witness, args.listen)
        return 0
    status, _, body = witness.add_checkpoint(sys.stdin.buffer.read(MAX_BODY + 1))
    print(status)
    sys.stdout.write(body)
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
