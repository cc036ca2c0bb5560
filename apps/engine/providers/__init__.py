"""Worker providers: OpenAI (+ compatible endpoints), Anthropic, local GGUF via llama-cpp.

SDK imports happen inside the provider modules, so importing this package stays cheap.
"""

from apps.engine.providers.base import (
    ProviderAuthError,
    ProviderBadRequest,
    ProviderCancelled,
    ProviderContextTooLong,
    ProviderEgressDenied,
    ProviderError,
    ProviderModelNotFound,
    ProviderRateLimited,
    ProviderRedirect,
    ProviderTimeout,
    ProviderUnavailable,
    Worker,
    call_with_retries,
)
from apps.engine.providers.factory import PROVIDER_KINDS, build_worker
from apps.engine.providers.gate import (
    Admitted,
    OutboundGate,
    ProviderRequestRefused,
    gate_without_policy,
)

__all__ = [
    "PROVIDER_KINDS",
    "Admitted",
    "OutboundGate",
    "ProviderAuthError",
    "ProviderBadRequest",
    "ProviderCancelled",
    "ProviderContextTooLong",
    "ProviderEgressDenied",
    "ProviderError",
    "ProviderModelNotFound",
    "ProviderRateLimited",
    "ProviderRedirect",
    "ProviderRequestRefused",
    "ProviderTimeout",
    "ProviderUnavailable",
    "Worker",
    "build_worker",
    "call_with_retries",
    "gate_without_policy",
]
