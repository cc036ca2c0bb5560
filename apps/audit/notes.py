"""C2SP signed notes, checkpoints and Ed25519 cosignatures, so existing transparency tooling
(Go's ``golang.org/x/mod/sumdb/note``, transparency-dev, witnesses) reads our tree heads.

* signed-note (c2sp.org/signed-note): a text ending in a newline, a blank line, then signature
  lines ``— <key name> base64(key id (4 bytes, big-endian) || signature)``. An Ed25519 key's id
  is ``SHA-256(name || "\\n" || 0x01 || public key)[:4]`` and its verifier key ("vkey") is
  ``<name>+<8 hex digits of the id>+base64(0x01 || public key)``.
* tlog-checkpoint (c2sp.org/tlog-checkpoint): the note text is ``<origin>\\n<tree size>\\n
  base64(root hash)\\n`` (then optional extension lines; we write none).
* tlog-cosignature (c2sp.org/tlog-cosignature), Ed25519 type 0x04: a witness signs
  ``"cosignature/v1\\ntime <t>\\n" || checkpoint text`` and the signature bytes are
  ``u64 t (big-endian) || Ed25519 signature``.

Signing and verifying go through ``cryptography``; ``scripts/verify_audit_export.py`` carries
its own standard-library verifier of the same formats (an auditor needs nothing installed).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ED25519 = 0x01  # signed-note signature type: a log's (or any) Ed25519 note signature
COSIGNATURE_V1 = 0x04  # tlog-cosignature: a witness's timestamped Ed25519 cosignature
_TYPES = {ED25519: "Ed25519", COSIGNATURE_V1: "Ed25519 cosignature/v1"}
DASH = "\u2014"  # em dash: every signature line starts with it
MAX_SIGNATURES = 100  # the spec asks verifiers to accept at least 16
EMPTY_ROOT = hashlib.sha256(b"").digest()


class NoteError(ValueError):
    """A malformed note, key or checkpoint, or a signature that does not verify."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError, UnicodeEncodeError) as exc:
        raise NoteError(f"{what} is not standard base64") from exc


def valid_name(name: str) -> bool:
    """Key names (and our origins): non-empty, no Unicode space, no plus sign."""
    return bool(name) and "+" not in name and not any(ch.isspace() for ch in name)


def key_id(name: str, sig_type: int, public: bytes) -> int:
    return int.from_bytes(hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public).digest()[:4])


def cosignature_message(timestamp: int, text: str) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


# --- keys --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verifier:
    """A public key with its note name and type (a vkey)."""

    name: str
    sig_type: int
    public: bytes

    @property
    def key_id(self) -> int:
        return key_id(self.name, self.sig_type, self.public)

    @property
    def vkey(self) -> str:
        return f"{self.name}+{self.key_id:08x}+{b64(bytes([self.sig_type]) + self.public)}"

    @property
    def kind(self) -> str:
        return _TYPES[self.sig_type]

    def verify(self, text: str, raw: bytes) -> int | None:
        """Whether ``raw`` (the signature bytes after the key id) signs ``text``. Returns the
        cosignature's timestamp for a cosigner (0 for a plain signature), None when invalid."""
        timestamp = 0
        message = text.encode()
        if self.sig_type == COSIGNATURE_V1:
            if len(raw) != 72:
                return None
            timestamp = int.from_bytes(raw[:8])
            if timestamp >= 1 << 63:
                return None
            message, raw = cosignature_message(timestamp, text), raw[8:]
        elif len(raw) != 64:
            return None
        try:
            Ed25519PublicKey.from_public_bytes(self.public).verify(raw, message)
        except (InvalidSignature, ValueError):
            return None
        return timestamp


def parse_vkey(vkey: str) -> Verifier:
    """``<name>+<hex id>+<base64(type || key)>`` as Go's ``note.NewVerifier`` reads it."""
    name, sep, rest = vkey.strip().partition("+")
    hex_id, sep2, key_b64 = rest.partition("+")
    if not (sep and sep2 and valid_name(name) and len(hex_id) == 8):
        raise NoteError(f"not a verifier key (name+8 hex digits+base64): {vkey[:80]!r}")
    try:
        claimed = int(hex_id, 16)
    except ValueError:
        raise NoteError(f"verifier key id {hex_id!r} is not 8 hex digits") from None
    if hex_id != hex_id.lower() and hex_id != hex_id.upper():
        raise NoteError(f"verifier key id {hex_id!r} is not 8 hex digits")
    data = unb64(key_b64, "the verifier key")
    if len(data) != 33 or data[0] not in _TYPES:
        raise NoteError("the verifier key is not an Ed25519 key (type 0x01 or 0x04, 32 bytes)")
    verifier = Verifier(name, data[0], data[1:])
    if verifier.key_id != claimed:
        raise NoteError(f"verifier key id {hex_id} does not match its name and key")
    return verifier


@dataclass(frozen=True)
class Signer:
    name: str
    seed: bytes = field(repr=False)
    sig_type: int = ED25519

    def __post_init__(self) -> None:
        if not valid_name(self.name):
            raise NoteError(f"key name {self.name!r} must be non-empty, without spaces or '+'")
        if len(self.seed) != 32:
            raise NoteError("an Ed25519 private key is 32 bytes")

    @property
    def _key(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.seed)

    @property
    def public(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        return self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)

    @property
    def verifier(self) -> Verifier:
        return Verifier(self.name, self.sig_type, self.public)

    def signature_line(self, text: str, *, timestamp: int = 0) -> str:
        if self.sig_type == COSIGNATURE_V1:
            raw = timestamp.to_bytes(8) + self._key.sign(cosignature_message(timestamp, text))
        else:
            raw = self._key.sign(text.encode())
        return f"{DASH} {self.name} {b64(self.verifier.key_id.to_bytes(4) + raw)}\n"


def parse_private_key(skey: str) -> Signer:
    """Go's ``PRIVATE+KEY+<name>+<hex id>+base64(0x01 || seed)`` (``note.NewSigner``)."""
    parts = skey.strip().split("+", 4)  # base64 may hold plus signs too
    if len(parts) != 5 or parts[:2] != ["PRIVATE", "KEY"]:
        raise NoteError("not a note private key (PRIVATE+KEY+name+id+base64)")
    data = unb64(parts[4], "the private key")
    if len(data) != 33 or data[0] != ED25519:
        raise NoteError("the private key is not an Ed25519 key")
    signer = Signer(parts[2], data[1:])
    if f"{signer.verifier.key_id:08x}" != parts[3].lower():
        raise NoteError("the private key's id does not match its name and key")
    return signer


# --- notes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Signature:
    name: str
    key_id: int
    raw: bytes  # after the 4-byte key id
    line: str  # as it appeared, with its newline


@dataclass(frozen=True)
class Note:
    text: str
    signatures: tuple[Signature, ...]

    def with_lines(self, lines: list[str]) -> str:
        return self.text + "\n" + "".join(s.line for s in self.signatures) + "".join(lines)

    def serialise(self) -> str:
        return self.with_lines([])


def parse_signature_line(line: str) -> Signature:
    if not line.startswith(DASH + " "):
        raise NoteError("a signature line starts with an em dash and a space")
    name, sep, sig_b64 = line[2:].rstrip("\n").partition(" ")
    if not sep or not valid_name(name) or " " in sig_b64:
        raise NoteError(f"malformed signature line {line[:80]!r}")
    raw = unb64(sig_b64, "a signature")
    if len(raw) < 5:
        raise NoteError("a signature holds a 4-byte key id and the signature")
    return Signature(name, int.from_bytes(raw[:4]), raw[4:], line if line.endswith("\n") else line + "\n")


def parse_note(data: str | bytes) -> Note:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError:
            raise NoteError("a note is UTF-8") from None
    if any(ord(ch) < 0x20 and ch != "\n" for ch in data) or "\x7f" in data:
        raise NoteError("a note holds no control characters other than newline")
    if not data.endswith("\n"):
        raise NoteError("a note ends with a newline")
    cut = data.rfind("\n\n")
    if cut < 0:
        raise NoteError("a note's text and signatures are separated by a blank line")
    text, sig_block = data[: cut + 1], data[cut + 2 :]
    lines = sig_block.splitlines(keepends=True)
    if not lines:
        raise NoteError("a note has at least one signature")
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"more than {MAX_SIGNATURES} signatures")
    return Note(text, tuple(parse_signature_line(line) for line in lines))


@dataclass(frozen=True)
class Opened:
    note: Note
    verified: tuple[tuple[Verifier, int], ...]  # (key, cosignature time or 0)


def open_note(data: str | bytes, verifiers: list[Verifier]) -> Opened:
    """Verify a note against known keys, as signed-note requires: signatures from unknown keys
    are ignored; a known key's bad signature rejects the note; at least one must verify."""
    note = parse_note(data)
    known = {(v.name, v.key_id): v for v in verifiers}
    verified: list[tuple[Verifier, int]] = []
    for sig in note.signatures:
        key = known.get((sig.name, sig.key_id))
        if key is None:
            continue
        when = key.verify(note.text, sig.raw)
        if when is None:
            raise NoteError(f"the signature of {key.name}+{key.key_id:08x} does not verify")
        verified.append((key, when))
    if not verified:
        raise NoteError("no signature from a known key")
    return Opened(note, tuple(verified))


# --- checkpoints -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "".join(
            f"{line}\n" for line in (self.origin, str(self.size), b64(self.root), *self.extensions)
        )


def parse_checkpoint(text: str) -> Checkpoint:
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "" or any(not line for line in lines[:-1]):
        raise NoteError("a checkpoint is at least three non-empty lines: origin, size, root hash")
    origin, size_text, root_text = lines[0], lines[1], lines[2]
    if not size_text.isdigit() or not size_text.isascii() or (size_text != "0" and size_text[0] == "0"):
        raise NoteError(f"checkpoint size {size_text!r} is not a decimal without leading zeros")
    root = unb64(root_text, "the checkpoint's root hash")
    if len(root) != 32:
        raise NoteError("a checkpoint's root hash is 32 bytes")
    size = int(size_text)
    if size == 0 and root != EMPTY_ROOT:
        raise NoteError("a checkpoint of size 0 has the empty tree's root hash")
    return Checkpoint(origin, size, root, tuple(lines[3:-1]))
