"""Cost of one call.

Order: local models cost exactly 0 (priced). Otherwise `genai-prices` where it knows the model
(for OpenAI and Anthropic proper; for OpenAI-compatible endpoints only when the endpoint URL
identifies a provider genai-prices knows, so a self-hosted model that happens to share a name
with a hosted one is not priced at the hosted rate), else the worker's configured per-million
prices, else unpriced: `(None, False)` — never a made-up $0.
"""

from __future__ import annotations

import ipaddress
import logging
from decimal import Decimal
from functools import lru_cache
from urllib.parse import urlsplit

from apps.engine.types import Usage, WorkerInfo

logger = logging.getLogger(__name__)

MTOK = Decimal(1_000_000)

# genai-prices provider ids for the kinds where the model name alone is authoritative.
_GENAI_PROVIDER = {"openai": "openai", "anthropic": "anthropic"}


@lru_cache(maxsize=512)
def _genai_unit_prices(
    model: str, provider_id: str | None, api_url: str | None
) -> tuple[Decimal, Decimal] | None:
    """Per-token (input, output) USD prices from genai-prices, cached: its lookup is a scan.
    Derived from two probe calculations so tiered/cached-token pricing does not leak in."""
    try:
        from genai_prices import Usage as GUsage
        from genai_prices import calc_price
    except ImportError:  # pragma: no cover — declared dependency
        return None

    def price(usage: GUsage) -> Decimal:
        if api_url is not None:
            return Decimal(calc_price(usage, model, provider_api_url=api_url).total_price)
        return Decimal(calc_price(usage, model, provider_id=provider_id).total_price)

    try:
        inp = price(GUsage(input_tokens=1_000_000, output_tokens=0))
        out = price(GUsage(input_tokens=0, output_tokens=1_000_000))
    except LookupError:
        return None
    except Exception:  # a data problem in the price table must not fail a run
        logger.warning("genai-prices failed for model %r", model, exc_info=True)
        return None
    return inp / MTOK, out / MTOK


def price_call(
    info: WorkerInfo, usage: Usage, *, model: str | None = None, base_url: str | None = None
) -> tuple[Decimal | None, bool]:
    """(cost_usd, priced) for one call by this worker."""
    if info.provider == "local":
        return Decimal(0), True
    model = model or info.model
    unit: tuple[Decimal, Decimal] | None = None
    provider_id = _GENAI_PROVIDER.get(info.provider)
    if provider_id is not None:
        unit = _genai_unit_prices(model, provider_id, None)
    elif info.provider == "openai_compatible" and base_url:
        unit = _genai_unit_prices(model, None, base_url) if _known_host(base_url) else None
    if unit is None and info.input_price_per_mtok is not None and info.output_price_per_mtok is not None:
        unit = (Decimal(info.input_price_per_mtok) / MTOK, Decimal(info.output_price_per_mtok) / MTOK)
    if unit is None:
        return None, False
    cost = unit[0] * usage.input_tokens + unit[1] * usage.output_tokens
    return cost.quantize(Decimal("0.000000001")), True


def _known_host(base_url: str) -> bool:
    # Loopback / private endpoints are self-hosted: never price them from a public table.
    host = (urlsplit(base_url).hostname or "").lower()
    if not host or host == "localhost" or host.endswith((".local", ".internal", ".localhost")):
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return True
    return not (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_unspecified)
