"""The neutral run request: what a client asked for, in no protocol's words.

Each adapter's ``parse(body)`` builds a ``RunRequest``; ``question_from_turns`` makes the one
conductor question from a chat.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from apps.engine.generation import GenerationOptions


@dataclass(frozen=True)
class RunRequest:
    """What a client asked for, in no protocol's words.

    ``messages`` are OpenAI-style chat messages (``role``, ``content`` text, and for tool
    conversations ``tool_calls`` / ``tool_call_id``); ``question`` is the one conductor question
    made from them (``question_from_turns``). ``options`` are the generation options for the
    worker that writes the answer (``max_tokens``, ``stop``, ``temperature``, ``top_p``, ``seed``,
    ``response_format``, ``tools``, ``tool_choice``)."""

    model: Any
    question: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    options: GenerationOptions = field(default_factory=GenerationOptions)
    stream: bool = False
    metadata: dict[str, str] = field(default_factory=dict)
    # The protocol field that carried the tools (for "not supported" messages): tools, functions.
    tools_param: str = "tools"
    extra: dict[str, Any] = field(default_factory=dict)  # adapter-specific (e.g. include_usage)
    # Adapter data kept on the run (``Run.api_request["protocol"]``), e.g. a stored response's
    # input for ``previous_response_id``. Content keys ("messages", "instructions") are erased
    # with the run's payload.
    keep: dict[str, Any] = field(default_factory=dict)


ROLE_LABELS = {
    "system": "System",
    "developer": "System",
    "user": "User",
    "assistant": "Assistant",
    "tool": "Tool",
}


def question_from_turns(messages: list[dict[str, Any]]) -> str:
    """One conductor question from a chat: a single turn as is, else every turn labelled by role
    (assistant tool calls and tool results included), the last user turn last."""
    turns: list[tuple[str, str]] = []
    for message in messages:
        role = str(message.get("role") or "user")
        text = str(message.get("content") or "")
        calls = message.get("tool_calls") or []
        if calls:
            rendered = "; ".join(
                f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments') or ''})"
                for c in calls
                if isinstance(c, dict)
            )
            text = f"{text}\n[tool calls: {rendered}]".strip()
        if role == "tool" and message.get("tool_call_id"):
            text = f"[result of {message['tool_call_id']}] {text}"
        turns.append((role, text))
    if len(turns) == 1:
        return turns[0][1]
    return "\n\n".join(f"{ROLE_LABELS.get(role, 'User')}: {text}" for role, text in turns if text.strip())
