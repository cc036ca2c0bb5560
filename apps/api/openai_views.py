"""OpenAI-compatible endpoints: ``GET /v1/models`` and ``POST /v1/chat/completions``.

Existing OpenAI clients drop in unchanged: requests and responses follow OpenAI's wire format,
errors use its shape ``{"error": {"message", "type", "param", "code"}}`` and status codes, and a
streamed answer is server-sent events in the chunk format ending with ``data: [DONE]``.

Models: ``conductor-mini`` / ``conductor-ultra`` run the conductor (that preset) on the key's
team's default pool; ``conductor-mini:<pool>`` / ``conductor-ultra:<pool>`` or a bare ``<pool>``
slug pick another pool the key may use. Every response names its run (``X-Conductor-Run`` header,
``conductor`` field) so a developer can open its live graph.

The views are async: waiting for a run costs no thread. A run's progress is followed by joining its
channel group ``run.<id>`` (a wake-up) and reading ``RunEvent`` rows by ``seq`` (the truth), so no
event is lost or repeated whichever channel layer is configured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.urls import NoReverseMatch, reverse
from django.views.decorators.csrf import csrf_exempt

from apps.api import keyguard, ratelimit
from apps.api import selectors as api_sel
from apps.api.authentication import presented_key
from apps.api.models import ApiKey, ApiScope
from apps.api.services import ApiKeyInvalid, apikey_record_denied

logger = logging.getLogger(__name__)

PRESETS = {"conductor-mini": "mini", "conductor-ultra": "ultra"}
MESSAGE_ROLES = {"system", "developer", "user", "assistant", "tool"}
# How long a follower sleeps between database reads when no channel message wakes it.
FOLLOW_POLL_S = 0.25
# Joining or leaving the run's channel group may not stall a client longer than this.
LAYER_OP_TIMEOUT_S = 2.0
# A streaming client re-reads the Run row this often, besides its events.
STATUS_CHECK_S = 2.0
# A client waits this long past the run's own deadline for its final event (the engine stops at
# the deadline, then records the verdict) before it is told to follow the run at its URL.
FOLLOW_GRACE_S = 30.0
# A quiet stream sends a comment this often so proxies do not close it.
KEEPALIVE_S = 15.0


class OpenAIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        conductor: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        self.conductor = conductor

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        }
        if self.conductor is not None:
            out["conductor"] = self.conductor
        return out


def error_response(err: OpenAIError) -> JsonResponse:
    response = JsonResponse(err.body(), status=err.status)
    for name, value in err.headers.items():
        response[name] = value
    return response


def _no_retry() -> dict[str, str]:
    # The OpenAI SDKs honour this header: a deterministic refusal must not be retried (a retry
    # would start another run).
    return {"x-should-retry": "false"}


# --- authentication and model resolution (sync: ORM) ---------------------------------------------


def _authenticate(request: HttpRequest) -> ApiKey:
    raw = presented_key(request)
    if raw is None:
        raise OpenAIError(
            401,
            "You didn't provide an API key. Send it as 'Authorization: Bearer cw_…'.",
            code="missing_api_key",
        )
    try:
        key = keyguard.authenticate(request, raw)
    except keyguard.KeyThrottled as exc:
        raise OpenAIError(
            429,
            exc.message,
            type_="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(exc.retry_after_s)},
        ) from None
    except ApiKeyInvalid as exc:
        raise OpenAIError(401, exc.reason, code=exc.code) from None
    decision = ratelimit.hit_requests(key_prefix=key.prefix, limit=key.requests_per_minute)
    if not decision.allowed:
        raise OpenAIError(
            429,
            f"Rate limit reached: {decision.limit} requests per minute for this key. "
            f"Try again in {decision.retry_after_s}s.",
            type_="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(decision.retry_after_s)},
        )
    return key


@dataclass(frozen=True)
class Target:
    preset: str
    pool: Any
    model: str


def _deny(key: ApiKey, status: int, reason: str, message: str, detail: str = "", **kw: Any) -> OpenAIError:
    apikey_record_denied(api_key=key, reason=reason, detail=detail)
    return OpenAIError(status, message, code=reason, headers=_no_retry(), **kw)


def resolve_model(key: ApiKey, model: Any) -> Target:
    """Map an OpenAI ``model`` to a preset and a pool this key may use."""
    from apps.workers.models import Pool

    user = key.created_by
    if not isinstance(model, str) or not model.strip():
        raise OpenAIError(
            400, "'model' is required: e.g. 'conductor-mini'.", param="model", code="invalid_value"
        )
    model = model.strip()
    base, sep, slug = model.partition(":")
    if base in PRESETS:
        preset = PRESETS[base]
        pool_slug: str | None = slug if sep else None
        if sep and not slug:
            raise OpenAIError(
                400, f"Name a pool after the colon: '{base}:<pool>'.", param="model", code="invalid_value"
            )
    elif not sep:
        preset, pool_slug = PRESETS["conductor-mini"], base
    else:
        raise OpenAIError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")

    if pool_slug is None:
        pool = key.team.default_pool
        if pool is None:
            raise OpenAIError(
                400,
                f"The team '{key.team.slug}' has no default pool; use '{base}:<pool>' with a pool from /v1/models.",
                param="model",
                code="no_default_pool",
            )
    else:
        pool = Pool.objects.filter(slug=pool_slug).first()
        # A pool the caller cannot see at all is reported as an unknown model, not as forbidden,
        # so keys cannot probe other teams' pool names.
        if pool is None or not api_sel.pools_visible_for(user, key).filter(pk=pool.pk).exists():
            raise OpenAIError(
                404, f"The model '{model}' does not exist.", param="model", code="model_not_found"
            )
    if not api_sel.pools_usable_for(user, key).filter(pk=pool.pk).exists():
        raise _deny(
            key,
            403,
            "pool_not_allowed",
            f"This API key may not use the pool '{pool.slug}'.",
            detail=pool.slug,
            param="model",
        )
    return Target(preset=preset, pool=pool, model=model)


def models_payload(key: ApiKey) -> dict[str, Any]:
    user = key.created_by
    created = int(key.team.created_at.timestamp())
    data = [{"id": name, "object": "model", "created": created, "owned_by": "conductor"} for name in PRESETS]
    for pool in api_sel.pools_usable_for(user, key).order_by("slug"):
        data.append(
            {
                "id": pool.slug,
                "object": "model",
                "created": int(pool.created_at.timestamp()),
                "owned_by": pool.team.slug if pool.team_id else "platform",
            }
        )
    return {"object": "list", "data": data}


# --- request validation ----------------------------------------------------------------------------


def _text_content(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise OpenAIError(
                    400,
                    "Only text content parts ({'type': 'text', 'text': …}) are supported.",
                    param=f"messages[{index}].content[{j}]",
                    code="invalid_value",
                )
            parts.append(part["text"])
        return "\n".join(parts)
    raise OpenAIError(
        400,
        "Message content must be a string or a list of text parts.",
        param=f"messages[{index}].content",
        code="invalid_type",
    )


def question_from_messages(messages: Any) -> str:
    """One conductor question from a chat: the last user turn, with earlier turns as context."""
    if not isinstance(messages, list) or not messages:
        raise OpenAIError(
            400, "'messages' must be a non-empty array.", param="messages", code="invalid_value"
        )
    turns: list[tuple[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise OpenAIError(
                400, "Each message must be an object.", param=f"messages[{i}]", code="invalid_type"
            )
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise OpenAIError(
                400,
                f"Invalid role {role!r}; expected one of {', '.join(sorted(MESSAGE_ROLES))}.",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        turns.append((role, _text_content(message.get("content"), i)))
    if not any(role == "user" and text.strip() for role, text in turns):
        raise OpenAIError(
            400, "At least one user message with text is required.", param="messages", code="invalid_value"
        )
    if len(turns) == 1:
        return turns[0][1]
    labels = {
        "system": "System",
        "developer": "System",
        "user": "User",
        "assistant": "Assistant",
        "tool": "Tool",
    }
    return "\n\n".join(f"{labels[role]}: {text}" for role, text in turns if text.strip())


@dataclass(frozen=True)
class ChatRequest:
    model: Any
    question: str
    stream: bool
    include_usage: bool


def parse_chat_request(raw: bytes) -> ChatRequest:
    try:
        from conductor_web.input_limits import safe_json_loads  # size/depth/NUL limits (issue 14)

        body = safe_json_loads(raw or b"null")
    except (ValueError, UnicodeDecodeError):
        raise OpenAIError(400, "The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "The request body must be a JSON object.", code="invalid_json")
    if "model" not in body:
        raise OpenAIError(400, "'model' is required.", param="model", code="missing_required_parameter")
    if "messages" not in body:
        raise OpenAIError(400, "'messages' is required.", param="messages", code="missing_required_parameter")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise OpenAIError(400, "'stream' must be a boolean.", param="stream", code="invalid_type")
    n = body.get("n")
    if n is not None and n != 1:
        raise OpenAIError(
            400,
            "Only n=1 is supported: the conductor returns one answer per run.",
            param="n",
            code="invalid_value",
        )
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise OpenAIError(400, f"'{name}' must be a positive integer.", param=name, code="invalid_value")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2
    ):
        raise OpenAIError(
            400, "'temperature' must be a number between 0 and 2.", param="temperature", code="invalid_value"
        )
    if body.get("tools") or body.get("functions"):
        param = "tools" if body.get("tools") else "functions"
        raise OpenAIError(
            400, "Tool calling is not supported by the conductor.", param=param, code="unsupported_parameter"
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise OpenAIError(
            400, "'stream_options' must be an object.", param="stream_options", code="invalid_type"
        )
    include_usage = bool((options or {}).get("include_usage", False))
    return ChatRequest(
        model=body.get("model"),
        question=question_from_messages(body.get("messages")),
        stream=bool(stream),
        include_usage=include_usage,
    )


# --- starting the run (sync: ORM, transaction) ------------------------------------------------------


def run_url(request: HttpRequest, run_id: Any) -> str:
    try:
        path = reverse("runs:detail", args=[run_id])
    except NoReverseMatch:
        path = f"/runs/{run_id}/"
    return request.build_absolute_uri(path)


def start_run(request: HttpRequest) -> tuple[ApiKey, ChatRequest, Target, Any]:
    """Authenticate, validate, resolve and create the run. Raises OpenAIError."""
    from apps.runs.models import RunSource
    from apps.runs.services import RunRefused, run_create

    key = _authenticate(request)
    chat = parse_chat_request(request.body)
    refusal = api_sel.scope_refusal(key, ApiScope.RUNS_WRITE)
    if refusal is not None:
        raise _deny(key, 403, "insufficient_scope", refusal, detail=ApiScope.RUNS_WRITE)
    target = resolve_model(key, chat.model)
    tokens = ratelimit.check_tokens(key_prefix=key.prefix, limit=key.tokens_per_minute)
    if not tokens.allowed:
        raise OpenAIError(
            429,
            f"Rate limit reached: {tokens.limit} tokens per minute for this key. Try again in {tokens.retry_after_s}s.",
            type_="tokens",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(tokens.retry_after_s)},
        )
    try:
        run = run_create(
            actor=key.created_by,
            team=key.team,
            pool=target.pool,
            question=chat.question,
            strategy="conductor",
            preset=target.preset,
            source=RunSource.OPENAI_API,
            api_key=key,
        )
    except RunRefused as refused:
        raise _refusal_error(refused) from None
    return key, chat, target, run


def _refusal_error(refused: Any) -> OpenAIError:
    if refused.code == "budget_exhausted":
        headers = _no_retry()
        if refused.retry_after_s:
            headers["Retry-After"] = str(int(refused.retry_after_s))
        return OpenAIError(
            429, refused.message, type_="insufficient_quota", code="budget_exhausted", headers=headers
        )
    if refused.code == "pool_not_allowed":
        return OpenAIError(403, refused.message, param="model", code="pool_not_allowed", headers=_no_retry())
    if refused.code == "pool_unavailable":
        return OpenAIError(
            503, refused.message, type_="server_error", code="pool_unavailable", headers=_no_retry()
        )
    return OpenAIError(400, refused.message, param="messages", code="invalid_value")


# --- following a run -------------------------------------------------------------------------------


class _LayerState:
    """Whether channel-layer wake-ups work in this process; logs once per transition, not per client."""

    def __init__(self) -> None:
        self.failing_since: float | None = None

    def failed(self, where: str, exc: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = time.time()
            logger.warning(
                "channel layer failed on %s (%s); /v1 clients follow runs by polling the database",
                where,
                type(exc).__name__,
            )

    def ok(self) -> None:
        if self.failing_since is not None:
            self.failing_since = None
            logger.warning("channel layer answers again; /v1 clients are woken by run events")


_layer_state = _LayerState()


class RunFollower:
    """Joins ``run.<id>`` to be woken when the run emits; readers then go to the database.

    The channel layer is only a wake-up: any failure of it (join, receive, discard — e.g. Redis
    timing out or going away) switches this follower to polling the database, which holds every
    event, so a client always reaches the run's ending.
    """

    def __init__(self, run_id: Any) -> None:
        self.group = f"run.{run_id}"
        self.layer: Any = None
        self.channel: str | None = None

    async def __aenter__(self) -> RunFollower:
        try:
            from channels.layers import get_channel_layer

            from apps.runs.sink import register_server_loop

            self.layer = get_channel_layer()
            if self.layer is not None:
                register_server_loop(asyncio.get_running_loop())
                self.channel = await asyncio.wait_for(self.layer.new_channel(), LAYER_OP_TIMEOUT_S)
                await asyncio.wait_for(self.layer.group_add(self.group, self.channel), LAYER_OP_TIMEOUT_S)
                _layer_state.ok()
        except Exception as exc:  # the database poll still finds every event
            _layer_state.failed("join", exc)
            self.channel = None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.layer is not None and self.channel is not None:
            try:
                await asyncio.wait_for(self.layer.group_discard(self.group, self.channel), LAYER_OP_TIMEOUT_S)
            except Exception:  # the group entry expires on its own
                logger.debug("group_discard failed for %s", self.group, exc_info=True)

    async def wait(self, timeout: float) -> None:
        if timeout <= 0:
            return
        if self.channel is None:
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))
            return
        try:
            await asyncio.wait_for(self.layer.receive(self.channel), timeout=min(timeout, FOLLOW_POLL_S))
        except TimeoutError:
            pass  # no wake-up this interval: the caller reads the database anyway
        except Exception as exc:  # e.g. redis TimeoutError/ConnectionError: poll from now on
            _layer_state.failed("receive", exc)
            self.channel = None
            await asyncio.sleep(min(timeout, FOLLOW_POLL_S))


def _events_after(run_id: Any, seq: int) -> list[dict[str, Any]]:
    from apps.runs.models import RunEvent

    rows = RunEvent.objects.filter(run_id=run_id, seq__gt=seq).order_by("seq").values("seq", "type", "data")
    return [dict(row) for row in rows]


def _load_run(run_id: Any) -> Any:
    from apps.runs.models import Run

    return Run.objects.select_related("pool").get(pk=run_id)


def _blocked_rules(run_id: Any) -> list[str]:
    """Names of the checks that blocked the run (never their findings)."""
    from apps.runs.models import RunEvent

    names: list[str] = []
    for data in RunEvent.objects.filter(run_id=run_id, type="guardrail.checked").values_list(
        "data", flat=True
    ):
        if not isinstance(data, dict) or not data.get("blocked"):
            continue
        for check in data.get("checks") or []:
            if (
                isinstance(check, dict)
                and check.get("status") == "intervened"
                and check.get("action") == "block"
            ):
                names.append(f"{data.get('stage')}:{check.get('name')}")
    return names


def _deadline(run: Any) -> float:
    """The ``time.monotonic()`` instant a /v1 client stops waiting for ``run``: the run's own
    deadline (``RUN_TIMEOUT_S`` after it was created) plus ``FOLLOW_GRACE_S`` for its verdict."""
    from django.utils import timezone

    left = float(settings.RUN_TIMEOUT_S)
    deadline_at = getattr(run, "deadline_at", None)
    if deadline_at is not None:
        left = min(left, (deadline_at - timezone.now()).total_seconds())
    return time.monotonic() + max(0.0, left) + FOLLOW_GRACE_S


async def wait_for_run(run: Any) -> Any:
    """The run once it is terminal, or as it is at the client's deadline."""
    deadline = _deadline(run)
    async with RunFollower(run.id) as follower:
        while True:
            current = await sync_to_async(_load_run)(run.id)
            if current.is_terminal or time.monotonic() >= deadline:
                return current
            await follower.wait(deadline - time.monotonic())


def _failure_cause(exc: BaseException) -> str:
    """Which part failed, in words safe for a client (never the exception text: it may quote data)."""
    module = type(exc).__module__
    if module.startswith(("redis", "channels_redis")):
        part = "Redis (the channel layer)"
    elif module.startswith(("django.db", "psycopg", "sqlite3")):
        part = "the database"
    else:
        part = "the server"
    return f"{part} failed ({type(exc).__name__})"


def follow_failure_error(request: HttpRequest, run: Any, target: Target, exc: BaseException) -> OpenAIError:
    """The answer for a client whose wait broke after its run was created: it names the cause and
    the run (header, ``conductor`` field and message), so the client can look it up later."""
    from django.core.exceptions import ObjectDoesNotExist

    conductor = _conductor_info(request, run, target)
    conductor["status"] = "unknown"
    if isinstance(exc, ObjectDoesNotExist):
        logger.warning("run %s was deleted while a /v1 client waited for it", run.id)
        return OpenAIError(
            410,
            f"Run {run.id} was deleted while this request waited for it.",
            type_="server_error",
            code="run_deleted",
            headers=_no_retry(),
            conductor=conductor,
        )
    logger.error(
        "lost track of run %s while a /v1 client waited: %s", run.id, type(exc).__name__, exc_info=exc
    )
    return OpenAIError(
        503,
        f"Waiting for run {run.id} failed: {_failure_cause(exc)}. The run itself goes on; "
        f"follow it at {conductor['url']}.",
        type_="server_error",
        code="run_follow_failed",
        headers=_no_retry(),  # a retry would start a second run
        conductor=conductor,
    )


async def _count_tokens(key: ApiKey, run: Any) -> None:
    # Accounting must never turn a finished run into an error for its client.
    try:
        await sync_to_async(ratelimit.add_tokens)(
            key_prefix=key.prefix, tokens=run.input_tokens + run.output_tokens
        )
    except Exception:
        logger.warning("could not count the tokens of run %s", run.id, exc_info=True)


# --- responses ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    id: str
    created: int
    model: str
    conductor: dict[str, Any]


def _conductor_info(request: HttpRequest, run: Any, target: Target) -> dict[str, Any]:
    return {
        "run_id": str(run.id),
        "url": run_url(request, run.id),
        "status": run.status,
        "pool": target.pool.slug,
        "preset": target.preset,
        "steps": run.step_count,
        "cost_usd": str(run.cost_usd) if run.cost_usd is not None else None,
        "policy_version_id": run.policy_version_id,
        "answer_held": bool(run.answer_held),
    }


def _held_info(run_id: Any) -> dict[str, Any]:
    """Which rules hold the answer and why (names only, never the findings or the answer)."""
    from apps.runs.selectors import held_reason, run_hold_rules

    rules = run_hold_rules(run_id)
    return {"rules": rules, "reason": held_reason(rules)}


def _usage(run: Any) -> dict[str, int]:
    return {
        "prompt_tokens": run.input_tokens,
        "completion_tokens": run.output_tokens,
        "total_tokens": run.input_tokens + run.output_tokens,
    }


def run_outcome_error(run: Any, conductor: dict[str, Any]) -> OpenAIError | None:
    """The error for a run that ended without a releasable answer, else None."""
    status = run.status
    if status == "succeeded":
        return None
    if status == "blocked":
        rules = _blocked_rules(run.id)
        rule_text = f" (policy rule: {', '.join(rules)})" if rules else ""
        reason = run.error or run.status_reason or "blocked by policy"
        return OpenAIError(
            400,
            f"{reason}{rule_text}",
            code="content_policy_violation",
            headers=_no_retry(),
            conductor=conductor,
        )
    if status == "cancelled":
        return OpenAIError(
            409, "The run was cancelled.", code="run_cancelled", headers=_no_retry(), conductor=conductor
        )
    if status == "timed_out":
        return OpenAIError(
            504,
            run.error or "The run timed out.",
            type_="server_error",
            code="run_timed_out",
            headers=_no_retry(),
            conductor=conductor,
        )
    if status in ("queued", "running"):
        return OpenAIError(
            504,
            "The run did not finish in time; follow it at its URL.",
            type_="server_error",
            code="run_timed_out",
            headers=_no_retry(),
            conductor=conductor,
        )
    return OpenAIError(
        502,
        run.error or "The run failed.",
        type_="server_error",
        code="run_failed",
        headers=_no_retry(),
        conductor=conductor,
    )


def completion_body(env: Envelope, run: Any) -> dict[str, Any]:
    held = bool(run.answer_held)
    return {
        "id": env.id,
        "object": "chat.completion",
        "created": env.created,
        "model": env.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None if held else run.answer, "refusal": None},
                "logprobs": None,
                "finish_reason": "content_filter" if held else "stop",
            }
        ],
        "usage": _usage(run),
        "conductor": env.conductor,
    }


def _sse(payload: dict[str, Any] | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def _chunk(env: Envelope, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": env.id,
        "object": "chat.completion.chunk",
        "created": env.created,
        "model": env.model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    body.update(extra)
    return body


def progress(event: dict[str, Any]) -> dict[str, Any] | None:
    """The ``conductor`` progress field for one run event (None for events not worth a chunk)."""
    kind, data, seq = event["type"], event.get("data") or {}, event["seq"]
    base = {"event": kind, "seq": seq}
    if data.get("holdable"):
        # The run's policy can hold its answer (require_review): a /v1 stream shows no model
        # output before the verdict — the final answer only arrives if it is not held.
        from apps.runs.selectors import withhold_event_data

        data = withhold_event_data(kind, data)
    if kind == "step.started":
        return {
            **base,
            "index": data.get("index"),
            "round": data.get("round"),
            "worker": data.get("worker_key"),
            "instruction": data.get("instruction"),
        }
    if kind == "step.delta":
        if data.get("withheld"):
            return None
        return {**base, "index": data.get("index"), "text": data.get("text")}
    if kind == "step.finished":
        return {**base, "index": data.get("index"), "status": data.get("status"), "usage": data.get("usage")}
    if kind == "plan.validated":
        plan = data.get("plan") or {}
        return {**base, "action": data.get("action"), "steps": len(plan.get("steps") or [])}
    if kind == "guardrail.checked":
        return {**base, "stage": data.get("stage"), "blocked": bool(data.get("blocked"))}
    return None


async def stream_run(
    request: HttpRequest, key: ApiKey, chat: ChatRequest, target: Target, run: Any, env: Envelope
) -> AsyncGenerator[bytes, None]:
    yield _sse(_chunk(env, {"role": "assistant", "content": ""}, conductor=env.conductor))
    last_seq = 0
    deadline = _deadline(run)
    last_sent = time.monotonic()
    next_check = time.monotonic() + STATUS_CHECK_S
    terminal_seen = False
    async with RunFollower(run.id) as follower:
        finished = False
        while not finished and time.monotonic() < deadline:
            for event in await sync_to_async(_events_after)(run.id, last_seq):
                last_seq = event["seq"]
                info = progress(event)
                if info is not None:
                    yield _sse(_chunk(env, {}, conductor=info))
                    last_sent = time.monotonic()
                if event["type"] == "run.finished":
                    finished = True
                    break
            if not finished and time.monotonic() >= next_check:
                # The events are the truth, but a run that vanished (deleted: DoesNotExist) or
                # ended without its run.finished row showing up must end the stream too.
                next_check = time.monotonic() + STATUS_CHECK_S
                if (await sync_to_async(_load_run)(run.id)).is_terminal:
                    finished, terminal_seen = terminal_seen, True
                    continue  # read the events once more before giving up on run.finished
            if not finished:
                if time.monotonic() - last_sent > KEEPALIVE_S:
                    # An SSE comment: clients ignore it, proxies see a live connection.
                    yield b": keep-alive\n\n"
                    last_sent = time.monotonic()
                await follower.wait(deadline - time.monotonic())
        # The Run row is updated in the same transaction as run.finished; read the verdict.
        final = await sync_to_async(_load_run)(run.id)
    await _count_tokens(key, final)
    conductor = _conductor_info(request, final, target)
    error = await sync_to_async(run_outcome_error)(final, conductor)
    if error is not None:
        yield _sse(error.body())
        yield _sse("[DONE]")
        return
    usage = _usage(final)
    if final.answer_held:
        held = await sync_to_async(_held_info)(final.id)
        yield _sse(_chunk(env, {}, "content_filter", conductor={**conductor, "held": held}))
    else:
        if final.answer:
            yield _sse(_chunk(env, {"content": final.answer}))
        yield _sse(_chunk(env, {}, "stop", conductor={**conductor, "usage": usage}))
    if chat.include_usage:
        yield _sse(
            {
                "id": env.id,
                "object": "chat.completion.chunk",
                "created": env.created,
                "model": env.model,
                "system_fingerprint": None,
                "choices": [],
                "usage": usage,
            }
        )
    yield _sse("[DONE]")


async def guarded_stream(
    request: HttpRequest, run: Any, target: Target, body: AsyncGenerator[bytes, None]
) -> AsyncIterator[bytes]:
    """``body``, but whatever fails after the run exists, the stream still ends: an error event in
    OpenAI's shape naming the cause and the run, then ``[DONE]``."""
    done = _sse("[DONE]")
    ended = False
    try:
        async with contextlib.aclosing(body) as pieces:
            async for piece in pieces:
                ended = piece == done
                yield piece
    except Exception as exc:
        if not ended:
            yield _sse(follow_failure_error(request, run, target, exc).body())
            yield done


# --- views --------------------------------------------------------------------------------------------


def _method_not_allowed(allowed: str) -> JsonResponse:
    response = error_response(OpenAIError(405, f"Use {allowed} on this endpoint.", code="method_not_allowed"))
    response["Allow"] = allowed
    return response


@csrf_exempt
async def models_view(request: HttpRequest) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        key = await sync_to_async(_authenticate)(request)
        payload = await sync_to_async(models_payload)(key)
    except OpenAIError as err:
        return error_response(err)
    return JsonResponse(payload)


@csrf_exempt
async def model_detail_view(request: HttpRequest, model: str) -> HttpResponse:
    if request.method != "GET":
        return _method_not_allowed("GET")
    try:
        key = await sync_to_async(_authenticate)(request)
        payload = await sync_to_async(models_payload)(key)
    except OpenAIError as err:
        return error_response(err)
    for entry in payload["data"]:
        if entry["id"] == model:
            return JsonResponse(entry)
    return error_response(
        OpenAIError(404, f"The model '{model}' does not exist.", param="model", code="model_not_found")
    )


@csrf_exempt
async def chat_completions_view(request: HttpRequest) -> HttpResponseBase:
    if request.method != "POST":
        return _method_not_allowed("POST")
    try:
        key, chat, target, run = await sync_to_async(start_run)(request)
    except OpenAIError as err:
        return error_response(err)
    env = Envelope(
        id=f"chatcmpl-{run.id.hex}",
        created=int(run.created_at.timestamp()),
        model=target.model,
        conductor=_conductor_info(request, run, target),
    )
    headers = {"X-Conductor-Run": str(run.id), "X-Conductor-Run-Url": env.conductor["url"]}
    if chat.stream:
        # The run id travels in the headers and the first chunk, which go out before the run's
        # first event is read: a client that loses this server still knows which run it started.
        response: HttpResponseBase = StreamingHttpResponse(
            guarded_stream(request, run, target, stream_run(request, key, chat, target, run, env)),
            content_type="text/event-stream",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: pass events through as they come
    else:
        # A plain response cannot send its headers early: its status depends on the outcome.
        # Whatever breaks while waiting, the answer still names the run (header and body).
        try:
            final = await wait_for_run(run)
            await _count_tokens(key, final)
            conductor = _conductor_info(request, final, target)
            error = await sync_to_async(run_outcome_error)(final, conductor)
            if final.answer_held:
                conductor["held"] = await sync_to_async(_held_info)(final.id)
            if error is not None:
                response = error_response(error)
            else:
                response = JsonResponse(
                    completion_body(Envelope(env.id, env.created, env.model, conductor), final)
                )
        except Exception as exc:
            response = error_response(follow_failure_error(request, run, target, exc))
    for name, value in headers.items():
        response[name] = value
    return response
