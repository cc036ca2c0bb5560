"""The Responses API's response object for a run (``response_body``) and its output items.

``finished_response`` reads a run that ended into the object (and the error a plain request
answers with instead); both the streamed and the plain answer end with it.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from apps.api.v1 import shaping, targets
from apps.api.v1.errors import ApiError
from apps.api.v1.responses_request import msg_id, response_id
from apps.core.executor_db import off_loop
from apps.engine.generation import GenerationOptions
from apps.runs.models import Run


def output_items(run: Run, answer: shaping.FinalAnswer | None) -> list[dict[str, Any]]:
    if answer is None or answer.held:
        return []
    items: list[dict[str, Any]] = []
    if answer.text or not answer.tool_calls:
        items.append(message_item(run, answer.text or "", "completed"))
    for call in answer.tool_calls:
        fn = call.get("function") or {}
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{call.get('id')}",
                "call_id": call.get("id"),
                "name": fn.get("name"),
                "arguments": fn.get("arguments") or "",
                "status": "completed",
            }
        )
    return items


def message_item(run: Run, text: str, status: str) -> dict[str, Any]:
    content = [] if status == "in_progress" else [text_part(text)]
    return {
        "type": "message",
        "id": msg_id(run.id),
        "status": status,
        "role": "assistant",
        "content": content,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_body(
    run: Run,
    req_record: dict[str, Any],
    conductor: dict[str, Any],
    *,
    status: str,
    answer: shaping.FinalAnswer | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """OpenAI's response object for ``run`` (``req_record`` is the run's ``api_request``)."""
    protocol = req_record.get("protocol") or {}
    options = GenerationOptions.from_dict(req_record.get("options"))
    incomplete = None
    if answer is not None and answer.held:
        status, incomplete = "incomplete", {"reason": "content_filter"}
    elif answer is not None and answer.incomplete is not None:
        # A partial answer (issue 44): the run's own reason, not a token limit that was not hit.
        status, incomplete = (
            "incomplete",
            {"reason": str(answer.incomplete.get("reason") or "run_incomplete")},
        )
    elif answer is not None and answer.finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    used = shaping.usage(run)
    fmt = options.response_format
    text_format: dict[str, Any] = {"type": "text"}
    if fmt is not None and fmt.type == "json_schema":
        text_format = {"type": "json_schema", "name": fmt.name, "schema": fmt.schema, "strict": fmt.strict}
    elif fmt is not None:
        text_format = {"type": fmt.type}
    tools = [{"type": "function", **t.get("function", {})} for t in options.tools]
    finished = status in ("completed", "incomplete", "failed")
    return {
        "id": response_id(run.id),
        "object": "response",
        "created_at": int(run.created_at.timestamp()),
        "status": status,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": protocol.get("instructions") or None,
        "max_output_tokens": options.max_tokens,
        "model": protocol.get("model") or conductor.get("preset"),
        "output": output_items(run, answer) if finished else [],
        "parallel_tool_calls": options.parallel_tool_calls is not False,
        "previous_response_id": protocol.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": bool(protocol.get("store", True)),
        "temperature": options.temperature,
        "text": {"format": text_format},
        "tool_choice": options.tool_choice or "auto",
        "tools": tools,
        "top_p": options.top_p,
        "truncation": "disabled",
        "usage": (
            {
                "input_tokens": used.input_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": used.output_tokens,
                # The run's work beyond the answer, as a reasoning model's (docs/api.md, "Usage").
                "output_tokens_details": {
                    "reasoning_tokens": shaping.usage_breakdown(run)["orchestration"]["output_tokens"]
                },
                "total_tokens": used.total_tokens,
                "conductor": shaping.usage_breakdown(run),
            }
            if finished
            else None
        ),
        "metadata": dict(req_record.get("metadata") or {}),
        "conductor": conductor,
    }


def _failed_error(err: ApiError) -> dict[str, Any]:
    return {"code": err.code or "server_error", "message": err.message}


async def finished_response(
    request: HttpRequest, run: Run, target: targets.Target
) -> tuple[dict[str, Any], ApiError | None]:
    """The response object of a run that ended (or stopped being waited for), and the error that
    a plain request answers instead (None: the body is the answer)."""
    conductor = shaping.conductor_info(request, run, target)
    error = await off_loop(shaping.run_outcome_error, run, conductor)
    if run.answer_held:
        conductor["held"] = await off_loop(shaping.held_info, run.id)
    record = run.api_request if isinstance(run.api_request, dict) else {}
    if error is not None:
        if error.param == "response_format":
            error.param = "text.format"  # this protocol's name for it
        body = response_body(run, record, conductor, status="failed", error=_failed_error(error))
        return body, error
    answer = await off_loop(shaping.final_answer, run)
    shaping.mark_incomplete(conductor, answer)
    return response_body(run, record, conductor, status="completed", answer=answer), None
