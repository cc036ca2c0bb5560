"""Provider credentials: the only module that sees a plaintext key.

A provider's key is either the *name* of an environment variable (read when a worker is built,
never stored) or a key encrypted at rest with Fernet under ``settings.SECRETS_ENCRYPTION_KEY``
(several comma-separated keys allow rotation: the first encrypts, all decrypt). Only the last four
characters are kept in clear, for the "•••• 1234" hint.

An environment variable is read only if the operator allowed its name (``key_env_refusal``:
``PROVIDER_KEY_ENV_PREFIX`` or ``PROVIDER_KEY_ENV_ALLOWED``), checked again every time a key is
resolved, so a row stored before the rule existed cannot send e.g. ``DJANGO_SECRET_KEY`` to a
provider URL of its author's choosing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from apps.engine.providers.local import runtime_missing

if TYPE_CHECKING:
    from apps.workers.models import Provider

# Kinds that cannot work without a key. OpenAI-compatible servers (vLLM, Ollama) often need none;
# local models never do.
KEY_REQUIRED_KINDS = frozenset({"openai", "anthropic"})


# The server's own secrets are never a provider key, whatever the allow-list says.
NEVER_KEY_ENV = frozenset(
    {
        "DJANGO_SECRET_KEY",
        "SECRETS_ENCRYPTION_KEY",
        "AUDIT_HMAC_KEY",
        "AUDIT_SIGNING_KEY",
        "DEMO_PASSWORD",
        "DATABASE_URL",
        "REDIS_URL",
        "CELERY_BROKER_URL",
    }
)


def key_env_refusal(name: str) -> str | None:
    """Why the environment variable ``name`` may not be used as a provider key, or None.

    Checked before the variable is ever read, so a refusal says nothing about whether it is set.
    """
    prefix = str(getattr(settings, "PROVIDER_KEY_ENV_PREFIX", "") or "")
    allowed = {str(n).strip() for n in getattr(settings, "PROVIDER_KEY_ENV_ALLOWED", []) or []}
    if name not in NEVER_KEY_ENV and ((prefix and name.startswith(prefix)) or name in allowed):
        return None
    rule = f"names starting with {prefix} (PROVIDER_KEY_ENV_PREFIX)" if prefix else ""
    if allowed:
        rule += (" or " if rule else "") + "the names in PROVIDER_KEY_ENV_ALLOWED"
    return (
        f"The environment variable {name} is not allowed as a provider key: only "
        f"{rule or 'no names (PROVIDER_KEY_ENV_PREFIX and PROVIDER_KEY_ENV_ALLOWED are empty)'} "
        "may be used."
    )


class SecretError(Exception):
    """A stored key could not be decrypted (wrong or rotated-away SECRETS_ENCRYPTION_KEY)."""


def _fernet(encryption_keys: str | None = None) -> MultiFernet:
    if encryption_keys is None:
        encryption_keys = str(settings.SECRETS_ENCRYPTION_KEY)
    keys = [k.strip() for k in encryption_keys.split(",") if k.strip()]
    if not keys:
        raise SecretError("SECRETS_ENCRYPTION_KEY is not set.")
    return MultiFernet([Fernet(k.encode()) for k in keys])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    return _decrypt(token, str(settings.SECRETS_ENCRYPTION_KEY))


# Every run checks and resolves each worker's key (two Fernet decryptions, an HMAC each, per
# worker); the plaintext is held by that worker's SDK client anyway. Keyed by the token and the
# encryption keys, so a re-entered key or a changed SECRETS_ENCRYPTION_KEY is decrypted afresh; a
# failure is never cached.
@lru_cache(maxsize=256)
def _decrypt(token: str, encryption_keys: str) -> str:
    try:
        return _fernet(encryption_keys).decrypt(token.encode()).decode()
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
        return _local_runtime_status()
    if provider.api_key_encrypted:
        try:
            decrypt(provider.api_key_encrypted)
        except SecretError as err:
            return KeyStatus(False, str(err), "stored")
        return KeyStatus(True, "", "stored")
    if provider.api_key_env:
        refusal = key_env_refusal(provider.api_key_env)
        if refusal:
            return KeyStatus(False, refusal, "env")
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
        refusal = key_env_refusal(provider.api_key_env)
        if refusal:
            raise SecretError(refusal)
        return os.environ.get(provider.api_key_env, "").strip() or None
    return None


def _local_runtime_status() -> KeyStatus:
    """The local worker needs no key, but it needs llama-cpp-python: on a fresh `make demo` that is
    still compiling in the background while every other page already works."""

    missing = runtime_missing()
    if missing is None:
        return KeyStatus(True, "", "none")
    if Path(settings.LOCAL_MODEL_BUILD_MARKER).exists():
        return KeyStatus(
            False,
            "The local model is still building: llama-cpp-python compiles once in the background "
            "(progress in var/local-model-build.log). Other pools work meanwhile.",
            "none",
        )
    return KeyStatus(False, f"The local model cannot run: {missing} (run `make install-local`).", "none")
