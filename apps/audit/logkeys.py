"""The keys of the audit log, from settings: the one that signs checkpoints, the retired ones that
still verify old checkpoints, and the witnesses whose cosignatures we collect.

A key has no name of its own in settings: a note key's name is the log's origin
(c2sp.org/tlog-checkpoint: the log's key name SHOULD match the origin line), so the same seed in
two databases (two logs) gives two verifier keys with different names and key ids.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.audit import notes


def decode_seed(value: str, setting: str) -> bytes:
    """Base64 (standard or URL-safe, padding optional) of 32 bytes."""
    text = value.strip().replace("-", "+").replace("_", "/")
    try:
        raw = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise ImproperlyConfigured(f"{setting} must be the base64 of a 32-byte Ed25519 key")
    return raw


def log_signer(origin: str) -> notes.Signer:
    """The key that signs this log's new checkpoints (``AUDIT_SIGNING_KEY``)."""
    return notes.Signer(origin, decode_seed(settings.AUDIT_SIGNING_KEY, "AUDIT_SIGNING_KEY"))


def log_verifiers(origin: str) -> list[notes.Verifier]:
    """Every key whose signature on this log's checkpoints is trusted: the signing key, then the
    retired ones (``AUDIT_SIGNING_KEYS_RETIRED``), so rotation never orphans old checkpoints."""
    keys = [log_signer(origin).verifier]
    for value in getattr(settings, "AUDIT_SIGNING_KEYS_RETIRED", []) or []:
        public = decode_seed(value, "AUDIT_SIGNING_KEYS_RETIRED")
        if all(k.public != public for k in keys):
            keys.append(notes.Verifier(origin, notes.ED25519, public))
    return keys


@dataclass(frozen=True)
class Witness:
    key: notes.Verifier  # its cosignature/v1 key (type 0x04)
    url: str  # submission prefix: POST <url>/add-checkpoint

    @property
    def name(self) -> str:
        return self.key.name


def witnesses() -> list[Witness]:
    """``AUDIT_WITNESSES``: comma-separated ``<vkey> <url>`` entries."""
    out = []
    for entry in getattr(settings, "AUDIT_WITNESSES", []) or []:
        vkey, _, url = entry.strip().partition(" ")
        try:
            key = notes.parse_vkey(vkey)
        except notes.NoteError as exc:
            raise ImproperlyConfigured(f"AUDIT_WITNESSES: {exc}") from None
        if key.sig_type != notes.COSIGNATURE_V1 or not url.strip().startswith(("http://", "https://")):
            raise ImproperlyConfigured(
                "AUDIT_WITNESSES entries are '<cosigner vkey (type 0x04)> <http(s) url>', "
                f"got {entry[:120]!r}"
            )
        out.append(Witness(key, url.strip().rstrip("/") + "/"))
    return out


def generate_seed() -> str:
    """A new private key for AUDIT_SIGNING_KEY (``manage.py audit_keys --generate``)."""
    return base64.b64encode(secrets.token_bytes(32)).decode()
