"""Provider credentials: the only module that sees a plaintext key.

A provider's key is either the *name* of an environment variable (read when a worker is built,
never stored) or a key encrypted at rest with Fernet under ``settings.SECRETS_ENCRYPTION_KEY``
(several comma-separated keys allow rotation: the first encrypts, all decrypt). Only the last four
characters are kept in clear, for the "•••• 1234" hint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

if TYPE_CHECKING:
    from apps.workers.models import Provider

# Kinds that cannot work without a key. OpenAI-compatible servers (vLLM, Ollama) often need none;
# local models never do.
KEY_REQUIRED_KINDS = frozenset({"openai", "anthropic"})


class SecretError(Exception):
    """A stored key could not be decrypted (wrong or rotated-away SECRETS_ENCRYPTION_KEY)."""


def _fernet() -> MultiFernet:
    keys = [k.strip() for k in str(settings.SECRETS_ENCRYPTION_KEY).split(",") if k.strip()]
    if not keys:
        raise SecretError("SECRETS_ENCRYPTION_KEY is not set.")
    return MultiFernet([Fernet(k.encode()) for k in keys])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretError(
            "The stored API key cannot be decrypted with the current SECRETS_ENCRYPTION_KEY; enter the key again."
        ) from None


def last4(plaintext: str) -> str:
    return plaintext[-4:] if len(plaintext) >= 8 else ""


def masked_hint(provider: Provider) -> str:
    """What the UI shows for a stored key: ``•••• 1234`` (or ``••••`` for a short key)."""
    if not provider.api_key_encrypted:
        return ""
    return f"•••• {provider.api_key_last4}" if provider.api_key_last4 else "••••"


@dataclass(frozen=True, slots=True)
class KeyStatus:
    available: bool
    reason: str  # plain words; empty when available
    source: str  # "env", "stored", "none"


def key_status(provider: Provider) -> KeyStatus:
    """Whether the provider has a usable key, and where it comes from, without revealing it."""
    if provider.kind == "local":
        return KeyStatus(True, "", "none")
    if provider.api_key_encrypted:
        try:
            decrypt(provider.api_key_encrypted)
        except SecretError as err:
            return KeyStatus(False, str(err), "stored")
        return KeyStatus(True, "", "stored")
    if provider.api_key_env:
        if os.environ.get(provider.api_key_env, "").strip():
            return KeyStatus(True, "", "env")
        return KeyStatus(
            False, f"The environment variable {provider.api_key_env} is not set on the server.", "env"
        )
    if provider.kind in KEY_REQUIRED_KINDS:
        return KeyStatus(False, f"No API key is configured for the provider “{provider.name}”.", "none")
    return KeyStatus(True, "", "none")


def resolve_api_key(provider: Provider) -> str | None:
    """The plaintext key to hand to the provider client, or None when none is needed/configured."""
    if provider.api_key_encrypted:
        return decrypt(provider.api_key_encrypted)
    if provider.api_key_env:
        return os.environ.get(provider.api_key_env, "").strip() or None
    return None
