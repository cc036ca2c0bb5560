"""OpenAI Embeddings (``POST /v1/embeddings``) through the same gate as chat (issue 45).

RAG clients use one base URL: the official SDK's ``embeddings.create`` works unchanged. An
embeddings request is not a run (nothing is planned or answered), but it crosses the same
boundaries a run's provider calls do:

- the key (401/429), its scope (``runs:write``: the scope that lets a key send text to the
  team's models) and its pools (``model`` names a pool as on ``/v1/models``: the pool's default
  worker embeds, so an *embedding pool* is a pool whose default worker names an embedding model);
- the token rate limit and the team's hard budgets (429 naming them) before any provider call;
- the team's input policy: the length limit per input, then every input as its own field
  ``input[i]`` through the outbound gate (``apps.engine.providers.gate``) — ``redact`` masks what
  the provider receives, ``block`` refuses naming the field and the rule; token arrays are refused
  (400 ``param=input``): the policy cannot read them;
- egress (the worker's HTTP client checks the address at connect time, as for every worker);
- one audit row (``embedding.created`` / ``embedding.refused``) with SHA-256 digests of the inputs,
  never their text or the vectors; the tokens charged to the key's per-minute window;
- the worker's circuit breaker (``apps.workers.health``), as a run's calls: each call's end feeds
  it, and while it is open the worker is not called (503 ``circuit_open`` naming the worker).
"""

from __future__ import annotations

import base64
import hashlib
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.api import ratelimit
from apps.api import selectors as api_sel
from apps.api.models import ApiKey, ApiScope
from apps.api.v1 import auth, targets
from apps.api.v1.errors import (
    ApiError,
    BodyRules,
    bad_param,
    error_response,
    json_body,
    method_not_allowed,
)
from apps.api.v1.shaping import failure_cause
from apps.audit.events import AuditEventType
from apps.audit.services import audit_record
from apps.core.executor_db import off_loop
from apps.engine import health as engine_health
from apps.engine.checks import CheckResult
from apps.engine.events import CheckStatus
from apps.engine.providers import ProviderError, ProviderRequestRefused
from apps.engine.types import EmbeddingResult
from apps.policies.outbound import outbound_gate
from apps.runs import integration
from apps.workers.engine_adapter import PoolUnavailable, build_engine_worker
from apps.workers.health import DbWorkerHealth
from apps.workers.models import EmbeddingSpend, Worker

logger = logging.getLogger(__name__)

BODY_RULES = BodyRules(
    required=("model", "input"),
    known=frozenset({"model", "input", "encoding_format", "dimensions", "user"}),
    neutral={},
    reasons={},
)
MAX_INPUTS = 2048  # OpenAI's limit per request
ENCODINGS = ("float", "base64")
# Provider kinds with an embeddings API (Anthropic has none).
EMBEDDING_PROVIDER_KINDS = frozenset({"openai", "openai_compatible", "local"})
# Provider kinds that honour ``dimensions`` (OpenAI's text-embedding-3 models and compatible servers).
DIMENSION_PROVIDER_KINDS = frozenset({"openai", "openai_compatible"})
PURPOSE = "/v1/embeddings"


@dataclass(frozen=True)
class EmbeddingRequest:
    model: Any
    inputs: list[str]
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


def _is_token_array(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
    )


def parse_inputs(value: Any) -> list[str]:
    """``input``: a string or an array of strings. Token arrays (integers, or arrays of them) are
    refused by name: the input policy reads text, and token ids differ between the pool's models."""
    if isinstance(value, str):
        value = [value]
    if _is_token_array(value) or (
        isinstance(value, list) and value and all(_is_token_array(v) for v in value)
    ):
        raise bad_param(
            "Token arrays are not accepted as 'input': the team's input policy reads text, and token ids "
            "differ between the pool's models. Send the text.",
            "input",
            "unsupported_input",
        )
    if not isinstance(value, list) or not value:
        raise bad_param("'input' must be a non-empty string or a non-empty array of strings.", "input")
    if len(value) > MAX_INPUTS:
        raise bad_param(f"'input' may hold at most {MAX_INPUTS} strings.", "input")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise bad_param("Each input must be a string.", f"input[{i}]", "invalid_type")
        if not text.strip():
            raise bad_param("An input must not be empty.", f"input[{i}]")
    return list(value)


def parse_embedding_request(raw: bytes) -> EmbeddingRequest:
    body = json_body(raw, BODY_RULES)
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ENCODINGS:
        raise bad_param("'encoding_format' must be 'float' or 'base64'.", "encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool) or not isinstance(dimensions, int) or dimensions < 1
    ):
        raise bad_param("'dimensions' must be a positive integer.", "dimensions")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad_param("'user' must be a string.", "user", "invalid_type")
    return EmbeddingRequest(
        model=body.get("model"),
        inputs=parse_inputs(body.get("input")),
        encoding_format=encoding or "float",
        dimensions=dimensions,
        user=user[:256] if user else None,
    )


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def encode_vector(vector: Sequence[float], encoding: str) -> list[float] | str:
    """A vector as OpenAI sends it: floats, or base64 of little-endian float32 (what the SDK asks
    for by default and decodes)."""
    if encoding == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return list(vector)


def _check_dicts(checks: Sequence[CheckResult]) -> list[dict[str, Any]]:
    return [{k: c.to_dict()[k] for k in ("name", "stage", "status", "action", "detail")} for c in checks]


def _length_checks(effective: Any, inputs: list[str]) -> tuple[list[str], list[CheckResult]]:
    """The input policy's length limit, per input (each is its own document): ``block`` refuses
    naming the input, ``redact`` truncates, ``warn`` / ``require_review`` are recorded."""
    cfg = effective.spec.guardrails.input.length
    if not cfg.enabled or cfg.max_chars is None:
        return inputs, []
    rule = "guardrails.input.length"
    out, checks = list(inputs), []
    for i, text in enumerate(inputs):
        if len(text) <= cfg.max_chars:
            continue
        detail = f"input[{i}]: {len(text)} characters, over {cfg.max_chars} ({rule}: {cfg.action})"
        checks.append(CheckResult("length", "input", CheckStatus.INTERVENED, cfg.action, detail))
        if cfg.action == "block":
            raise ProviderRequestRefused(
                f"input[{i}] holds {len(text)} characters, over the limit of {cfg.max_chars} ({rule}: block); "
                "nothing was sent",
                field=f"input[{i}]",
                rule=rule,
                checks=checks,
            )
        if cfg.action == "redact":
            out[i] = text[: cfg.max_chars]
    return out, checks


def _audit(
    *,
    event: AuditEventType,
    key: ApiKey,
    req: EmbeddingRequest,
    request_id: str,
    target: targets.Target,
    worker: Worker,
    checks: Sequence[CheckResult],
    result: EmbeddingResult | None = None,
    refusal: dict[str, Any] | None = None,
) -> None:
    payload: dict[str, Any] = {
        "request_id": request_id,
        "model": target.model,
        "pool": target.pool.slug,
        "worker": worker.slug,
        "provider_kind": worker.provider.kind,
        "inputs": len(req.inputs),
        # Digests of the inputs as the client sent them: a reviewer holding a document can prove it
        # was (or was not) embedded without the trail holding any text.
        "input_sha256": [digest(t) for t in req.inputs],
        "encoding_format": req.encoding_format,
        "dimensions": req.dimensions,
        "checks": _check_dicts(checks),
    }
    if req.user:
        payload["user_sha256"] = digest(req.user)
    if result is not None:
        payload.update(
            {
                "provider_model": result.model,
                "prompt_tokens": result.usage.input_tokens,
                "cost_usd": str(result.cost_usd) if result.cost_usd is not None else None,
                "priced": result.priced,
                "latency_ms": round(result.latency_ms, 1),
                "vectors": len(result.vectors),
                "dimensions_returned": len(result.vectors[0]) if result.vectors else 0,
            }
        )
    if refusal is not None:
        payload["refusal"] = refusal
    with transaction.atomic():
        if result is not None:
            # What the team's budgets count (apps.runs.policy_ports.team_spend), with its record.
            EmbeddingSpend.objects.create(
                team=key.team,
                pool=target.pool,
                worker=worker,
                request_id=request_id[:64],
                input_tokens=result.usage.input_tokens,
                cost_usd=result.cost_usd,
            )
        audit_record(
            event_type=event,
            actor=key.created_by,
            team=key.team,
            object_type="workers.pool",
            object_id=str(target.pool.pk),
            object_repr=target.pool.slug,
            payload=payload,
            api_key_id=key.pk,
        )


def _worker_for(target: targets.Target, req: EmbeddingRequest) -> Worker:
    pool = target.pool
    if not pool.enabled:
        raise ApiError(
            503, f"The pool '{pool.slug}' is disabled.", type_="server_error", code="pool_unavailable"
        )
    worker = (
        Worker.objects.select_related("provider").filter(pk=pool.default_worker_id).first()
        if pool.default_worker_id
        else None
    )
    if worker is None:
        raise bad_param(
            f"The pool '{pool.slug}' has no default worker to embed with.", "model", "model_not_supported"
        )
    kind = worker.provider.kind
    if kind not in EMBEDDING_PROVIDER_KINDS:
        raise bad_param(
            f"The pool '{pool.slug}' embeds with its default worker '{worker.slug}', whose provider kind "
            f"'{kind}' has no embeddings API; use a pool whose default worker is OpenAI, "
            "OpenAI-compatible or local.",
            "model",
            "model_not_supported",
        )
    if req.dimensions is not None and kind not in DIMENSION_PROVIDER_KINDS:
        raise bad_param(
            f"'dimensions' is not supported by the pool '{pool.slug}': its worker '{worker.slug}' "
            f"(provider kind '{kind}') returns vectors of one size.",
            "dimensions",
            "unsupported_parameter",
        )
    return worker


def _provider_error(err: ProviderError) -> ApiError:
    """A provider failure in OpenAI's shape (the message is the typed error's own safe words)."""
    code = getattr(err, "code", "provider_error")
    if code in ("context_too_long", "bad_request"):
        return ApiError(400, str(err), param="input", code=code)
    if code == "timeout":
        return ApiError(504, str(err), type_="server_error", code="provider_timeout")
    if code == "egress_denied":
        return ApiError(
            503, str(err), type_="server_error", code="egress_denied", headers={"x-should-retry": "false"}
        )
    return ApiError(502, str(err), type_="server_error", code=f"provider_{code}")


def _circuit_open(worker: Worker) -> ApiError:
    """The worker's breaker is open: nothing was sent (the words a run's skipped step uses)."""
    cooldown = max(1, int(float(settings.CIRCUIT_COOLDOWN_S)))
    return ApiError(
        503,
        f"{engine_health.CIRCUIT_OPEN}: not called, the worker '{worker.slug}' failed repeatedly in "
        "recent calls and waits for its probe (its circuit breaker is open).",
        type_="server_error",
        code=engine_health.CIRCUIT_OPEN,
        headers={"Retry-After": str(cooldown)},
    )


def create_embeddings(request: HttpRequest) -> dict[str, Any]:
    """Authenticate, parse, authorise, check the limits and the policy, embed, audit. Raises
    ApiError (every refusal names the field, scope, limit or rule)."""
    key = auth.authenticate(request)
    state = auth.request_state(request)
    req = parse_embedding_request(request.body)
    refusal = api_sel.scope_refusal(key, ApiScope.RUNS_WRITE)
    if refusal is not None:
        raise auth.deny(key, 403, "insufficient_scope", refusal, detail=ApiScope.RUNS_WRITE)
    target = targets.resolve_model(key, req.model)
    if not target.team_allowed:
        raise auth.deny(
            key,
            403,
            "team_not_allowed",
            f"This API key may not use the team '{key.team.slug}'s models.",
            detail=key.team.slug,
            param="model",
        )
    worker = _worker_for(target, req)
    tokens = state.tokens or ratelimit.check_tokens(key_prefix=key.prefix, limit=key.tokens_per_minute)
    if not tokens.allowed:
        raise ApiError(
            429,
            f"Rate limit reached: {tokens.limit} tokens per minute for this key. Try again in {tokens.retry_after_s}s.",
            type_="tokens",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(tokens.retry_after_s)},
        )
    policy = integration.policy_in_force(key.team, getattr(key, "access_stamp", None))
    try:
        integration.check_budget(key.team, policy)
    except integration.BudgetRefusal as exc:
        headers = {"x-should-retry": "false"}
        if exc.retry_after_s:
            headers["Retry-After"] = str(int(exc.retry_after_s))
        raise ApiError(
            429, exc.message, type_="insufficient_quota", code="budget_exhausted", param=None, headers=headers
        ) from None
    audit_kw: dict[str, Any] = {
        "key": key,
        "req": req,
        "request_id": state.request_id,
        "target": target,
        "worker": worker,
    }
    checks: list[CheckResult] = []
    # The breaker a run's calls feed (issue 44): an open one refuses before anything is sent.
    health = DbWorkerHealth()
    if not engine_health.admit(health, worker.slug):
        _audit(
            event=AuditEventType.EMBEDDING_REFUSED,
            checks=checks,
            refusal={"provider_error": engine_health.CIRCUIT_OPEN},
            **audit_kw,
        )
        raise _circuit_open(worker)
    try:
        inputs, checks = _length_checks(policy.effective, req.inputs)
        engine_worker = build_engine_worker(worker, gate=outbound_gate(policy.effective))
        result: EmbeddingResult = engine_worker.embed(  # type: ignore[attr-defined]
            inputs, dimensions=req.dimensions, timeout=float(worker.timeout_s)
        )
    except ProviderRequestRefused as refused:
        # A length refusal raises before ``checks`` is set: the two never repeat each other.
        _audit(
            event=AuditEventType.EMBEDDING_REFUSED,
            checks=[*checks, *refused.checks],
            refusal={"field": refused.field, "rule": refused.rule},
            **audit_kw,
        )
        raise ApiError(
            400,
            f"The request was refused by the team's input policy: {refused} (policy rule: {refused.rule}).",
            param=refused.field or "input",
            code="content_policy_violation",
            headers={"x-should-retry": "false"},
        ) from None
    except PoolUnavailable as err:
        raise ApiError(503, err.reason, type_="server_error", code="pool_unavailable") from None
    except ProviderError as err:
        # Only failures that say the provider is down count (engine_health.says_down).
        engine_health.record(health, worker.slug, error=err, latency_ms=None)
        _audit(
            event=AuditEventType.EMBEDDING_REFUSED,
            checks=checks,
            refusal={"provider_error": getattr(err, "code", "provider_error")},
            **audit_kw,
        )
        raise _provider_error(err) from None
    state.provider_ms = result.latency_ms  # x-conductor-overhead-ms is the rest
    engine_health.record(health, worker.slug, error=None, latency_ms=result.latency_ms)
    _audit(
        event=AuditEventType.EMBEDDING_CREATED, checks=[*checks, *result.outbound], result=result, **audit_kw
    )
    # Accounting must never turn a served request into an error for its client.
    try:
        ratelimit.add_tokens(key_prefix=key.prefix, tokens=result.usage.input_tokens)
    except Exception:
        logger.warning("could not count the tokens of an embeddings request", exc_info=True)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(vector, req.encoding_format)}
            for i, vector in enumerate(result.vectors)
        ],
        "model": target.model,
        "usage": {"prompt_tokens": result.usage.input_tokens, "total_tokens": result.usage.input_tokens},
        "conductor": {"pool": target.pool.slug, "worker": worker.slug, "request_id": state.request_id},
    }


def _create(request: HttpRequest) -> dict[str, Any]:
    """``create_embeddings`` with a broken part (the database past its timeout, Redis) answered as
    a 503 naming the part, never an HTML 500."""
    try:
        return create_embeddings(request)
    except ApiError:
        raise
    except Exception as exc:
        logger.exception("an embeddings request failed")
        raise ApiError(503, f"No embedding was made: {failure_cause(exc)}.", type_="server_error") from exc


@csrf_exempt
async def embeddings_view(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return method_not_allowed("POST")
    try:
        body = await off_loop(_create, request)
    except ApiError as err:
        return error_response(err)
    return JsonResponse(body)
