"""Generation options a client asks for, for the worker that writes the run's answer.

An API client's ``max_tokens``, ``stop``, ``temperature``, ``top_p``, ``seed``,
``response_format`` and ``tools`` travel as one ``GenerationOptions`` from the request (stored
on the run) through ``run_request`` to the executor, which hands them to the worker of the
*final* step only (the conductor's plan and the intermediate steps keep their own settings), and
into each provider's native parameters. ``max_tokens`` is further capped by the policy's limits.

After the run, ``check_response_format`` verifies that the answer is valid JSON (for the schema,
when one was given); the runner asks the final worker for one repair before failing the run with
a message naming the rule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from apps.engine.types import Message


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """``json_object`` (any JSON object) or ``json_schema`` (an object valid for ``schema``)."""

    type: str
    schema: dict[str, Any] | None = None
    name: str = "response"
    strict: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "schema": self.schema, "name": self.name, "strict": self.strict}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ResponseFormat:
        return cls(
            type=str(data.get("type") or "json_object"),
            schema=data.get("schema") if isinstance(data.get("schema"), dict) else None,
            name=str(data.get("name") or "response"),
            strict=bool(data.get("strict")),
        )

    def openai(self) -> dict[str, Any]:
        """OpenAI's ``response_format`` parameter."""
        if self.type == "json_schema" and self.schema is not None:
            return {
                "type": "json_schema",
                "json_schema": {"name": self.name, "schema": self.schema, "strict": self.strict},
            }
        return {"type": "json_object"}


@dataclass(frozen=True, slots=True)
class GenerationOptions:
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    response_format: ResponseFormat | None = None
    # OpenAI function tools ({"type": "function", "function": {name, description, parameters}}).
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = None  # "auto" | "none" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool | None = None

    @property
    def is_default(self) -> bool:
        return self == GenerationOptions()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.max_tokens is not None:
            out["max_tokens"] = self.max_tokens
        if self.stop:
            out["stop"] = list(self.stop)
        for name in ("temperature", "top_p", "seed", "tool_choice", "parallel_tool_calls"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.response_format is not None:
            out["response_format"] = self.response_format.to_dict()
        if self.tools:
            out["tools"] = [dict(t) for t in self.tools]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GenerationOptions:
        data = data or {}
        fmt = data.get("response_format")
        return cls(
            max_tokens=data.get("max_tokens"),
            stop=tuple(str(s) for s in data.get("stop") or ()),
            temperature=data.get("temperature"),
            top_p=data.get("top_p"),
            seed=data.get("seed"),
            response_format=ResponseFormat.from_dict(fmt) if isinstance(fmt, dict) else None,
            tools=tuple(t for t in data.get("tools") or () if isinstance(t, dict)),
            tool_choice=data.get("tool_choice"),
            parallel_tool_calls=data.get("parallel_tool_calls"),
        )

    def capped(self, max_tokens: int | None) -> GenerationOptions:
        """These options with ``max_tokens`` no higher than ``max_tokens`` (a policy cap)."""
        if max_tokens is None or (self.max_tokens is not None and self.max_tokens <= max_tokens):
            return self
        return replace(self, max_tokens=max_tokens)


@dataclass(slots=True)
class StepEnding:
    """How a step's call ended: ``finish_reason`` (stop, length, tool_calls) and its tool calls."""

    finish_reason: str = "stop"
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


def final_index(steps: Any, recurses: bool) -> int | None:
    """The index of the step whose output is the answer, when this plan ends the run."""
    if recurses or not steps:
        return None
    return int(steps[-1].index)


def step_call_kwargs(options: GenerationOptions | None, *, is_final: bool, max_tokens: int) -> dict[str, Any]:
    """Extra keyword arguments for ``Worker.complete`` of one step: the options go to the final
    step only, with ``max_tokens`` capped by the step's own limit."""
    if not is_final or options is None or options.is_default:
        return {}
    return {"options": options.capped(max_tokens)}


def json_error(text: str, fmt: ResponseFormat) -> str | None:
    """Why ``text`` does not satisfy ``fmt``, or None when it does."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        return f"the answer is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"
    if fmt.type == "json_object" and not isinstance(value, dict):
        return "the answer is JSON but not an object"
    if fmt.type == "json_schema" and fmt.schema is not None:
        try:
            import jsonschema
        except ImportError:  # pragma: no cover — jsonschema is a dependency
            return None
        errors = sorted(
            jsonschema.Draft202012Validator(fmt.schema).iter_errors(value), key=lambda e: list(e.path)
        )
        if errors:
            first = errors[0]
            where = "/".join(str(p) for p in first.path) or "(root)"
            return f"the answer does not match the JSON schema at {where}: {first.message[:200]}"
    return None


def repair_messages(messages: list[Message], answer: str, error: str) -> list[Message]:
    return [
        *messages,
        {"role": "assistant", "content": answer},
        {
            "role": "user",
            "content": f"That reply is invalid: {error}. Reply again with only the corrected JSON, nothing else.",
        },
    ]


def strip_json_fence(text: str) -> str:
    """Models often wrap JSON in a Markdown code fence; the JSON inside is the answer."""
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```"):
        inner = stripped[3:-3]
        first_newline = inner.find("\n")
        if first_newline != -1 and inner[:first_newline].strip().isalnum():
            inner = inner[first_newline + 1 :]
        return inner.strip()
    return text
