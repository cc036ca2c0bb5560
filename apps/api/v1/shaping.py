"""Shaping a ``/v1`` answer from a run: usage, the final answer, outcome errors, SSE and progress.

``run_outcome_error`` is the error for a run that ended without a releasable answer;
``final_answer`` (text, tool calls, finish reason, held), ``usage``, ``conductor_info`` /
``held_info`` (the ``conductor`` field) shape a succeeded one. ``follow_failure_error`` is the
answer when following a run broke (it names the run). ``sse``, ``guarded_stream`` and ``progress``
shape streams. A held answer gives nothing away.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.http import HttpRequest
from django.urls import NoReverseMatch, get_script_prefix, get_urlconf, reverse

from apps.api.v1.errors import ApiError, no_retry
from apps.api.v1.targets import Target
from apps.runs.models import PlanApproval, Run, RunEvent
from apps.runs.selectors import held_reason, run_hold_rules, withhold_event_data

logger = logging.getLogger(__name__)


_RUN_ID_SLOT = "00000000-0000-0000-0000-000000000000"


@lru_cache(maxsize=16)
def _run_path(script_prefix: str, urlconf: Any) -> tuple[str, str]:
    """The run page's path around its id, reversed once per prefix and URLconf: every /v1 answer
    names it, and reverse() on each cost the event loop about a millisecond per request."""
    try:
        path = reverse("runs:detail", args=[_RUN_ID_SLOT], urlconf=urlconf)
    except NoReverseMatch:
        path = f"{script_prefix}runs/{_RUN_ID_SLOT}/"
    head, _, tail = path.partition(_RUN_ID_SLOT)
    return head, tail


def run_url(request: HttpRequest, run_id: Any) -> str:
    head, tail = _run_path(get_script_prefix(), get_urlconf() or settings.ROOT_URLCONF)
    return request.build_absolute_uri(f"{head}{run_id}{tail}")


def failure_cause(exc: BaseException) -> str:
    """Which part failed, in words safe for a client (never the exception text: it may quote data)."""
    module = type(exc).__module__
    if module.startswith(("redis", "channels_redis")):
        part = "Redis (the channel layer)"
    elif module.startswith(("django.db", "psycopg", "sqlite3")):
        part = "the database"
    else:
        part = "the server"
    return f"{part} failed ({type(exc).__name__})"


def follow_failure_error(request: HttpRequest, run: Run, target: Target, exc: BaseException) -> ApiError:
    """The answer for a client whose wait broke after its run was created: it names the cause and
    the run (header, ``conductor`` field and message), so the client can look it up later."""
    from django.core.exceptions import ObjectDoesNotExist

    conductor = conductor_info(request, run, target)
    conductor["status"] = "unknown"
    if isinstance(exc, ObjectDoesNotExist):
        logger.warning("run %s was deleted while a /v1 client waited for it", run.id)
        return ApiError(
            410,
            f"Run {run.id} was deleted while this request waited for it.",
            type_="server_error",
            code="run_deleted",
            headers=no_retry(),
            conductor=conductor,
        )
    logger.error(
        "lost track of run %s while a /v1 client waited: %s", run.id, type(exc).__name__, exc_info=exc
    )
    return ApiError(
        503,
        f"Waiting for run {run.id} failed: {failure_cause(exc)}. The run itself goes on; "
        f"follow it at {conductor['url']}.",
        type_="server_error",
        code="run_follow_failed",
        headers=no_retry(),  # a retry would start a second run
        conductor=conductor,
    )


async def guarded_stream(
    body: AsyncGenerator[bytes, None],
    *,
    is_end: Callable[[bytes], bool],
    on_failure: Callable[[BaseException], Iterable[bytes]],
) -> AsyncIterator[bytes]:
    """``body``, but whatever fails after the run exists, the stream still ends: unless the
    piece that ``is_end`` recognises went out, ``on_failure(exc)`` supplies the protocol's error
    event and end marker."""
    ended = False
    try:
        async with contextlib.aclosing(body) as pieces:
            async for piece in pieces:
                ended = is_end(piece)
                yield piece
    except Exception as exc:
        if not ended:
            for piece in on_failure(exc):
                yield piece


def sse(payload: dict[str, Any] | str, *, event: str | None = None) -> bytes:
    """One server-sent event (``event:`` line only when named, as Anthropic and Responses use)."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data}\n\n".encode()


SSE_KEEPALIVE = b": keep-alive\n\n"  # an SSE comment: clients ignore it, proxies see a live stream


def conductor_info(request: HttpRequest, run: Run, target: Target) -> dict[str, Any]:
    """The ``conductor`` field every /v1 answer carries: the run, its graph URL and totals."""
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
        "request_id": getattr(run, "request_id", "") or None,
    }


def held_info(run_id: Any) -> dict[str, Any]:
    """Which rules hold the answer and why (names only, never the findings or the answer)."""

    rules = run_hold_rules(run_id)
    return {"rules": rules, "reason": held_reason(rules)}


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def usage(run: Run) -> Usage:
    """The run's whole token usage (conductor calls and every step)."""
    return Usage(run.input_tokens, run.output_tokens)


def answer_usage(run: Run) -> Usage:
    """The tokens of the call that wrote the answer (what ``max_tokens`` bounds), from the
    run's ``run.finished`` data as the waiter read it (``follow._load_ended``); zero when the
    run recorded none (it ended before an answer)."""
    data = getattr(run, "finished_data", None)
    got = data.get("answer_usage") if isinstance(data, dict) else None
    if not isinstance(got, dict):
        return Usage(0, 0)
    total = usage(run)
    return Usage(
        min(int(got.get("input_tokens") or 0), total.input_tokens),
        min(int(got.get("output_tokens") or 0), total.output_tokens),
    )


def usage_breakdown(run: Run) -> dict[str, Any]:
    """The documented ``conductor`` extension of every protocol's ``usage`` (docs/api.md):
    the standard fields count the run (the bill: planning calls and every step); ``answer`` is
    the call that wrote the answer, ``orchestration`` the rest."""
    total, answer = usage(run), answer_usage(run)
    return {
        "answer": {"input_tokens": answer.input_tokens, "output_tokens": answer.output_tokens},
        "run": {"input_tokens": total.input_tokens, "output_tokens": total.output_tokens},
        "orchestration": {
            "input_tokens": total.input_tokens - answer.input_tokens,
            "output_tokens": total.output_tokens - answer.output_tokens,
        },
    }


@dataclass(frozen=True)
class FinalAnswer:
    """What a succeeded run answers: ``text`` (None while held), ``tool_calls`` (OpenAI's shape:
    ``id``, ``type``, ``function: {name, arguments}``; empty while held), ``finish_reason``
    (``stop``, ``length``, ``tool_calls``, or ``content_filter`` while held) and ``held``.
    ``incomplete``: a partial answer's why (``reason``: the failed step's ``step_failed`` /
    ``step_timed_out``, ``detail``, ``answer_step``), None for a whole one (issue 44)."""

    text: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    held: bool
    incomplete: dict[str, Any] | None = None


def final_answer(run: Run) -> FinalAnswer:
    """The answer of a succeeded run; the extras (finish reason, tool calls) come from its
    ``run.finished`` event. A held answer gives nothing away (see ``run_content_visible``)."""

    if run.answer_held:
        return FinalAnswer(None, [], "content_filter", True)
    # A waiter that read the run's end already holds its run.finished data (follow._load_ended).
    data = getattr(run, "finished_data", None)
    if data is None:
        data = (
            RunEvent.objects.filter(run_id=run.id, type="run.finished")
            .order_by("-seq")
            .values_list("data", flat=True)
            .first()
        )
    data = data if isinstance(data, dict) else {}
    calls = [c for c in data.get("tool_calls") or [] if isinstance(c, dict)]
    finish = str(data.get("finish_reason") or ("tool_calls" if calls else "stop"))
    incomplete = data.get("incomplete")
    return FinalAnswer(run.answer, calls, finish, False, incomplete if isinstance(incomplete, dict) else None)


def mark_incomplete(conductor: dict[str, Any], answer: FinalAnswer | None) -> None:
    """A partial answer says so in the ``conductor`` extension every protocol carries, next to
    the protocol's own marking (``finish_reason: length``, ``status: incomplete``,
    ``stop_reason: max_tokens``)."""
    if answer is not None and answer.incomplete is not None:
        conductor["incomplete"] = {k: answer.incomplete.get(k) for k in ("reason", "detail", "answer_step")}


def awaiting_fields(run_id: Any) -> list[str]:
    """The policy fields whose action held the run's plan."""

    row = (
        PlanApproval.objects.filter(run_id=run_id, decision="pending")
        .order_by("-requested_at")
        .values_list("fields", flat=True)
        .first()
    )
    return [str(f) for f in row or []]


def blocked_rules(run_id: Any) -> list[str]:
    """Names of the checks that blocked the run (never their findings)."""

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


def run_outcome_error(run: Run, conductor: dict[str, Any]) -> ApiError | None:
    """The error for a run that ended without a releasable answer, else None."""
    status = run.status
    if status == "succeeded":
        return None
    if status == "blocked":
        rules = blocked_rules(run.id)
        rule_text = f" (policy rule: {', '.join(rules)})" if rules else ""
        reason = run.error or run.status_reason or "blocked by policy"
        return ApiError(
            400,
            f"{reason}{rule_text}",
            code="content_policy_violation",
            headers=no_retry(),
            conductor=conductor,
        )
    if status == "cancelled":
        return ApiError(
            409, "The run was cancelled.", code="run_cancelled", headers=no_retry(), conductor=conductor
        )
    if status == "awaiting_approval":
        fields = ", ".join(awaiting_fields(run.id)) or "constraints.forecast.action"
        return ApiError(
            409,
            f"{run.error or 'The plan waits for an approver.'} (policy field: {fields}). Run {run.id} "
            # A held plan or (issue 43) a held tool call: the same pause, the same code.
            "resumes once a team admin or reviewer decides; follow it at its URL.",
            type_="approval_required",
            code="plan_awaiting_approval",
            headers=no_retry(),
            conductor=conductor,
        )
    if status in ("timed_out", "queued", "running"):
        message = (
            run.error or "The run timed out."
            if status == "timed_out"
            else "The run did not finish in time; follow it at its URL."
        )
        return ApiError(
            504, message, type_="server_error", code="run_timed_out", headers=no_retry(), conductor=conductor
        )
    if run.status_reason == "response_format_invalid":
        return ApiError(
            422,
            run.error or "The answer did not match the requested response_format.",
            param="response_format",
            code="response_format_invalid",
            headers=no_retry(),
            conductor=conductor,
        )
    return ApiError(
        502,
        run.error or "The run failed.",
        type_="server_error",
        code="run_failed",
        headers=no_retry(),
        conductor=conductor,
    )


# Response header of a /v1 stream: "streamed" (the answer arrives as it is written, through the
# output gate) or "buffered" (checks need the whole answer: it arrives with the verdict).
ANSWER_HEADER = "X-Conductor-Answer"


def answer_mode(buffered: str | None) -> dict[str, Any]:
    """The ``conductor.answer`` field of a stream's first event (documented in docs/api.md)."""
    if buffered is None:
        return {"mode": "streamed"}
    return {"mode": "buffered", "reason": buffered}


class Streamed:
    """The answer text a /v1 stream has sent so far, from the run's ``step.delta`` events
    marked ``answer`` (text the output gate released; issue 45)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def piece(self, event: dict[str, Any], buffered: str | None) -> str | None:
        """The content to send for ``event`` ("" : nothing now), or None when it is no answer
        delta. A buffered or holdable run's answer is never streamed."""
        data = event.get("data") or {}
        if event["type"] != "step.delta" or not data.get("answer"):
            return None
        if buffered is not None or data.get("holdable") or data.get("withheld"):
            return ""
        text = str(data.get("text") or "")
        if text:
            self.parts.append(text)
        return text

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def superseded(self, answer: str | None, run: Run, conductor: dict[str, Any]) -> ApiError | None:
        """Issue 44: the error that ends a stream whose sent text is not the start of the run's
        answer (the step writing it failed after part of it was released, and the run ended with
        a partial answer from an earlier round). A success ending would make the client take the
        fragment for the answer, and a stream cannot take back what it sent; so it ends with the
        protocol's error, naming why and where the run's answer is. None when the sent text is
        (the start of) the answer."""
        sent = self.text
        if not sent or (answer or "").startswith(sent):
            return None
        incomplete = conductor.get("incomplete") or {}
        why = str(incomplete.get("detail") or run.error or "the step writing it did not finish")
        return ApiError(
            502,
            f"The text streamed so far is not the answer: {why.rstrip('.')}. Run {run.id} ended with a "
            "partial answer from an earlier round instead, which this stream cannot replace; read it "
            f"at {conductor.get('url') or 'the run page'}.",
            type_="server_error",
            code="answer_superseded",
            headers=no_retry(),
            conductor=conductor,
        )

    def rest(self, answer: str | None) -> str:
        """What of the stored ``answer`` the client has not received yet. The released pieces
        are a prefix of it by construction; if they were not, nothing more is sent (a second,
        different copy would be worse) and it is logged."""
        answer = answer or ""
        sent = self.text
        if answer.startswith(sent):
            return answer[len(sent) :]
        logger.warning("a streamed answer is not a prefix of the stored answer; the rest is not sent")
        return ""


def progress(event: dict[str, Any]) -> dict[str, Any] | None:
    """The ``conductor`` progress field for one run event (None for events not worth a chunk)."""
    kind, data, seq = event["type"], event.get("data") or {}, event["seq"]
    base = {"event": kind, "seq": seq}
    if data.get("holdable"):
        # The run's policy can hold its answer (require_review): a /v1 stream shows no model
        # output before the verdict — the final answer only arrives if it is not held.

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
        if data.get("withheld") or data.get("unchecked") or data.get("answer"):
            return None  # unchecked answer text never reaches a /v1 client; released text is content
        return {**base, "index": data.get("index"), "text": data.get("text")}
    if kind == "step.finished":
        return {**base, "index": data.get("index"), "status": data.get("status"), "usage": data.get("usage")}
    if kind in ("step.waiting", "plan.waiting"):
        # Issue 44: not running yet, the worker's one slot is taken (no content in it).
        return {**base, "index": data.get("index"), "round": data.get("round"), "reason": data.get("reason")}
    if kind in ("step.running", "plan.running"):
        return {
            **base,
            "index": data.get("index"),
            "round": data.get("round"),
            "waited_ms": data.get("waited_ms"),
        }
    if kind == "plan.validated":
        plan = data.get("plan") or {}
        return {**base, "action": data.get("action"), "steps": len(plan.get("steps") or [])}
    if kind == "guardrail.checked":
        return {**base, "stage": data.get("stage"), "blocked": bool(data.get("blocked"))}
    return None
